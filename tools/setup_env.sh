#!/usr/bin/env bash
# Creates or refreshes a virtual environment (default: .venv/ at the repository root) with
# the verified stack of requirements/*.txt, then checks it (tools/stack_check.py).
#
#   bash tools/setup_env.sh                   # pretraining stack: mmcv-lite, no compile
#   bash tools/setup_env.sh --ops             # + mmcv compiled with ops (mmdet/mmseg, tests)
#   bash tools/setup_env.sh --wheelhouse DIR  # everything from DIR alone, no index
#   bash tools/setup_env.sh --no-torch        # keep the environment's own (CUDA) torch
#   bash tools/setup_env.sh --venv DIR        # another environment than .venv/
#   bash tools/setup_env.sh --stack FILE      # FILE's pins replace those of the same packages
#                                             # (the other stacks that CI tests:
#                                             # requirements/stacks/*.txt)
#
# mmcv comes in two flavours that write the same files (never both at once): `mmcv-lite`, a
# pure-Python wheel, is enough for the demo, pretraining, k-NN and linear probing; mmdet's
# RoIAlign/nms and mmseg need mmcv compiled with ops (about 7 minutes on 2 cores). Without
# --ops the script installs mmcv-lite unless a compiled mmcv is already there (it serves
# both); with --ops it uninstalls mmcv-lite and installs the compiled wheel, cached outside
# the repository in ${MST_MM_WHEEL_CACHE:-~/.cache/mst_mm/wheels} and reused by every clone.
#
# Idempotent: a stamp in the environment records the inputs, the mmcv flavour and whose
# torch is installed, so a second run that asks for nothing new takes well under a second.
# The flavour and --no-torch are sticky: a later run without the flag keeps them.
# MST_MM_WHEELHOUSE=DIR in the environment acts as --wheelhouse DIR (for run_demo.sh and
# run_tests.sh on an offline machine).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
WHEELHOUSE="${MST_MM_WHEELHOUSE:-}"
WANT_OPS=0
OWN_TORCH=0
STACK=""

log() { printf '[setup_env] %s\n' "$*" >&2; }
die() { printf '[setup_env] error: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --ops) WANT_OPS=1 ;;
    --no-torch) OWN_TORCH=1 ;;
    --wheelhouse) [ $# -ge 2 ] || die "--wheelhouse needs a folder"; WHEELHOUSE="$2"; shift ;;
    --wheelhouse=*) WHEELHOUSE="${1#*=}" ;;
    --venv) [ $# -ge 2 ] || die "--venv needs a folder"; VENV="$2"; shift ;;
    --venv=*) VENV="${1#*=}" ;;
    --stack) [ $# -ge 2 ] || die "--stack needs a requirements file"; STACK="$2"; shift ;;
    --stack=*) STACK="${1#*=}" ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see: bash tools/setup_env.sh --help)" ;;
  esac
  shift
done

VENV="$(mkdir -p "$(dirname "$VENV")" && cd "$(dirname "$VENV")" && pwd)/$(basename "$VENV")"
if [ -n "$STACK" ]; then
  [ -f "$STACK" ] || die "--stack '$STACK' is not a file (the stacks CI tests: requirements/stacks/)"
  STACK="$(cd "$(dirname "$STACK")" && pwd)/$(basename "$STACK")"
fi
PY="$VENV/bin/python"
STAMP="$VENV/.mst_mm_stamp"
CACHE="${MST_MM_WHEEL_CACHE:-$HOME/.cache/mst_mm/wheels}"
MMCV_VERSION="$(sed -n 's/^mmcv==\([0-9.]*\).*/\1/p' "$ROOT/requirements/mmcv.txt")"
[ -n "$MMCV_VERSION" ] || die "requirements/mmcv.txt names no 'mmcv==VERSION' line"

inputs_hash() {
  cat "$ROOT"/requirements/*.txt ${STACK:+"$STACK"} "$ROOT/setup.py" "$ROOT/tools/setup_env.sh" \
    "$ROOT/projects/mst_research/pyproject.toml" \
    | sha256sum | cut -d' ' -f1
}
stamp_field() { [ -f "$STAMP" ] && sed -n "s/^$1 //p" "$STAMP" || true; }

# Sticky choices: a compiled mmcv serves every command; an environment set up with its own
# torch keeps it (run_demo.sh must never replace a user's CUDA torch by the pinned build).
[ "$(stamp_field torch)" = own ] && OWN_TORCH=1
TORCH_MODE=$([ "$OWN_TORCH" = 1 ] && echo own || echo pinned)
if [ -x "$PY" ] && [ "$(stamp_field inputs)" = "$(inputs_hash)" ] \
   && [ "$(stamp_field torch)" = "$TORCH_MODE" ] \
   && { [ "$WANT_OPS" = 0 ] || [ "$(stamp_field mmcv)" = ops ]; }; then
  log "environment up to date ($VENV, mmcv $(stamp_field mmcv), torch $TORCH_MODE)"
  exit 0
fi

# pip: from the wheelhouse alone (config files, extra indexes and find-links of this machine
# switched off), or from the configured index.
PIP_ARGS=(--disable-pip-version-check -q)
if [ -n "$WHEELHOUSE" ]; then
  [ -d "$WHEELHOUSE" ] || die "wheelhouse '$WHEELHOUSE' is not a folder; collect one with tools/collect_wheelhouse.sh"
  WHEELHOUSE="$(cd "$WHEELHOUSE" && pwd)"
  ls "$WHEELHOUSE"/*.whl >/dev/null 2>&1 || die "wheelhouse '$WHEELHOUSE' holds no .whl files; collect one with tools/collect_wheelhouse.sh"
  export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1
  unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_CONSTRAINT
  PIP_ARGS+=(--no-index --find-links "$WHEELHOUSE")
fi
pip_install() { "$PY" -m pip install "${PIP_ARGS[@]}" "$@"; }

if [ ! -x "$PY" ]; then
  # --no-torch: the new environment sees the interpreter's own packages (the user's CUDA
  # torch); what we install goes into the environment and takes precedence.
  VENV_ARGS=()
  [ "$OWN_TORCH" = 1 ] && VENV_ARGS+=(--system-site-packages)
  log "creating $VENV ${VENV_ARGS[*]:-}"
  "${PYTHON:-python3}" -m venv "${VENV_ARGS[@]}" "$VENV"
fi
PY_TAG="$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
PY_VERSION="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

MANIFEST="${WHEELHOUSE:+$WHEELHOUSE/wheelhouse.txt}"
manifest_field() { [ -n "$MANIFEST" ] && [ -f "$MANIFEST" ] && sed -n "s/^$1=//p" "$MANIFEST" || true; }
if [ -n "$WHEELHOUSE" ]; then
  made_for="$(manifest_field python_version)"
  [ -z "$made_for" ] || [ "$made_for" = "$PY_VERSION" ] || die "wheelhouse '$WHEELHOUSE' was collected for Python $made_for, this environment runs Python $PY_VERSION: collect it again with --python-version $PY_VERSION, or set PYTHON to a python$made_for"
  if [ "$OWN_TORCH" = 0 ] && [ "$(manifest_field torch)" = excluded ]; then
    die "wheelhouse '$WHEELHOUSE' has no torch (collected with --no-torch): pass --no-torch and bring torch and torchvision in the environment (for a new .venv: in the interpreter that PYTHON names)"
  fi
fi

# What is installed now: ops | lite | both | no-ops | none (package metadata, no import).
installed_mmcv() {
  "$PY" - <<'PY'
import importlib.metadata as md
def files(name):
    try:
        return [str(f) for f in (md.distribution(name).files or [])]
    except md.PackageNotFoundError:
        return None
full, lite = files('mmcv'), files('mmcv-lite')
if full is not None and lite is not None:
    print('both')
elif full is not None:
    print('ops' if any(f.startswith('mmcv/_ext') for f in full) else 'no-ops')
else:
    print('lite' if lite is not None else 'none')
PY
}
INSTALLED_MMCV="$(installed_mmcv)"
compiled_mmcv_in() { ls "$1"/mmcv-"$MMCV_VERSION"-"$PY_TAG"-*.whl 2>/dev/null | head -n1 || true; }
if [ "$WANT_OPS" = 0 ] && { [ "$INSTALLED_MMCV" = ops ] \
     || { [ -n "$WHEELHOUSE" ] && [ -n "$(compiled_mmcv_in "$WHEELHOUSE")" ]; }; }; then
  WANT_OPS=1   # a compiled mmcv is there (or is all the wheelhouse has): it serves both
fi
FLAVOUR=$([ "$WANT_OPS" = 1 ] && echo ops || echo lite)
log "mmcv $MMCV_VERSION: installed '$INSTALLED_MMCV', wanted '$FLAVOUR'; torch: $TORCH_MODE"
# What will be installed as mmcv; a wheelhouse that cannot give it is refused before
# anything in the environment changes.
MMCV_SPEC="mmcv-lite==$MMCV_VERSION"
if [ "$FLAVOUR" = ops ] && [ -n "$WHEELHOUSE" ]; then
  MMCV_SPEC="$(compiled_mmcv_in "$WHEELHOUSE")"
  [ -n "$MMCV_SPEC" ] || die "wheelhouse '$WHEELHOUSE' has no compiled mmcv-$MMCV_VERSION for $PY_TAG (it was collected with --mmcv lite?): drop --ops for pretraining only, or collect it with --mmcv ops"
fi

# requirements/*.txt as pip reads them, with --stack's pins in place of the same packages'.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
pin_names() { sed -n 's/^\s*\([A-Za-z0-9_.-]*\).*/\1/p' "$@" | tr 'A-Z_' 'a-z-' | sort -u; }
stacked() {  # a requirements file with --stack's line in place of each package it pins
  local line name
  grep -v '^\s*#' "$1" | sed '/^\s*$/d' | while IFS= read -r line; do
    name="$(printf '%s\n' "$line" | pin_names /dev/stdin)"
    if [ -n "$STACK" ] && pin_names "$STACK" | grep -qx "$name"; then
      grep -v '^\s*#' "$STACK" | sed '/^\s*$/d' | while IFS= read -r line; do
        [ "$(printf '%s\n' "$line" | pin_names /dev/stdin)" = "$name" ] && printf '%s\n' "$line"
      done || true
    else
      printf '%s\n' "$line"
    fi
  done
}
for file in build mminstall runtime torch tests; do
  stacked "$ROOT/requirements/$file.txt" > "$WORK/$file.txt"
done
CONSTRAINTS="$WORK/constraints.txt"
CONSTRAINT_FILES=("$WORK/build.txt" "$WORK/mminstall.txt" "$WORK/runtime.txt")
[ "$TORCH_MODE" = pinned ] && CONSTRAINT_FILES+=("$WORK/torch.txt")
cat "${CONSTRAINT_FILES[@]}" > "$CONSTRAINTS"

log "build tools"
if [ -z "$WHEELHOUSE" ]; then pip_install -U pip; fi
pip_install -c "$CONSTRAINTS" -r "$WORK/build.txt"

if [ "$TORCH_MODE" = pinned ]; then
  # torch first: anything asking for plain `torch` would otherwise pull the newest CUDA build.
  log "torch + torchvision (registry build, ~5 GB the first time)"
  # --stack's torch, if it pins one, with the stack's constraints (its numpy, say)
  pip_install -c "$CONSTRAINTS" -r "$WORK/torch.txt"
else
  "$PY" -c 'import importlib.metadata as md; md.version("torch"); md.version("torchvision")' \
    2>/dev/null || die "--no-torch keeps the environment's own torch, but $PY sees no torch and torchvision: install your build first (e.g. pip install torch torchvision --index-url https://download.pytorch.org/whl/cu121), or drop --no-torch"
  log "keeping the environment's torch $("$PY" -c 'import importlib.metadata as md; print(md.version("torch"))')"
fi

if [ "$FLAVOUR" = ops ] && [ -z "$WHEELHOUSE" ]; then
  # A compiled wheel fits one torch build: the pinned torch's wheels sit in the cache
  # itself, those for an environment's own torch in a folder named after that torch.
  TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
  if [ "$TORCH_MODE" = own ] || ! grep -q "^torch===$TORCH_VERSION\$" "$ROOT/requirements/torch.txt"; then
    CACHE="$CACHE/torch-$("$PY" -c 'import torch; print(torch.__version__)')"
  fi
  mkdir -p "$CACHE"
  MMCV_SPEC="$(compiled_mmcv_in "$CACHE")"
  if [ -z "$MMCV_SPEC" ]; then
    log "building mmcv $MMCV_VERSION with ops (about 7 minutes on 2 cores; cached in $CACHE)"
    BUILD_DIR="$(mktemp -d)"
    MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" CFLAGS=-g0 \
      # --no-cache-dir: pip's own wheel cache keys a build by the sdist alone, and would
      # hand back a wheel compiled against another torch.
      "$PY" -m pip wheel --disable-pip-version-check -q --no-cache-dir --no-build-isolation --no-deps \
      "mmcv==$MMCV_VERSION" -w "$BUILD_DIR"
    mv "$BUILD_DIR"/mmcv-*.whl "$CACHE"/
    rm -rf "$BUILD_DIR"
    FRESH_MMCV=1  # a compiled mmcv already installed here may fit another torch: replace it
    MMCV_SPEC="$(compiled_mmcv_in "$CACHE")"
  fi
fi

# mmcv: remove the other flavour (and any half state) once the wanted one is at hand.
[ "${FRESH_MMCV:-0}" = 1 ] && [ "$INSTALLED_MMCV" = ops ] && INSTALLED_MMCV=stale
case "$FLAVOUR:$INSTALLED_MMCV" in
  ops:ops|lite:lite) ;;
  *:none) ;;
  *) log "uninstalling the installed mmcv ($INSTALLED_MMCV) before installing mmcv $FLAVOUR"
     "$PY" -m pip uninstall --disable-pip-version-check -q -y mmcv-lite mmcv ;;
esac

log "OpenMMLab stack with mmcv $FLAVOUR"
pip_install -c "$CONSTRAINTS" "$MMCV_SPEC" \
  -r "$WORK/mminstall.txt" -r "$WORK/runtime.txt" -r "$WORK/tests.txt"
log "mst_mm (editable)"
pip_install -c "$CONSTRAINTS" --no-build-isolation --no-deps -e "$ROOT"
log "mst_research, the research kit (editable; not part of mst_mm's wheel)"
pip_install --no-build-isolation --no-deps -e "$ROOT/projects/mst_research"

CHECK_ARGS=()
[ "$FLAVOUR" = ops ] && CHECK_ARGS+=(--ops)
[ "$TORCH_MODE" = pinned ] && [ -z "$STACK" ] && CHECK_ARGS+=(--pinned-torch)
# Run from outside the checkout, so that mst_mm is imported through the install.
(cd "$VENV" && OMP_NUM_THREADS=1 "$PY" "$ROOT/tools/stack_check.py" "${CHECK_ARGS[@]}")

printf 'inputs %s\nmmcv %s\ntorch %s\n' "$(inputs_hash)" "$FLAVOUR" "$TORCH_MODE" > "$STAMP"
log "ready: $VENV (mmcv $FLAVOUR, torch $TORCH_MODE)"
