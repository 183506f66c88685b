#!/usr/bin/env bash
# Collects a wheelhouse: every wheel of the pinned stack (requirements/*.txt), for a given
# Python version and platform, so that `tools/setup_env.sh --wheelhouse DIR` installs on a
# machine without a network. Run it on a machine that reaches the package index.
#
#   bash tools/collect_wheelhouse.sh --dest DIR [options]
#
#   --dest DIR              the wheelhouse folder (created; existing wheels are kept)
#   --python-version X.Y    target Python (default: this machine's python3 or $PYTHON)
#   --platform TAG          target platform tag, repeatable (default: this machine's; e.g.
#                           manylinux_2_28_x86_64 --platform manylinux2014_x86_64)
#   --mmcv lite|ops         lite (default): the pure-Python mmcv-lite, for pretraining, k-NN
#                           and linear probing; ops: the compiled mmcv wheel from the cache
#                           ${MST_MM_WHEEL_CACHE:-~/.cache/mst_mm/wheels} (built there by
#                           `tools/setup_env.sh --ops` for the same Python and torch), which
#                           mmdet/mmseg fine-tuning and the tests need
#   --mmcv-wheel FILE       with --mmcv ops: this compiled mmcv wheel instead of the cache's
#                           (e.g. one built with CUDA ops against the cluster's torch)
#   --no-torch              leave torch and torchvision out: the target keeps its own (CUDA)
#                           torch; install there with `setup_env.sh --no-torch`
#
# pip asks only for wheels (--only-binary=:all:), so nothing is compiled on the target.
# DIR/wheelhouse.txt records what was collected; setup_env.sh reads it to refuse a
# wheelhouse made for another Python, or one without torch when torch is wanted.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DEST=""
PY_VERSION=""
PLATFORMS=()
MMCV_FLAVOUR=lite
MMCV_WHEEL=""
WITH_TORCH=1
CACHE="${MST_MM_WHEEL_CACHE:-$HOME/.cache/mst_mm/wheels}"

log() { printf '[collect_wheelhouse] %s\n' "$*" >&2; }
die() { printf '[collect_wheelhouse] error: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --dest) need_value "$@"; DEST="$2"; shift ;;
    --python-version) need_value "$@"; PY_VERSION="$2"; shift ;;
    --platform) need_value "$@"; PLATFORMS+=("$2"); shift ;;
    --mmcv) need_value "$@"; MMCV_FLAVOUR="$2"; shift ;;
    --mmcv-wheel) need_value "$@"; MMCV_WHEEL="$2"; MMCV_FLAVOUR=ops; shift ;;
    --no-torch) WITH_TORCH=0 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see: bash tools/collect_wheelhouse.sh --help)" ;;
  esac
  shift
done
[ -n "$DEST" ] || die "--dest DIR is required (see --help)"
case "$MMCV_FLAVOUR" in lite|ops) ;; *) die "--mmcv takes 'lite' or 'ops', not '$MMCV_FLAVOUR'" ;; esac
[ -n "$PY_VERSION" ] || PY_VERSION="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[[ "$PY_VERSION" =~ ^3\.[0-9]+$ ]] || die "--python-version takes MAJOR.MINOR such as 3.12, not '$PY_VERSION'"
PY_TAG="cp${PY_VERSION/./}"
MMCV_VERSION="$(sed -n 's/^mmcv==\([0-9.]*\).*/\1/p' "$ROOT/requirements/mmcv.txt")"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"

# The compiled mmcv comes from a file, never from the index (the index has only its sdist).
if [ "$MMCV_FLAVOUR" = ops ]; then
  if [ -z "$MMCV_WHEEL" ]; then
    MMCV_WHEEL="$(ls "$CACHE"/mmcv-"$MMCV_VERSION"-"$PY_TAG"-*.whl 2>/dev/null | head -n1 || true)"
    [ -n "$MMCV_WHEEL" ] || die "no compiled mmcv-$MMCV_VERSION wheel for $PY_TAG in $CACHE: build it with 'bash tools/setup_env.sh --ops' on a machine with Python $PY_VERSION and the target's torch (it caches the wheel there), pass one with --mmcv-wheel FILE, or use --mmcv lite for pretraining only"
  fi
  [ -f "$MMCV_WHEEL" ] || die "--mmcv-wheel '$MMCV_WHEEL' is not a file"
  case "$(basename "$MMCV_WHEEL")" in
    mmcv-"$MMCV_VERSION"-"$PY_TAG"-*.whl) ;;
    *) die "'$(basename "$MMCV_WHEEL")' is not an mmcv-$MMCV_VERSION wheel for $PY_TAG" ;;
  esac
fi

REQUIREMENTS="$(mktemp)"
PLACEHOLDERS=""
trap 'rm -f "$REQUIREMENTS" "$REQUIREMENTS.constraints"; [ -z "$PLACEHOLDERS" ] || rm -rf "$PLACEHOLDERS"' EXIT
FILES=("$ROOT/requirements/build.txt" "$ROOT/requirements/openmmlab.txt"
       "$ROOT/requirements/runtime.txt" "$ROOT/requirements/tests.txt")
[ "$WITH_TORCH" = 1 ] && FILES+=("$ROOT/requirements/torch.txt")
grep -hv '^\s*#' "${FILES[@]}" | sed '/^\s*$/d' > "$REQUIREMENTS"
[ "$MMCV_FLAVOUR" = lite ] && echo "mmcv-lite==$MMCV_VERSION" >> "$REQUIREMENTS"

TARGET_ARGS=(--python-version "$PY_VERSION" --implementation cp)
for platform in "${PLATFORMS[@]}"; do TARGET_ARGS+=(--platform "$platform"); done

# --no-torch: a requirement that asks for torch (timm does) would pull the pinned 5 GB torch
# into the wheelhouse. Metadata-only placeholder wheels of the pinned versions stand in for
# the target's own torch during resolution, and are removed afterwards.
if [ "$WITH_TORCH" = 0 ]; then
  PLACEHOLDERS="$(mktemp -d)"
  for name in torch torchvision; do
    version="$(sed -n "s/^$name=\{2,3\}\([0-9.]*\).*/\1/p" "$ROOT/requirements/torch.txt")"
    [ -n "$version" ] || die "requirements/torch.txt pins no $name version"
    "$PYTHON" - "$PLACEHOLDERS" "$name" "$version+placeholder" <<'PY'
import sys, zipfile
folder, name, version = sys.argv[1:]
info = f'{name}-{version}.dist-info'
with zipfile.ZipFile(f'{folder}/{name}-{version}-py3-none-any.whl', 'w') as wheel:
    wheel.writestr(f'{info}/METADATA',
                   f'Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n')
    wheel.writestr(f'{info}/WHEEL', 'Wheel-Version: 1.0\nRoot-Is-Purelib: true\n'
                                    'Tag: py3-none-any\n')
    wheel.writestr(f'{info}/RECORD', '')
PY
    echo "$name===$version+placeholder" >> "$REQUIREMENTS.constraints"
  done
  TARGET_ARGS+=(--find-links "$PLACEHOLDERS" -c "$REQUIREMENTS.constraints")
fi
log "downloading the stack for Python $PY_VERSION (${PLATFORMS[*]:-this platform}), mmcv $MMCV_FLAVOUR, torch $([ "$WITH_TORCH" = 1 ] && echo included || echo excluded)"
"$PYTHON" -m pip download --disable-pip-version-check --only-binary=:all: \
  "${TARGET_ARGS[@]}" --dest "$DEST" -r "$REQUIREMENTS"

if [ "$WITH_TORCH" = 0 ]; then
  rm -f "$DEST"/torch-*+placeholder-*.whl "$DEST"/torchvision-*+placeholder-*.whl
  if ls "$DEST"/torch-*.whl "$DEST"/torchvision-*.whl >/dev/null 2>&1; then
    die "$DEST holds a torch or torchvision wheel although --no-torch was given (left from an earlier collection?): remove it, or collect without --no-torch"
  fi
fi
if [ "$MMCV_FLAVOUR" = ops ]; then
  cp "$MMCV_WHEEL" "$DEST"/
  rm -f "$DEST"/mmcv_lite-*.whl   # setup_env.sh installs the compiled one when it is here
fi

cat > "$DEST/wheelhouse.txt" <<EOF
python_version=$PY_VERSION
platforms=${PLATFORMS[*]:-native}
mmcv=$MMCV_FLAVOUR
torch=$([ "$WITH_TORCH" = 1 ] && echo included || echo excluded)
commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
EOF
log "$(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
log "install offline with: bash tools/setup_env.sh --wheelhouse $DEST$([ "$WITH_TORCH" = 1 ] || echo ' --no-torch')$([ "$MMCV_FLAVOUR" = ops ] && echo ' --ops' || true)"
