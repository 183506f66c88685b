#!/usr/bin/env bash
# Creates or refreshes .venv/ at the repository root with the verified stack.
# Idempotent: a stamp records what was installed, so a second run takes seconds.
# The mmcv wheel (a 7-minute compile) is cached outside the repository in
# ${MST_MM_WHEEL_CACHE:-~/.cache/mst_mm/wheels} and reused by every clone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
CACHE="${MST_MM_WHEEL_CACHE:-$HOME/.cache/mst_mm/wheels}"
MMCV_VERSION="2.1.0"
STAMP="$VENV/.mst_mm_stamp"

log() { printf '[setup_env] %s\n' "$*" >&2; }

want_stamp() {
  cat "$ROOT"/requirements/*.txt "$ROOT/setup.py" "$ROOT/tools/setup_env.sh" | sha256sum | cut -d' ' -f1
}

if [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(want_stamp)" ]; then
  log "environment up to date ($VENV)"
  exit 0
fi

if [ ! -x "$PY" ]; then
  log "creating $VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
grep -hv '^\s*#' "$ROOT/requirements/build.txt" "$ROOT/requirements/torch.txt" \
  "$ROOT/requirements/mminstall.txt" "$ROOT/requirements/runtime.txt" | sed '/^\s*$/d' > "$CONSTRAINTS"

log "build tools"
pip_install -U pip -c "$CONSTRAINTS"
pip_install -r "$ROOT/requirements/build.txt"
# torch first: anything asking for plain `torch` would otherwise pull the newest CUDA build.
log "torch + torchvision (registry build, ~5 GB the first time)"
pip_install -r "$ROOT/requirements/torch.txt"

mkdir -p "$CACHE"
MMCV_WHEEL="$(ls "$CACHE"/mmcv-"$MMCV_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
if [ -z "$MMCV_WHEEL" ]; then
  log "building mmcv $MMCV_VERSION with ops (about 7 minutes on 2 cores; cached in $CACHE)"
  BUILD_DIR="$(mktemp -d)"
  MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" CFLAGS=-g0 \
    "$PY" -m pip wheel --disable-pip-version-check -q --no-build-isolation --no-deps \
    "mmcv==$MMCV_VERSION" -w "$BUILD_DIR"
  mv "$BUILD_DIR"/mmcv-*.whl "$CACHE"/
  rm -rf "$BUILD_DIR"
  MMCV_WHEEL="$(ls "$CACHE"/mmcv-"$MMCV_VERSION"-*.whl | head -n1)"
fi

log "OpenMMLab stack"
pip_install -c "$CONSTRAINTS" "$MMCV_WHEEL" \
  -r "$ROOT/requirements/mminstall.txt" -r "$ROOT/requirements/runtime.txt" \
  -r "$ROOT/requirements/tests.txt"
log "mst_mm (editable)"
pip_install -c "$CONSTRAINTS" --no-build-isolation --no-deps -e "$ROOT"

"$PY" - <<'PY'
import numpy, setuptools, torch, torchvision, mmcv
assert numpy.__version__.startswith('1.'), numpy.__version__
assert int(setuptools.__version__.split('.')[0]) < 82, setuptools.__version__
assert not torch.__version__.endswith('+cpu'), torch.__version__
import mmcv.ops, mmpretrain.models, mmdet.models, mmseg.models, mst_mm  # noqa
print(f'[setup_env] torch {torch.__version__}, torchvision {torchvision.__version__}, mmcv {mmcv.__version__}')
PY
want_stamp > "$STAMP"
log "ready: $VENV"
