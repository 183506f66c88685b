#!/usr/bin/env bash
# One command for the first GPU machine: everything this project has only proven on CPU.
#
#   bash tools/check_gpu.sh [REPORT]      (default: work_dirs/check_gpu/report.md)
#
# Uses the installed environment (.venv, or PYTHON=...; see docs/install.md, "GPU machines")
# and runs, each step's output in REPORT's folder and its verdict in REPORT:
#   1. pytest -m cuda tests/test_cuda.py: tools/train.py --amp (DeiT-S and Swin-T, float16
#      and bfloat16), an --amp run that saves, resumes and continues, tools/dist_train.sh on
#      1 and 2 GPUs with NCCL and SyncBN, the fused attention kernels, device-resident masks,
#      EMA and k-NN, Mask R-CNN and SETR on the GPU;
#   2. the GPU benchmark (tools/analysis/benchmark.py --device cuda --amp);
#   3. with DINO_DIR=/path/to/a/facebookresearch/dino/clone: our DeiT-S step against DINO's
#      at batch 64 with AMP on both sides (images/s, FLOP per image, and the
#      MFU when PEAK_TFLOPS gives the GPU's dense bf16/fp16 peak, e.g. 989 for an H100/H200).
# On a machine where torch sees no CUDA device it says so and exits 0.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
REPORT=${1:-work_dirs/check_gpu/report.md}
OUT=$(dirname "$REPORT")

if [ ! -x "$PYTHON" ]; then
    echo "check_gpu: no Python at $PYTHON: install first (bash tools/setup_env.sh --ops, or" \
         "PYTHON=/path/to/python-with-cuda-torch bash tools/setup_env.sh --no-torch --ops)." >&2
    exit 2
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "check_gpu: torch sees no CUDA device on this machine: nothing to check" \
         "(the CPU suite is bash tools/run_tests.sh)."
    exit 0
fi

mkdir -p "$OUT"
status=0
{
    echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | paste -sd ';' -)"
    echo "- torch: $("$PYTHON" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"
    echo
} > "$REPORT"

step() {  # step NAME LOGFILE COMMAND...: run, keep its output, record the verdict
    local name=$1 log=$2
    shift 2
    echo "== $name"
    local start=$SECONDS
    "$@" > "$OUT/$log" 2>&1
    local code=$?
    local verdict="passed"
    [ $code -ne 0 ] && verdict="FAILED (exit $code)" && status=1
    echo "- $name: $verdict in $((SECONDS - start)) s; output: $log" | tee -a "$REPORT"
}

tail_into_report() {  # tail_into_report LOGFILE LINES: the log's end as a code block
    { echo '```'; tail -n "$2" "$OUT/$1"; echo '```'; } >> "$REPORT"
}

step "pytest -m cuda" pytest_cuda.log \
    "$PYTHON" -m pytest -m cuda tests/test_cuda.py -rA -p no:cacheprovider
grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed" "$OUT/pytest_cuda.log" \
    | sed 's/^/    /' >> "$REPORT"
step "GPU benchmark" benchmark.log \
    "$PYTHON" tools/analysis/benchmark.py --device cuda --amp --out "$OUT/benchmark.json"
echo >> "$REPORT"
tail_into_report benchmark.log 40

if [ -n "${DINO_DIR:-}" ]; then
    step "GPU benchmark against DINO" reference.log \
        "$PYTHON" tools/analysis/benchmark.py --reference-dino "$DINO_DIR" --models deit-s \
        --batch-size 64 --device cuda --amp ${PEAK_TFLOPS:+--peak-tflops "$PEAK_TFLOPS"} \
        --out "$OUT/reference.json"
    tail_into_report reference.log 30
fi

echo "check_gpu: report in $REPORT"
exit $status
