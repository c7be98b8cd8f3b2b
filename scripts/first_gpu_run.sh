#!/usr/bin/env bash
# The GPU run, in few calls on the GPU machine (docs/benchmarks.md, "The first GPU run"):
#   STEPS="env tests bert128 bert512 alibi" bash scripts/first_gpu_run.sh   # after scripts/gpu_wheels.sh
# here (.whl/ travels with the tree); then STEPS="compile resnet gpt llama estimate llama_compiled", then
# STEPS="loaders recipes unet". The fast paths (compile, fp8, the recipe-versus-bench gap of the
# Llama; its rows ran on 2026-11-27) two recipes a call of 9 minutes:
# STEP_LIMIT=540 FAST_RECIPES="gpt_speedrun gpt125" STEPS="fastpaths".
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
steps=${STEPS:-peers operations rates fastpaths env tests bert128 bert512 alibi compile resnet gpt llama estimate llama_compiled loaders recipes unet}

step() {  # each step stops after STEP_LIMIT seconds (default 300), so one slow step leaves the rest their time
  local name=$1
  shift
  echo "== $name: $*"
  local started=$SECONDS
  if declare -F "$1" >/dev/null; then  # a function here (recipes) bounds its own commands
    "$@" >"$out/$name.log" 2>&1
  else
    timeout "${STEP_LIMIT:-300}" "$@" >"$out/$name.log" 2>&1
  fi
  echo "   exit $? after $((SECONDS - started)) s"
  tail -n "${TAIL:-20}" "$out/$name.log"
}

recipes() {  # each recipe's first steps on built-in data, at the recipe's own settings otherwise
  # Images: one GPU's share of the recipes' 8-GPU batch (256 of 2048, the lr scaled with it; SAM in
  # medium and hot takes no micro-batches) and 12 workers generating the synthetic images (the data's
  # default is 0, for a 2-core machine: 456 img/s on the H100 machine).
  local images="data=synthetic data.num_samples=8192 data.num_classes=1000 data.resolution=176"
  images+=" data.eval_resolution=224 data.num_workers=12 train_batch_size=256 eval_batch_size=256 max_duration=24ba"
  images+=" eval_interval=24ba"
  local text="data=stdlib_docs data.num_workers=8 stop_at=null device_train_microbatch_size=auto max_duration=40ba eval_interval=40ba"
  local recipe data
  # GPT: batches of 64 windows, fewer than the built-in stream's 302 (the recipes' 384 and 512 are more)
  local stream="data=stdlib_stream data.num_workers=8 stop_at=null device_train_microbatch_size=auto train_batch_size=64"
  stream+=" max_duration=20ba eval_interval=20ba"
  for recipe in ${RECIPES:-mild baseline medium hot bert_base bert_large gpt125 gpt_speedrun}; do
    case $recipe in
      bert*) data=$text ;;
      gpt*) data=$stream ;;
      *) data=$images ;;
    esac
    # shellcheck disable=SC2086  # $data is a list of overrides
    timeout "${RECIPE_LIMIT:-120}" python3 -m trainrun recipe="$recipe" $data \
      checkpoint.interval=null launcher.devices=1 progress=false hydra.run.dir="$out/run-$recipe" \
      || echo "recipe $recipe failed"
  done
}

unet() {  # Composer's 2D UNet on 192x160 crops of synthetic volumes, without and with channels-last
  local data="data=synthetic_brats data.segmentation.synthetic_shape=[32,192,160] data.segmentation.synthetic_cases=16"
  data+=" data.segmentation.patch_size=[192,160] data.num_workers=12 train_batch_size=64 max_duration=40ba eval_interval=40ba"
  local layout
  for layout in plain channels_last; do
    local methods="algorithms=[]"
    [ "$layout" = channels_last ] && methods="algorithms=[channels_last]"
    # shellcheck disable=SC2086  # $data is a list of overrides
    timeout "${RECIPE_LIMIT:-120}" python3 -m trainrun task=segmentation model=unet2d $data "$methods" precision=amp \
      checkpoint.interval=null launcher.devices=1 progress=false hydra.run.dir="$out/unet-$layout" \
      || echo "unet $layout failed"
  done
}

for name in $steps; do
  case $name in
    env) step env bash -c "nvidia-smi; python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'" ;;
    tests) step tests python3 -m pytest -q -x -p no:cacheprovider tests/test_bert_attention.py tests/test_gpu_paths.py tests/test_distributed_step.py ;;
    resnet) step resnet python3 bench/gpu_throughput.py --resolutions 176 224 --batch-sizes 256 --precisions amp bf16 \
      --channels-last on --compile off on --recipe mild ;;
    # trainrun estimate's ResNet rate rows at every side a progressive-resizing run trains at (issue 67:
    # one utilisation for every side is what its mild and hot misses come from); then bert128 for BERT's
    rates) step rates python3 bench/gpu_throughput.py --resolutions 88 128 160 176 192 224 --batch-sizes 256 \
      --precisions amp --channels-last on --compile off on --recipe mild ;;
    bert128) step bert128 python3 bench/bert.py --precision bf16 --seq 128 --batch 256 --attention sdpa varlen flex --check-syncs ;;
    compile) step compile python3 bench/bert.py --precision bf16 --seq 128 --batch 256 --compile --rounds 2 ;;
    bert512) step bert512 python3 bench/bert.py --precision bf16 --lengths corpus --seq 512 --batch 128 --attention sdpa varlen flex ;;
    alibi) step alibi python3 bench/bert.py --precision bf16 --seq 128 --batch 256 --alibi --attention sdpa flex --check-syncs ;;
    gpt) step gpt python3 bench/gpt_step.py --compile ;;
    llama) step llama python3 bench/sharding.py speed --model llama3_1b --batch 1 --seq 2048 --activation-checkpointing selective --precisions bf16 ;;  # the recipe's micro-batch
    # each LLM recipe and BERT-Base at its shape, eager against compiled (fp8 compiled for the Llama)
    # shellcheck disable=SC2086  # FAST_RECIPES is a list of recipes (100-190 s a run on an H100)
    fastpaths) TAIL=30 step fastpaths python3 bench/fast_paths.py --steps 20 --recipes ${FAST_RECIPES:-gpt_speedrun gpt125} ;;
    estimate) step estimate python3 bench/estimate_check.py ;;  # trainrun estimate against the measured peaks
    # each kind of operation and whole steps of brought models beside the estimate's times (issue 92's second call)
    operations) step operations python3 bench/operations.py ;;
    llama_compiled) step llama_compiled python3 bench/sharding.py speed --model llama3_1b --batch 2 --seq 4096 --precisions bf16 fp8 --compile --rounds 1 ;;
    loaders) step loaders python3 bench/loaders.py --hot --images 4000 --workers 8 --sides 300 900 --batch 256 ;;
    # trainrun beside nanoGPT, Trainer and Lightning, four sections of at most 125 s each (one call):
    # STEP_LIMIT=560 STEPS=peers, with .whl and .peers carried (scripts/gpu_wheels.sh NANOGPT=DIR)
    peers) nanogpt=() && [ -f .peers/nanoGPT/train.py ] && nanogpt=(--nanogpt .peers/nanoGPT)
      TAIL=80 step peers python3 bench/peers.py --device cuda --rounds 1 --section-limit 125 "${nanogpt[@]}" --out /tmp/peers ;;
    recipes) TAIL=60 step recipes recipes ;;
    unet) TAIL=30 step unet unet ;;
  esac
done
