#!/usr/bin/env bash
# Collects the wheels that an air-gapped GPU node needs to run this project, for
# `bash projects/mst_research/tools/check_gpu.sh --wheels DIR` there. Run it on a machine that reaches the
# package index; the node has none.
#
#   bash tools/collect_device_wheels.sh [--dest DIR] [--python-version X.Y] [--max-mib N]
#
#   --dest DIR              where the wheels go (default: work_dirs/device_wheels, ignored by
#                           git: copy it to the node with the checkout)
#   --python-version X.Y    the GPU node's Python (default: 3.12)
#   --max-mib N             refuse a folder larger than N MiB (default: 60)
#
# The node is expected to have its own torch (CUDA), torchvision, numpy, timm, scipy,
# scikit-image, scikit-learn, matplotlib, opencv-python-headless, rich, regex, pyyaml and
# pytest (docs/install.md, "An air-gapped GPU node"). What it lacks is the OpenMMLab stack,
# which is pure Python except for two small compiled deps (pycocotools, shapely: cp312
# manylinux wheels), and a few small pure deps. mmcv comes as mmcv-lite: no compiled ops, so
# mmdet's Mask R-CNN and mmseg cannot run there (check_gpu.sh skips them and says so). Every
# version is pinned here so that the GPU run is reproducible; torch, torchvision and numpy are
# never collected (the node's own CUDA builds are used).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
DEST="$ROOT/work_dirs/device_wheels"
PY_VERSION=3.12
MAX_MIB=60

# NAME==VERSION, one a line: the stack (requirements/openmmlab.txt, mmcv-lite of
# requirements/mmcv.txt, animal-shape-mnist of requirements/runtime.txt) and the deps of
# theirs that the GPU machine lacks (each wheel's Requires-Dist, less what is there).
WHEELS=(
  mmengine==0.10.7 mmpretrain==1.2.0 mmcv-lite==2.1.0 mmdet==3.3.0 mmsegmentation==1.2.2
  animal-shape-mnist==0.39
  # mmengine, mmcv: config dicts and their formatting, coloured logs
  addict==2.4.0 yapf==0.43.0 platformdirs==4.14.8 termcolor==3.3.0
  # mmpretrain: imported by its dataset and model-index modules
  mat4py==0.6.0 modelindex==0.0.2 model-index==0.1.11 ordered-set==4.1.0
  importlib-metadata==10.2.0
  # mmdet: COCO masks and boxes (compiled), tables
  pycocotools==2.0.11 shapely==2.2.0 terminaltables==3.1.10
  # mmseg: `import mmseg.models` needs ftfy (regex is there); its tables
  ftfy==6.3.1 wcwidth==0.9.4 prettytable==3.18.0
  # mmengine's `mmpretrain::` config inheritance imports pkg_resources, gone in setuptools 82
  # (docs/install.md); the machine's own setuptools may be newer
  setuptools==81.0.0
)

log() { printf '[collect_device_wheels] %s\n' "$*" >&2; }
die() { printf '[collect_device_wheels] error: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --dest) need_value "$@"; DEST="$2"; shift ;;
    --python-version) need_value "$@"; PY_VERSION="$2"; shift ;;
    --max-mib) need_value "$@"; MAX_MIB="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see: bash tools/collect_device_wheels.sh --help)" ;;
  esac
  shift
done
[[ "$PY_VERSION" =~ ^3\.[0-9]+$ ]] || die "--python-version takes MAJOR.MINOR such as 3.12, not '$PY_VERSION'"
[[ "$MAX_MIB" =~ ^[0-9]+$ ]] || die "--max-mib takes a whole number of MiB, not '$MAX_MIB'"
"$PYTHON" -m pip --version >/dev/null 2>&1 \
  || die "no pip for '$PYTHON': set PYTHON to a Python that has pip (any version: pip only downloads)"

mkdir -p "$DEST" || die "cannot create --dest '$DEST'"
DEST="$(cd "$DEST" && pwd)"
# Two versions of one package stop the install there: start from an empty folder.
rm -f "$DEST"/*.whl "$DEST"/device_wheels.txt

# The platform tags that the compiled wheels are published under; pip matches each exactly.
PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
           manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$tag")
done
SPECS=()
for spec in "${WHEELS[@]}"; do SPECS+=("$spec"); done

log "downloading ${#SPECS[@]} wheels for CPython $PY_VERSION x86-64 into $DEST"
start=$SECONDS
# --no-deps: the list above is the whole set; resolving would pull torch and numpy.
if ! "$PYTHON" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
     --python-version "$PY_VERSION" --implementation cp "${PLATFORMS[@]}" \
     --dest "$DEST" "${SPECS[@]}"; then
  die "pip download failed (above); it needs the package index: run this where pip reaches it"
fi

count=$(ls "$DEST"/*.whl | wc -l)
[ "$count" -eq "${#SPECS[@]}" ] \
  || die "expected ${#SPECS[@]} wheels in $DEST, found $count: a package came as two files?"
bytes=$(cat "$DEST"/*.whl | wc -c)
mib=$(( (bytes + 1048575) / 1048576 ))
{
  echo "python_version=$PY_VERSION"
  echo "bytes=$bytes"
  echo "commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  printf 'wheel=%s\n' "${SPECS[@]}"
} > "$DEST/device_wheels.txt"
if [ "$mib" -gt "$MAX_MIB" ]; then
  log "error: $count wheels, $mib MiB in $DEST, over --max-mib $MAX_MIB: the device call" \
      "carries 64 MiB with the repository; drop a wheel from WHEELS or raise --max-mib"
  exit 1
fi
log "$count wheels, $bytes bytes ($mib MiB) in $DEST, in $((SECONDS - start)) s"
echo "$mib MiB"
log "on the GPU node: bash projects/mst_research/tools/check_gpu.sh --wheels ${DEST#"$ROOT"/} (copy that folder there)"
