#!/usr/bin/env bash
# The first GPU run, in one call on the GPU machine (docs/benchmarks.md, "The first GPU run"):
#   bash scripts/first_gpu_run.sh        # after scripts/gpu_wheels.sh here; .whl/ travels with the tree
# Each step's whole output goes to $OUT/<step>.log (or gpu-run/), its tail to the console.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-run}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
steps=${STEPS:-env tests resnet bert128 bert512 alibi loaders recipes}

step() {
  local name=$1
  shift
  echo "== $name: $*"
  local started=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  echo "   exit $? after $((SECONDS - started)) s"
  tail -n "${TAIL:-20}" "$out/$name.log"
}

recipes() {  # each recipe's first steps on built-in data, at the recipe's own settings otherwise
  local images="data=synthetic data.num_samples=8192 data.num_classes=1000 data.resolution=176 data.eval_resolution=224"
  for recipe in baseline mild medium hot; do
    python3 -m trainrun recipe=$recipe $images max_duration=40ba eval_interval=40ba checkpoint.interval=null \
      launcher.devices=1 progress=false hydra.run.dir="$out/run-$recipe" || echo "recipe $recipe failed"
  done
  for recipe in bert_base bert_large; do
    python3 -m trainrun recipe=$recipe data=stdlib_docs data.num_workers=8 max_duration=40ba eval_interval=40ba \
      stop_at=null checkpoint.interval=null device_train_microbatch_size=auto launcher.devices=1 progress=false \
      hydra.run.dir="$out/run-$recipe" \
      || echo "recipe $recipe failed"
  done
}

for name in $steps; do
  case $name in
    env) step env bash -c "nvidia-smi; python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'" ;;
    tests) step tests python3 -m pytest -q -x -p no:cacheprovider tests/test_bert_attention.py tests/test_gpu_paths.py tests/test_distributed_step.py ;;
    resnet) step resnet python3 bench/gpu_throughput.py --resolutions 176 224 --batch-sizes 256 --precisions amp bf16 \
      --channels-last on --compile off on --recipe mild ;;
    bert128) step bert128 python3 bench/bert.py --precision bf16 --seq 128 --batch 256 --attention sdpa varlen flex --check-syncs --compile ;;
    bert512) step bert512 python3 bench/bert.py --precision bf16 --lengths corpus --seq 512 --batch 32 --attention sdpa varlen flex ;;
    alibi) step alibi python3 bench/bert.py --precision bf16 --seq 128 --batch 256 --alibi --attention sdpa flex --check-syncs ;;
    loaders) step loaders python3 bench/loaders.py --hot --images 4000 --workers 8 --sides 300 900 --batch 256 ;;
    recipes) TAIL=60 step recipes recipes ;;
  esac
done
