#!/usr/bin/env bash
# Install everything trainrun needs into .venv: Debian packages (FFCV's build, Slurm, chromium), torch and
# torchvision from PyPI, then trainrun itself (editable) with its ffcv and dev extras.
# Idempotent: each step is skipped when what it installs is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

# FFCV's build; a real Slurm (slurm-wlm, munge) for tests/test_slurm.py; a real browser (chromium, headless,
# driven by playwright) for tests/test_explore.py and bench/explorer.py
apt_packages=(pkg-config libopencv-dev libturbojpeg0-dev slurm-wlm munge chromium)
if ! dpkg -s "${apt_packages[@]}" >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if ! "$VENV/bin/python" -c "import torch, torchvision" >/dev/null 2>&1; then
  "${pip[@]}" torch torchvision
fi
"${pip[@]}" -e ".[ffcv,dev,slurm]"
"$VENV/bin/python" -c "import ffcv, hydra, tokenizers, torchvision, transformers, trainrun" 
