#!/usr/bin/env bash
# One command for a GPU machine: everything this project has only proven on CPU, in under
# 9 minutes on one H100, with one markdown report.
#
#   bash tools/check_gpu.sh [options] [REPORT]
#
#   --report FILE     the report (default: work_dirs/check_gpu/report.md); every step's log
#                     goes into its folder
#   --wheels DIR      install the stack from DIR first (tools/collect_device_wheels.sh):
#                     `pip install --no-index --no-deps --target` into a folder outside the
#                     repository, put on PYTHONPATH, so that the machine's own torch, numpy
#                     and timm are used (a lent GPU machine has no network and no OpenMMLab
#                     package). Without it: PYTHON, or .venv/bin/python
#   --dino DIR        a facebookresearch/dino clone for step 3 (default: $DINO_DIR, else
#                     work_dirs/dino when it holds one)
#   --budget SECONDS  the whole check's time (default: $CHECK_GPU_BUDGET_S or 520, so that
#                     it ends inside 9 minutes with its report); every step has its own
#                     limit, cut to what is left
#   --peak-tflops N   the GPU's dense float16/bfloat16 peak for the MFU (default:
#                     $PEAK_TFLOPS, else 989 for an H100 SXM or H200, 756 for an H100 PCIe)
#   --copy-to DIR     at the end, copy the report and a .tgz of the logs (no checkpoints)
#                     into DIR (on a lent machine: $OUT, which returns at most 8 files)
#   --dry-run         (or CHECK_GPU_DRY_RUN=1) every step's CPU part at tiny sizes, on a
#                     machine without CUDA: exercises the script, not the GPU; its figures
#                     mean nothing
#
# Steps, each with its own time limit (`timeout`) and its elapsed time in the report
# (limits on a GPU: 90, 90 + 180, 150, 75 and 150 s, each cut to what the budget has left):
#   1. the stack: installed from --wheels (or the environment as it is); versions, and
#      whether mmcv has its compiled ops (mmcv-lite from wheels has none);
#   2. pytest -m cuda tests/test_cuda.py, less what does not fit the budget, in two runs:
#      the in-process tests (the fused attention kernels, device-resident masks, EMA and
#      k-NN, Mask R-CNN and SETR: these need mmcv's compiled ops, so with mmcv-lite they
#      skip, and the report says so), then the tools' runs: train.py --amp for DeiT-S in
#      bfloat16 and Swin-T in float16 (the other two pairs are deselected,
#      CHECK_GPU_ALL_CUDA_TESTS=1 keeps them), save/resume/continue, dist_train.sh with
#      NCCL and SyncBN on 1 GPU;
#   3. our DeiT-S step (DINO mode and MST, in bfloat16 and float16 autocast) against DINO's
#      own step (main_dino.py's pieces, float16 autocast as DINO trains) at batch 128 per
#      GPU: images/s, peak GPU memory, MFU (tools/analysis/benchmark.py --reference-dino);
#   4. the data loader's images/s with 8 and 15 workers at batch 128 against the step's
#      (tools/analysis/benchmark_loader.py);
#   5. a short learning run: the evidence recipe (MST-guided, seed 0, the k-NN probe every
#      epoch; configs/mst/mst_vit-tiny-p4_1xb64-coslr-6e_animals.py through tools/train.py)
#      on the GPU, against the CPU figures in docs/results/evidence_summary.json.
# On a machine where torch sees no CUDA device (and no --dry-run) it says so and exits 0.
# Exit status: 0 every step passed or was not available, 1 a step failed or ran out of
# time, 2 bad input.
#
# A lent GPU machine (docs/install.md, "GPU machines"), prepared here, where pip reaches
# the package index:
#   bash tools/collect_device_wheels.sh          # -> work_dirs/device_wheels, about 15 MiB
#   mkdir -p work_dirs/dino && cp /path/to/dino/{main_dino,utils,vision_transformer}.py \
#       /path/to/dino/LICENSE work_dirs/dino/    # or: git clone .../facebookresearch/dino
#   bash tools/check_gpu.sh --dry-run --wheels work_dirs/device_wheels   # the plumbing, here
# then through the device tool, one call (timeout_s 600), carrying both ignored folders:
#   command: bash tools/check_gpu.sh --wheels work_dirs/device_wheels --copy-to $OUT
#   carry:   ["work_dirs/device_wheels", "work_dirs/dino"]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2

die() { printf 'check_gpu: error: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,57p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }

REPORT=work_dirs/check_gpu/report.md
WHEELS=""
DINO="${DINO_DIR:-}"
BUDGET="${CHECK_GPU_BUDGET_S:-520}"
PEAK="${PEAK_TFLOPS:-}"
COPY_TO=""
DRY_RUN="${CHECK_GPU_DRY_RUN:-0}"
while [ $# -gt 0 ]; do
    case "$1" in
        --report) need_value "$@"; REPORT="$2"; shift ;;
        --wheels) need_value "$@"; WHEELS="$2"; shift ;;
        --dino) need_value "$@"; DINO="$2"; shift ;;
        --budget) need_value "$@"; BUDGET="$2"; shift ;;
        --peak-tflops) need_value "$@"; PEAK="$2"; shift ;;
        --copy-to) need_value "$@"; COPY_TO="$2"; shift ;;
        --dry-run) DRY_RUN=1 ;;
        -h|--help) usage; exit 0 ;;
        -*) die "unknown option '$1' (see: bash tools/check_gpu.sh --help)" ;;
        *) REPORT="$1" ;;   # the positional REPORT of earlier versions
    esac
    shift
done
[[ "$BUDGET" =~ ^[0-9]+$ ]] && [ "$BUDGET" -ge 60 ] \
    || die "--budget takes whole seconds, at least 60, not '$BUDGET'"
[ -z "$PEAK" ] || [[ "$PEAK" =~ ^[0-9]+(\.[0-9]+)?$ ]] \
    || die "--peak-tflops takes a number of TFLOP/s such as 989, not '$PEAK'"
case "$DRY_RUN" in 0|1) ;; *) die "CHECK_GPU_DRY_RUN takes 0 or 1, not '$DRY_RUN'" ;; esac
if [ -n "$WHEELS" ]; then
    [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1 \
        || die "--wheels '$WHEELS' holds no wheels: collect them with bash tools/collect_device_wheels.sh (where pip reaches the index) and carry that folder"
    WHEELS="$(cd "$WHEELS" && pwd)"
fi
DINO_FILES=(main_dino.py utils.py vision_transformer.py)
if [ -n "$DINO" ]; then
    for f in "${DINO_FILES[@]}"; do
        [ -f "$DINO/$f" ] || die "--dino '$DINO' lacks $f: copy main_dino.py, utils.py and vision_transformer.py of a facebookresearch/dino clone there (see --help)"
    done
elif [ -f work_dirs/dino/main_dino.py ]; then
    DINO=work_dirs/dino
fi
[ -z "$DINO" ] || DINO="$(cd "$DINO" && pwd)"

# With --wheels the stack goes on top of the interpreter's own packages (its CUDA torch).
# Not a venv: the GPU machine's python3 is itself a venv's, and a venv made from it with
# --system-site-packages would see the base interpreter's packages, without torch.
if [ -n "$WHEELS" ]; then
    PYTHON="${PYTHON:-$( [ "$DRY_RUN" = 1 ] && [ -x .venv/bin/python ] && echo "$ROOT/.venv/bin/python" || echo python3)}"
else
    PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
fi
command -v "$PYTHON" >/dev/null 2>&1 || die "no Python at '$PYTHON': install first (bash tools/setup_env.sh --no-torch, see docs/install.md), give --wheels DIR, or set PYTHON=/path/to/python-with-cuda-torch"
"$PYTHON" -c 'import torch' 2>/dev/null \
    || die "'$PYTHON' cannot import torch: set PYTHON to the interpreter that holds the machine's CUDA torch"

if [ "$DRY_RUN" = 1 ]; then
    DEVICE=cpu
elif "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    DEVICE=cuda
else
    echo "check_gpu: torch sees no CUDA device on this machine: nothing to check" \
         "(the CPU suite is bash tools/run_tests.sh; --dry-run exercises this script)."
    exit 0
fi

LOGDIR="$(mkdir -p "$(dirname "$REPORT")" && cd "$(dirname "$REPORT")" && pwd)" \
    || die "cannot create the report's folder for '$REPORT'"
REPORT="$LOGDIR/$(basename "$REPORT")"
SCRATCH="${CHECK_GPU_SCRATCH:-${TMPDIR:-/tmp}/mst_mm_check_gpu}"   # data, stack: not logs
mkdir -p "$SCRATCH" || die "cannot create the scratch folder '$SCRATCH' (CHECK_GPU_SCRATCH)"
START=$SECONDS
status=0
SUMMARY=()
# This script's own files only (the report's folder may hold others): no stale log from an
# earlier check may pass for this one's.
for f in install.log stack.txt pytest_cuda_quick.log pytest_cuda_runs.log reference.log \
         reference.json loader.log loader.json learning_data.log learning_config.log \
         learning_run.log; do
    rm -f "$LOGDIR/$f"
done
rm -rf "$LOGDIR/learning_run"

if [ "$DEVICE" = cuda ] && [ -z "$PEAK" ]; then
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)" in
        *H100*PCIe*) PEAK=756 ;;   # NVIDIA's dense FP16/BF16 tensor-core peaks
        *H100*|*H200*) PEAK=989 ;;
    esac
fi

say() { printf '%s\n' "$*" >> "$REPORT"; }
code_block() {  # code_block FILE [LINES]: the file's end as a fenced block
    say '```'
    if [ -f "$1" ]; then tail -n "${2:-40}" "$1" >> "$REPORT"; else say "(no $1)"; fi
    say '```'
}

# run_step NAME LIMIT LOG COMMAND...: the command under `timeout`, its output in LOG, its
# verdict and time in the report and the summary. The limit is cut to the budget left, so
# that the whole check ends in time however the steps before went.
run_step() {
    local name=$1 limit=$2 log=$3
    shift 3
    local left=$(( BUDGET - (SECONDS - START) - 10 ))
    if [ "$left" -lt 20 ]; then
        say "- **not run**: the budget of $BUDGET s is spent"
        SUMMARY+=("| $name | not run (budget spent) | 0 | 0 |")
        status=1
        return 1
    fi
    [ "$limit" -le "$left" ] || limit=$left
    echo "== $name (limit $limit s)"
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" > "$LOGDIR/$log" 2>&1
    local code=$?
    local elapsed=$((SECONDS - t0)) verdict
    case $code in
        0) verdict=passed ;;
        124|137) verdict="TIMED OUT (limit $limit s)"; status=1 ;;
        *) verdict="FAILED (exit $code)"; status=1 ;;
    esac
    say "- $verdict in $elapsed s (limit $limit s); log: $log"
    SUMMARY+=("| $name | $verdict | $elapsed | $limit |")
    echo "   $verdict in $elapsed s"
    return $code
}

# Limits per step: GPU (expected time in docs/install.md), or the dry run's.
if [ "$DRY_RUN" = 1 ]; then
    LIMIT_INSTALL=60 LIMIT_PYTEST_QUICK=90 LIMIT_PYTEST_RUNS=90 LIMIT_REFERENCE=120
    LIMIT_LOADER=60 LIMIT_LEARN=120
else
    LIMIT_INSTALL=90 LIMIT_PYTEST_QUICK=90 LIMIT_PYTEST_RUNS=180 LIMIT_REFERENCE=150
    LIMIT_LOADER=75 LIMIT_LEARN=150
fi

{
    echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    if [ "$DRY_RUN" = 1 ]; then
        echo "- mode: **dry run** on the CPU at tiny sizes: it exercises the script; no figure below means anything"
    else
        echo "- mode: GPU"
    fi
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo 'unknown (no git here)')"
    gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | paste -sd ';' -)"
    echo "- GPU: ${gpu:-none seen by nvidia-smi}; torch device: $DEVICE"
    # getconf, not nproc: nproc reports OMP_NUM_THREADS when that is set
    echo "- CPU cores: $(getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?'); budget: $BUDGET s; peak for the MFU: ${PEAK:-unknown} TFLOP/s"
    echo
} > "$REPORT"

# ------------------------------------------------------------------------ 1. the stack
say "## 1. Stack"
say
if [ -n "$WHEELS" ]; then
    SITE="$SCRATCH/site"
    rm -rf "$SITE" && mkdir -p "$SITE"
    # The wheels that this interpreter can install: all of them on the GPU machine; in a
    # dry run on another Python, the compiled ones (cp312) are left out and named.
    "$PYTHON" - "$WHEELS" > "$SCRATCH/wheels.txt" 2> "$SCRATCH/wheels_left_out.txt" <<'PY'
import glob, os, sys
from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename
supported = set(sys_tags())
for path in sorted(glob.glob(os.path.join(sys.argv[1], '*.whl'))):
    fits = supported & set(parse_wheel_filename(os.path.basename(path))[3])
    print(path, file=sys.stdout if fits else sys.stderr)
PY
    mapfile -t FIT < "$SCRATCH/wheels.txt"
    say "Installing ${#FIT[@]} wheels from ${WHEELS#"$ROOT"/} into $SITE, on PYTHONPATH after the repository."
    if [ -s "$SCRATCH/wheels_left_out.txt" ]; then
        say "Left out (not for this Python): $(xargs -n1 basename < "$SCRATCH/wheels_left_out.txt" | paste -sd ' ' -)"
    fi
    run_step "install wheels" "$LIMIT_INSTALL" install.log \
        "$PYTHON" -m pip install --disable-pip-version-check --no-index --no-deps --no-compile \
        --no-cache-dir --target "$SITE" "${FIT[@]}"
    # mmsegmentation and model-index install a top-level `tests` package; the repository's
    # tests/ must win, and nothing of ours needs theirs.
    rm -rf "$SITE/tests"
    export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
    say "The environment as it is: $PYTHON."
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
timeout -k 5 60 "$PYTHON" -W ignore - > "$LOGDIR/stack.txt" 2>&1 <<'PY'
import importlib, importlib.util, os, platform, sys
print(f'- Python {platform.python_version()} at {sys.executable}')
for name in ('torch', 'torchvision', 'numpy', 'mmengine', 'mmcv', 'mmpretrain', 'mmdet',
             'mmseg', 'timm', 'mst_mm'):
    try:
        module = importlib.import_module(name)
        folder = os.path.dirname(os.path.dirname(module.__file__))
        print(f'- {name} {getattr(module, "__version__", "")} (from {folder})')
    except Exception as error:   # noqa: BLE001 - the report names whatever is missing
        print(f'- {name}: not importable ({type(error).__name__}: {error})')
# mmcv-lite has the mmcv package without its compiled extension
ops = importlib.util.find_spec('mmcv') is not None and any(
    f.startswith('_ext') for f in os.listdir(os.path.dirname(importlib.util.find_spec('mmcv').origin)))
print(f'- mmcv compiled ops: {"yes" if ops else "no (mmcv-lite): Mask R-CNN and SETR skip"}')
import torch
print(f'- CUDA: {torch.version.cuda}, available: {torch.cuda.is_available()}')
PY
cat "$LOGDIR/stack.txt" >> "$REPORT"
say

# The learning run's data (10,000 images, CPU work) is written in the background while the
# tests and the benchmark use the GPU; step 5 waits for it.
DATA="$SCRATCH/animal_shapes"
timeout -k 5 240 "$PYTHON" - "$DATA" "$DRY_RUN" > "$LOGDIR/learning_data.log" 2>&1 <<'PY' &
import gzip, os, pickle, sys
import numpy as np
from mst_mm.evidence.animal_shapes import load_silhouettes, write_object_images
data, dry_run = sys.argv[1], sys.argv[2] == '1'
package = None
if dry_run:   # 4 real silhouettes a class, laid out as the package's files
    images, labels = load_silhouettes()
    keep = np.concatenate([np.flatnonzero(labels == c)[:4] for c in range(10)])
    package = os.path.join(data, 'package')
    os.makedirs(os.path.join(package, 'data', 'Animal Shape'), exist_ok=True)
    for name, array in (('animal_data_version_3.gz', images[keep]),
                        ('animal_label_version_3.gz', labels[keep])):
        with gzip.open(os.path.join(package, 'data', 'Animal Shape', name), 'wb') as f:
            pickle.dump(array, f)
written = write_object_images(os.path.join(data, 'objects'), package_dir=package,
                              **(dict(test_per_class=1) if dry_run else {}))
print(f"{written['train']} training and {written['test']} held-out animal images")
PY
DATA_PID=$!

# ------------------------------------------------------------------ 2. the cuda tests
say "## 2. CUDA tests: pytest -m cuda tests/test_cuda.py"
say
# Two runs: the in-process tests first (seconds each), then the tools' runs (a process, a
# model build and checkpoints each), so that a slow tool run cannot crowd out the kernels'.
# -k splits by name, so a test added to tests/test_cuda.py lands in one of the two.
PYTEST_ARGS=(-m cuda tests/test_cuda.py -v -rA -p no:cacheprovider --durations=0)
TOOL_RUNS="train_py or dist_train"
RUN_DESELECT=()
if [ "${CHECK_GPU_ALL_CUDA_TESTS:-0}" != 1 ]; then
    # One train.py --amp run per backbone and per dtype fits the budget.
    for id in 'float16-deit-s' 'bfloat16-swin-t'; do
        RUN_DESELECT+=(--deselect "tests/test_cuda.py::test_train_py_amp[$id]")
    done
    say "Deselected to fit the budget: test_train_py_amp[float16-deit-s], [bfloat16-swin-t] (CHECK_GPU_ALL_CUDA_TESTS=1 keeps them)."
    say
fi
pytest_summary() {  # pytest_summary LOG: its tests as they ran, the skip reasons, the counts
    say '```'
    grep -E "^tests/test_cuda.py::.* (PASSED|FAILED|SKIPPED|ERROR|XFAIL)" "$LOGDIR/$1" \
        | sed 's/ *\[ *[0-9]*%\]$//' >> "$REPORT"
    grep -E "^(SKIPPED|FAILED|ERROR) |^=+ .*(passed|failed|skipped|error|deselected).* =+$" \
        "$LOGDIR/$1" >> "$REPORT"
    say '```'
    say "Slowest phases (seconds; for sizing the budget):"
    say '```'
    grep -E "^[0-9.]+s (call|setup|teardown) " "$LOGDIR/$1" | head -n 8 >> "$REPORT" \
        || say "(none over 0.005 s)"
    say '```'
}
say "In-process: fused attention kernels, device-resident masks, EMA and k-NN, Mask R-CNN, SETR."
run_step "cuda tests: in-process" "$LIMIT_PYTEST_QUICK" pytest_cuda_quick.log \
    "$PYTHON" -m pytest "${PYTEST_ARGS[@]}" -k "not ($TOOL_RUNS)"
pytest_summary pytest_cuda_quick.log
say
say "The tools' runs: train.py --amp, save/resume/continue, dist_train.sh with NCCL and SyncBN."
run_step "cuda tests: tool runs" "$LIMIT_PYTEST_RUNS" pytest_cuda_runs.log \
    "$PYTHON" -m pytest "${PYTEST_ARGS[@]}" -k "$TOOL_RUNS" "${RUN_DESELECT[@]}"
pytest_summary pytest_cuda_runs.log
if ! grep -q "mmcv compiled ops: yes" "$LOGDIR/stack.txt"; then
    say "Mask R-CNN and SETR on the GPU did not run: mmcv here has no compiled ops (mmcv-lite)."
    say "They need mmcv 2.1.0 built with CUDA ops against this torch (docs/install.md)."
fi
say

# ------------------------------------------------------- 3. our step against DINO's
say "## 3. DeiT-S step against DINO's reference step"
say
REFERENCE_JSON="$LOGDIR/reference.json"
rm -f "$REFERENCE_JSON"
if [ -z "$DINO" ]; then
    say "- **not run**: no DINO clone. Copy main_dino.py, utils.py and vision_transformer.py of"
    say "  facebookresearch/dino into work_dirs/dino (carry it to a lent machine), or pass --dino DIR."
    SUMMARY+=("| DINO reference step | not run (no --dino) | 0 | 0 |")
else
    if [ "$DRY_RUN" = 1 ]; then
        BENCH_ARGS=(--models tiny --device cpu --no-amp --batch-size 2 --repeats 1 --warmup 0
                    --threads 1)
    else
        BENCH_ARGS=(--models deit-s --device cuda --amp --dtypes bfloat16 float16
                    --batch-size 128 --repeats 5 --warmup 2 ${PEAK:+--peak-tflops "$PEAK"})
    fi
    say "DINO float16 autocast (its default); ours bfloat16 and float16; same synthetic crops."
    run_step "DINO reference step" "$LIMIT_REFERENCE" reference.log \
        "$PYTHON" tools/analysis/benchmark.py --reference-dino "$DINO" "${BENCH_ARGS[@]}" \
        --out "$REFERENCE_JSON"
    say
    sed -n '/^\[.*\] batch /,$p' "$LOGDIR/reference.log" | grep -v '^docs/benchmarks.md row\|^written to' \
        | grep -v '^.*: | [0-9]* |' >> "$REPORT"
fi
say

# ------------------------------------------------------------ 4. the data loader
say "## 4. Data loader against the step"
say
LOADER_JSON="$LOGDIR/loader.json"
rm -f "$LOADER_JSON"
# CHECK_GPU_LOADER_TOOL: a stand-in for the dry-run test, which times no real loader.
LOADER_TOOL="${CHECK_GPU_LOADER_TOOL:-tools/analysis/benchmark_loader.py}"
if [ "$DRY_RUN" = 1 ]; then LOADER_ARGS=(--workers 1 --batch-size 4); else
    LOADER_ARGS=(--workers 8 15 --batch-size 128); fi
# Its warnings (mmcv-lite, pkg_resources) would bury its table in the report.
run_step "data loader" "$LIMIT_LOADER" loader.log env PYTHONWARNINGS=ignore \
    "$PYTHON" "$LOADER_TOOL" "${LOADER_ARGS[@]}" --out "$LOADER_JSON"
code_block "$LOGDIR/loader.log" 25
# The loader's images/s with each number of workers against the steps' (step 3's JSON).
"$PYTHON" - "$LOADER_JSON" "$REFERENCE_JSON" >> "$REPORT" 2>&1 <<'PY'
import json, os, sys
loader_path, reference_path = sys.argv[1:]
steps = {}
if os.path.isfile(reference_path):
    for model in json.load(open(reference_path))['models'].values():
        steps = dict(model['images_per_second'])
if not os.path.isfile(loader_path):
    print('- no loader figures')
    sys.exit(0)
for row in json.load(open(loader_path))['loader']:
    line = f'- loader, {row["workers"]} workers: {row["images_per_second"]:.1f} images/s'
    if steps:
        line += '; ' + ', '.join(f'{row["images_per_second"] / s:.2f} x the {name} step'
                                 for name, s in steps.items())
    print(line)
PY
say

# -------------------------------------------------------------- 5. a learning run
say "## 5. Learning run: the evidence recipe with the k-NN probe"
say
LEARN_DIR="$LOGDIR/learning_run"
rm -rf "$LEARN_DIR"
if [ "$DRY_RUN" = 1 ]; then EPOCHS=1 BATCH=8 WORKERS=0; else
    EPOCHS="${CHECK_GPU_EPOCHS:-6}" BATCH=64 WORKERS=8; fi
wait "$DATA_PID"
data_code=$?
if [ "$data_code" -ne 0 ]; then
    say "- the data could not be written (exit $data_code):"
    code_block "$LOGDIR/learning_data.log" 15
    SUMMARY+=("| learning run | FAILED (data, exit $data_code) | 0 | 0 |")
    status=1
else
    say "MST-guided, seed 0, $EPOCHS epoch(s), batch $BATCH, $(tail -n1 "$LOGDIR/learning_data.log")."
    # The row's config as tools/evidence.py makes it (data root, seed, schedule, k-NN probe).
    "$PYTHON" - "$DATA" "$LEARN_DIR" "$EPOCHS" "$BATCH" "$WORKERS" > "$LOGDIR/learning_config.log" 2>&1 <<'PY'
import importlib.util, os, sys
data, work_dir, epochs, batch, workers = sys.argv[1:]
spec = importlib.util.spec_from_file_location('evidence', 'tools/evidence.py')
evidence = importlib.util.module_from_spec(spec)
spec.loader.exec_module(evidence)
cfg = evidence.pretrain_config(evidence.VIT_CONFIG, 'mst_guided_mask', 0,
                               dict(epochs=int(epochs), batch_size=int(batch)), data, work_dir)
cfg.train_dataloader.num_workers = int(workers)
cfg.train_dataloader.persistent_workers = int(workers) > 0
os.makedirs(work_dir, exist_ok=True)
cfg.dump(os.path.join(work_dir, 'run_config.py'))
PY
    if [ ! -f "$LEARN_DIR/run_config.py" ]; then
        say "- the run's config could not be made (tools/evidence.py's pretrain_config):"
        code_block "$LOGDIR/learning_config.log" 15
    fi
    run_step "learning run" "$LIMIT_LEARN" learning_run.log \
        "$PYTHON" tools/train.py "$LEARN_DIR/run_config.py" --work-dir "$LEARN_DIR"
    # The precision the config's optim_wrapper chose on this device (its log line, if any).
    precision="$(grep -ohE "Training in (mixed precision, [a-z0-9]+|float32)" \
        "$LOGDIR/learning_run.log" | head -n1)"
    say "- ${precision:-Training in float32 (the config asks for nothing else)}"
    # What was logged, also after a timeout: the probe by epoch, the loss, the speed.
    "$PYTHON" -W ignore - "$LEARN_DIR" "$BATCH" "$EPOCHS" >> "$REPORT" 2>&1 <<'PY'
import json, statistics, sys
from mst_mm.visualization import read_scalars
work_dir, batch, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    rows = read_scalars(work_dir)
except FileNotFoundError as error:
    print(f'- nothing logged: {error}')
    sys.exit(0)
probe = [r['knn_probe_top1_k20'] for r in rows if 'knn_probe_top1_k20' in r]
losses = [r['loss_dino'] for r in rows if 'loss_dino' in r]
times = [r['time'] for r in rows if 'time' in r]
print(f'- k-NN probe (top-1 %, k = 20) after epochs 0..{len(probe) - 1}: '
      + ', '.join(f'{v:.2f}' for v in probe))
if losses:
    print(f'- loss_dino: first {losses[0]:.3f}, last {losses[-1]:.3f} ({len(losses)} iterations)')
if times:
    step = statistics.median(times)
    print(f'- {step * 1000:.1f} ms per iteration (median), {batch / step:.0f} images/s')
cpu = json.load(open('docs/results/evidence_summary.json'))
row = 'mst_guided_mask'
for name, key, gpu in (('k-NN', 'knn_top1', probe[-1] if probe else None),
                       ('last loss_dino', 'last_loss_dino', losses[-1] if losses else None)):
    values = cpu[key][row]
    mean, std = statistics.mean(values), statistics.stdev(values)
    where = ''
    if gpu is not None and len(probe) - 1 == epochs == 6:
        where = f'; this run: {gpu:.3f}, {(gpu - mean) / std:+.1f} std from the CPU mean'
    print(f'- CPU {name}, {row}, 6 epochs, {len(values)} seeds (docs/results/evidence_summary'
          f'.json): {mean:.3f} +- {std:.3f}{where}')
if len(probe) - 1 != 6:
    print(f'- epochs probed: {len(probe) - 1}; the CPU figures are for the full 6-epoch '
          'schedule (docs/evidence.md has one seed\'s curve by epoch)')
PY
fi
say

# ------------------------------------------------------------------------- summary
{
    echo "## Summary"
    echo
    echo "| step | verdict | seconds | limit (s) |"
    echo "| --- | --- | --- | --- |"
    printf '%s\n' "${SUMMARY[@]}"
    echo
    echo "Total: $((SECONDS - START)) s of a budget of $BUDGET s; exit status $status."
} >> "$REPORT"

if [ -n "$COPY_TO" ]; then
    mkdir -p "$COPY_TO" && cp "$REPORT" "$COPY_TO/" \
        && tar -czf "$COPY_TO/check_gpu_logs.tgz" --exclude='*.pth' -C "$LOGDIR" . \
        || { echo "check_gpu: could not copy the report to $COPY_TO" >&2; status=1; }
fi
echo "check_gpu: report in $REPORT ($((SECONDS - START)) s)"
exit $status
