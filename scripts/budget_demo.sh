#!/usr/bin/env bash
# Budgets on real data, after scripts/tradeoff_demo.sh: a wall-clock-budgeted run of mild_mnist,
# then recipe=auto at three budgets reading the demo's report.csv, then one report over the
# sweeps and the auto runs (the "recipe=auto against the swept frontier" table).
#   scripts/budget_demo.sh [DEMO_DIR]        (default: tradeoff_demo; about 3 min on 2 CPU cores)
set -euo pipefail
demo=${1:-tradeoff_demo}
trainrun=${TRAINRUN:-trainrun}
here="$(dirname "$0")/tradeoff_demo"
small=(data=mnist5k model=resnet_small data.resolution=28 data.eval_resolution=28 train_batch_size=256
  precision=fp32 scheduler.t_warmup=1ep quality_targets=[0.9,0.95,0.97] hardware=cpu_2vcpu_aws progress=false)

rm -rf "$demo/budget" "$demo/auto"  # this script's own runs, made again (a run folder holds one run)
"$trainrun" --config-dir "$here" recipe=mild_mnist "${small[@]}" max_duration=30s hydra.run.dir="$demo/budget/mild30s"
for budget in 12s 20s 40s; do
  "$trainrun" --config-dir "$here" recipe=auto max_duration=$budget auto.table="$demo/report/report.csv" \
    "${small[@]}" hydra.run.dir="$demo/auto/$budget"
done
"$trainrun" report "$demo/baseline" "$demo/mild_mnist" "$demo/auto" --out "$demo/auto/report"
