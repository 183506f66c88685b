#!/usr/bin/env bash
# Creates or refreshes a second virtual environment (default: .venv-numpy2/ at the repository
# root): the stack of requirements/*.txt with numpy 2 instead of numpy 1 (requirements/numpy2.txt
# replaces runtime.txt's numpy and opencv pins). CI runs the fast test tier in it (.ci/run;
# docs/install.md, "numpy 2").
#
#   bash tools/setup_numpy2_env.sh              # .venv-numpy2/
#   bash tools/setup_numpy2_env.sh --venv DIR   # another environment
#
# mmcv is the compiled wheel that `bash tools/setup_env.sh --ops` (run_tests.sh) builds and
# caches in ${MST_MM_WHEEL_CACHE:-~/.cache/mst_mm/wheels}: its ops call no numpy C API, so the
# one wheel serves both environments. Run that first; this script compiles nothing.
# Idempotent: a stamp in the environment records the inputs, so a second run that asks for
# nothing new takes well under a second.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-numpy2"

log() { printf '[setup_numpy2_env] %s\n' "$*" >&2; }
die() { printf '[setup_numpy2_env] error: %s\n' "$*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --venv) [ $# -ge 2 ] || die "--venv needs a folder"; VENV="$2"; shift ;;
    --venv=*) VENV="${1#*=}" ;;
    -h|--help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see: bash tools/setup_numpy2_env.sh --help)" ;;
  esac
  shift
done

VENV="$(mkdir -p "$(dirname "$VENV")" && cd "$(dirname "$VENV")" && pwd)/$(basename "$VENV")"
PY="$VENV/bin/python"
STAMP="$VENV/.mst_mm_numpy2_stamp"
CACHE="${MST_MM_WHEEL_CACHE:-$HOME/.cache/mst_mm/wheels}"
MMCV_VERSION="$(sed -n 's/^mmcv==\([0-9.]*\).*/\1/p' "$ROOT/requirements/mmcv.txt")"
[ -n "$MMCV_VERSION" ] || die "requirements/mmcv.txt names no 'mmcv==VERSION' line"

inputs_hash() {
  cat "$ROOT"/requirements/*.txt "$ROOT/setup.py" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1
}
if [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "inputs $(inputs_hash)" ]; then
  log "environment up to date ($VENV)"
  exit 0
fi

if [ ! -x "$PY" ]; then
  log "creating $VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
PY_TAG="$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
MMCV_WHEEL="$(ls "$CACHE"/mmcv-"$MMCV_VERSION"-"$PY_TAG"-*.whl 2>/dev/null | head -n1 || true)"
[ -n "$MMCV_WHEEL" ] || die "no compiled mmcv-$MMCV_VERSION wheel for $PY_TAG in $CACHE: run 'bash tools/setup_env.sh --ops' first (it builds and caches one, about 7 minutes on 2 cores)"
PIP=("$PY" -m pip install --disable-pip-version-check -q)

CONSTRAINTS="$(mktemp)"
RUNTIME="$(mktemp)"
trap 'rm -f "$CONSTRAINTS" "$RUNTIME"' EXIT
grep -Ev '^(numpy|opencv-python)\b' "$ROOT/requirements/runtime.txt" > "$RUNTIME"
grep -hv '^\s*#' "$ROOT/requirements/build.txt" "$ROOT/requirements/mminstall.txt" \
  "$ROOT/requirements/torch.txt" "$ROOT/requirements/numpy2.txt" "$RUNTIME" \
  | sed '/^\s*$/d' > "$CONSTRAINTS"

log "build tools"
"${PIP[@]}" -c "$CONSTRAINTS" -r "$ROOT/requirements/build.txt"
# torch first: anything asking for plain `torch` would otherwise pull the newest CUDA build.
log "torch + torchvision (registry build, ~5 GB the first time)"
"${PIP[@]}" -r "$ROOT/requirements/torch.txt"
log "OpenMMLab stack with numpy 2 and the cached compiled mmcv"
"${PIP[@]}" -c "$CONSTRAINTS" "$MMCV_WHEEL" -r "$ROOT/requirements/mminstall.txt" \
  -r "$RUNTIME" -r "$ROOT/requirements/numpy2.txt" -r "$ROOT/requirements/tests.txt"
log "mst_mm (editable)"
"${PIP[@]}" -c "$CONSTRAINTS" --no-build-isolation --no-deps -e "$ROOT"

# From outside the checkout, so that mst_mm is imported through the install.
(cd "$VENV" && OMP_NUM_THREADS=1 "$PY" - <<'PY'
import numpy
import torch
from mmcv.ops import nms

import mmdet.models  # noqa: F401
import mmpretrain.models  # noqa: F401
import mmseg.models  # noqa: F401
import mst_mm  # noqa: F401

assert int(numpy.__version__.split('.')[0]) >= 2, f'numpy {numpy.__version__} is not numpy 2'
boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]])
assert nms(boxes, torch.tensor([0.9, 0.8]), 0.5)[1].tolist() == [0]
print(f'[setup_numpy2_env] numpy {numpy.__version__}: mmcv ops, mmpretrain, mmdet, mmseg '
      'and mst_mm import')
PY
)

printf 'inputs %s\n' "$(inputs_hash)" > "$STAMP"
log "ready: $VENV"
