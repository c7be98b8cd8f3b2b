#!/usr/bin/env bash
# Run here, before the first GPU run (NANOGPT=DIR for the peers step): the wheels the GPU machine lacks (it has torch, torchvision,
# transformers, tokenizers, timm, torchmetrics, rich, matplotlib and tensorboard, not Hydra, MONAI or torchao),
# saved to .whl/ (git-ignored) for scripts/first_gpu_run.sh to install there. FFCV is left out (a
# C extension built against this machine's libraries): the GPU run reads the torch loader's data.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p .whl
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
  hydra-core==1.3.2 omegaconf==2.3.0 mlxtend monai torchao  # MONAI: segmentation's Dice; torchao: precision=fp8
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w .whl antlr4-python3-runtime==4.9.3  # an sdist only
# the peers step (bench/peers.py --device cuda): nanoGPT's own files from a checkout you give
# (NANOGPT=DIR), into .peers/ (git-ignored), which the device call carries beside .whl
if [ -n "${NANOGPT:-}" ]; then
  mkdir -p .peers/nanoGPT
  cp "$NANOGPT"/{train.py,model.py,configurator.py,LICENSE} .peers/nanoGPT/
fi
ls .whl
