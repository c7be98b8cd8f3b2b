#!/usr/bin/env bash
# The oldest torch trainrun supports, beside .venv: .venv-floor holds torch and torchvision at the
# floors setup.cfg states (and the triton that torch pins) and reads every other package from .venv
# through a .pth file placed after its own site-packages, so that `make test-floor` runs the
# distributed, sharded, checkpoint and compile tests under the floor for a download of about
# 800 MB and no second copy of the rest. Idempotent: skipped once the floor torch imports.
set -euo pipefail
cd "$(dirname "$0")/.."
MAIN=${VENV:-.venv}
FLOOR=${FLOOR_VENV:-.venv-floor}
floor_of() { sed -n "s/^ *$1>=\([0-9.]*\).*/\1/p" setup.cfg; }
torch_floor=$(floor_of torch)
vision_floor=$(floor_of torchvision)
[ -n "$torch_floor" ] && [ -n "$vision_floor" ] || { echo "setup.cfg states no torch or torchvision floor" >&2; exit 2; }
if "$FLOOR/bin/python" -c "import torch, sys; sys.exit(not torch.__version__.startswith('$torch_floor.'))" 2>/dev/null; then
  exit 0
fi
[ -x "$FLOOR/bin/python" ] || python3 -m venv "$FLOOR"
pip=("$FLOOR/bin/python" -m pip install -q --disable-pip-version-check --no-deps)
"${pip[@]}" "torch==$torch_floor.*" "torchvision==$vision_floor.*"
triton=$("$FLOOR/bin/python" - <<'PY'
from importlib.metadata import requires
print(next((r.split(";")[0].replace(" ", "") for r in requires("torch") if r.startswith("triton")), ""))
PY
)
[ -z "$triton" ] || "${pip[@]}" "$triton"
site=$("$FLOOR/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
main_site=$("$MAIN/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$(cd "$main_site" && pwd)" > "$site/zz_trainrun_main_env.pth"  # "zz": read after the floor's own packages
"$FLOOR/bin/python" -c "import torch, torchvision, hydra, trainrun; print('floor env: torch', torch.__version__)"
