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
# A stack file is a requirements file with two additions: `# python: X.Y` makes a new
# environment with that Python (pythonX.Y on PATH, else pyenv's; PYTHON overrides), and a
# line ending in `# replaces NAME` takes the place of NAME's pin, for another distribution of
# the same import (onedl-mmcv for mmcv). Without --stack, a new environment gets PYTHON or
# python3.
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
usage() { sed -n '2,31p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

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
STACK_PYTHON="$([ -n "$STACK" ] && sed -n 's/^# python: *\(3\.[0-9]*\) *$/\1/p' "$STACK" || true)"

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

# The interpreter of a new environment: PYTHON, else the stack's Python, else python3.
stack_interpreter() {  # the first of pythonX.Y on PATH and pyenv's X.Y that runs
  local candidate
  for candidate in "$(command -v "python$STACK_PYTHON" || true)" \
      $(command -v pyenv >/dev/null && ls -d "$(pyenv root)/versions/$STACK_PYTHON".*/bin/python 2>/dev/null | sort -rV); do
    # (a pyenv shim is on PATH even where that version is not selected: it must run)
    if [ -n "$candidate" ] && "$candidate" -c 'import venv' >/dev/null 2>&1; then
      printf '%s\n' "$candidate"
      return
    fi
  done
  die "the stack '$STACK' wants Python $STACK_PYTHON, which is neither python$STACK_PYTHON on PATH nor a pyenv version: install it (pyenv install $STACK_PYTHON), or set PYTHON to a python$STACK_PYTHON"
}
if [ ! -x "$PY" ]; then
  # --no-torch: the new environment sees the interpreter's own packages (the user's CUDA
  # torch); what we install goes into the environment and takes precedence.
  VENV_ARGS=()
  [ "$OWN_TORCH" = 1 ] && VENV_ARGS+=(--system-site-packages)
  BASE_PYTHON="${PYTHON:-$([ -n "$STACK_PYTHON" ] && stack_interpreter || echo python3)}"
  log "creating $VENV with $BASE_PYTHON ${VENV_ARGS[*]:-}"
  "$BASE_PYTHON" -m venv "${VENV_ARGS[@]}" "$VENV"
fi
PY_TAG="$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
PY_VERSION="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ -z "$STACK_PYTHON" ] || [ "$STACK_PYTHON" = "$PY_VERSION" ] || [ -n "${PYTHON:-}" ] \
  || die "$VENV runs Python $PY_VERSION, the stack '$STACK' wants $STACK_PYTHON: remove it (rm -rf $VENV) or give another --venv"

MANIFEST="${WHEELHOUSE:+$WHEELHOUSE/wheelhouse.txt}"
manifest_field() { [ -n "$MANIFEST" ] && [ -f "$MANIFEST" ] && sed -n "s/^$1=//p" "$MANIFEST" || true; }
if [ -n "$WHEELHOUSE" ]; then
  made_for="$(manifest_field python_version)"
  [ -z "$made_for" ] || [ "$made_for" = "$PY_VERSION" ] || die "wheelhouse '$WHEELHOUSE' was collected for Python $made_for, this environment runs Python $PY_VERSION: collect it again with --python-version $PY_VERSION, or set PYTHON to a python$made_for"
  if [ "$OWN_TORCH" = 0 ] && [ "$(manifest_field torch)" = excluded ]; then
    die "wheelhouse '$WHEELHOUSE' has no torch (collected with --no-torch): pass --no-torch and bring torch and torchvision in the environment (for a new .venv: in the interpreter that PYTHON names)"
  fi
fi

# requirements/*.txt as pip reads them, with --stack's pins in place of the same packages'.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
pin_names() { sed -n 's/^\s*\([A-Za-z0-9_.-]*\).*/\1/p' "$@" | tr 'A-Z_' 'a-z-' | sort -u; }
stack_lines_for() {  # the stack's lines that pin package $1 or say `# replaces $1`
  local line own replaced
  sed '/^\s*#/d; /^\s*$/d' "$STACK" | while IFS= read -r line; do
    own="$(printf '%s\n' "$line" | pin_names /dev/stdin)"
    replaced="$(printf '%s\n' "$line" | sed -n 's/.*#\s*replaces\s\+\([A-Za-z0-9_.-]*\).*/\1/p' | tr 'A-Z_' 'a-z-')"
    if [ "$own" = "$1" ] || [ "$replaced" = "$1" ]; then printf '%s\n' "$line" | sed 's/\s*#.*//'; fi
  done
}
stacked() {  # a requirements file with --stack's lines in place of each package it pins
  local line name replacement
  sed '/^\s*#/d; /^\s*$/d' "$1" | while IFS= read -r line; do
    name="$(printf '%s\n' "$line" | pin_names /dev/stdin)"
    replacement="$([ -z "$STACK" ] || stack_lines_for "$name")"
    printf '%s\n' "${replacement:-$line}"
  done
}
for file in build mmcv openmmlab runtime torch tests; do
  stacked "$ROOT/requirements/$file.txt" > "$WORK/$file.txt"
done
CONSTRAINTS="$WORK/constraints.txt"
CONSTRAINT_FILES=("$WORK/build.txt" "$WORK/openmmlab.txt" "$WORK/runtime.txt")
[ "$TORCH_MODE" = pinned ] && CONSTRAINT_FILES+=("$WORK/torch.txt")
cat "${CONSTRAINT_FILES[@]}" > "$CONSTRAINTS"

# The distribution that provides mmcv: mmcv (whose mmcv-lite has no ops), or a stack's
# replacement such as onedl-mmcv, which always compiles its ops.
MMCV_DIST="$(sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' "$WORK/mmcv.txt" | head -n1)"
MMCV_VERSION="$(sed -n 's/^[A-Za-z0-9_.-]*==\([0-9.]*\).*/\1/p' "$WORK/mmcv.txt" | head -n1)"
[ -n "$MMCV_VERSION" ] || die "requirements/mmcv.txt (with the stack's lines) names no 'DIST==VERSION' line"
MMCV_WHEEL_PREFIX="$(printf '%s' "$MMCV_DIST" | tr '-' '_')-$MMCV_VERSION"

# What is installed now (package metadata, no import): flavour ops | lite | both | no-ops |
# none, and the distributions that provide mmcv.
read -r INSTALLED_MMCV INSTALLED_MMCV_DISTS < <("$PY" "$ROOT/tools/stack_check.py" --installed-mmcv)
compiled_mmcv_in() { ls "$1/$MMCV_WHEEL_PREFIX-$PY_TAG"-*.whl 2>/dev/null | head -n1 || true; }
if [ "$WANT_OPS" = 0 ] && { [ "$INSTALLED_MMCV" = ops ] || [ "$MMCV_DIST" != mmcv ] \
     || { [ -n "$WHEELHOUSE" ] && [ -n "$(compiled_mmcv_in "$WHEELHOUSE")" ]; }; }; then
  # a compiled mmcv is there (or is all the wheelhouse or the stack's provider has): it
  # serves both
  WANT_OPS=1
fi
FLAVOUR=$([ "$WANT_OPS" = 1 ] && echo ops || echo lite)
log "$MMCV_DIST $MMCV_VERSION: installed '$INSTALLED_MMCV' ($INSTALLED_MMCV_DISTS), wanted '$FLAVOUR'; torch: $TORCH_MODE"
# What will be installed as mmcv; a wheelhouse that cannot give it is refused before
# anything in the environment changes.
MMCV_SPEC="mmcv-lite==$MMCV_VERSION"
if [ "$FLAVOUR" = ops ] && [ -n "$WHEELHOUSE" ]; then
  MMCV_SPEC="$(compiled_mmcv_in "$WHEELHOUSE")"
  [ -n "$MMCV_SPEC" ] || die "wheelhouse '$WHEELHOUSE' has no compiled $MMCV_DIST-$MMCV_VERSION for $PY_TAG (it was collected with --mmcv lite?): drop --ops for pretraining only, or collect it with --mmcv ops"
fi

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
    log "building $MMCV_DIST $MMCV_VERSION with ops (7 to 10 minutes on 2 cores; cached in $CACHE)"
    BUILD_DIR="$(mktemp -d)"
    # --no-cache-dir: pip's own wheel cache keys a build by the sdist alone, and would hand
    # back a wheel compiled against another torch.
    MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" CFLAGS=-g0 CXXFLAGS=-g0 \
      "$PY" -m pip wheel --disable-pip-version-check -q --no-cache-dir --no-build-isolation \
      --no-deps "$MMCV_DIST==$MMCV_VERSION" -w "$BUILD_DIR"
    mv "$BUILD_DIR/$MMCV_WHEEL_PREFIX"-*.whl "$CACHE"/
    rm -rf "$BUILD_DIR"
    FRESH_MMCV=1  # a compiled mmcv already installed here may fit another torch: replace it
    MMCV_SPEC="$(compiled_mmcv_in "$CACHE")"
  fi
fi

# mmcv: remove the other flavour or provider (and any half state) once the wanted one is at
# hand.
WANTED_DIST=$([ "$FLAVOUR" = ops ] && echo "$MMCV_DIST" || echo mmcv-lite)
[ "${FRESH_MMCV:-0}" = 1 ] && [ "$INSTALLED_MMCV" = ops ] && INSTALLED_MMCV=stale
if [ "$INSTALLED_MMCV" != none ] && { [ "$INSTALLED_MMCV" != "$FLAVOUR" ] \
     || [ "$INSTALLED_MMCV_DISTS" != "$WANTED_DIST" ]; }; then
  log "uninstalling the installed mmcv ($INSTALLED_MMCV: $INSTALLED_MMCV_DISTS) before installing $WANTED_DIST"
  "$PY" -m pip uninstall --disable-pip-version-check -q -y ${INSTALLED_MMCV_DISTS//,/ }
fi

log "OpenMMLab stack with $WANTED_DIST"
pip_install -c "$CONSTRAINTS" "$MMCV_SPEC" \
  -r "$WORK/openmmlab.txt" -r "$WORK/runtime.txt" -r "$WORK/tests.txt"
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
