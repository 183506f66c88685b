#!/usr/bin/env bash
# The evidence run (projects/mst_research/tools/evidence.py): MST against its baselines on rendered animal
# silhouettes, the guided mask against the objects' pixel masks, and Mask R-CNN / SETR
# transfer, on a CPU. Sets up .venv (idempotent; mmcv with ops, which mmdet and mmseg need).
#   bash projects/mst_research/tools/run_evidence.sh [--quick] [--out DIR] [--only VARIANT:SEED]
#       [--skip-transfer] [--parts DIR_TO_COMMIT]
# A run cut short goes on where it stopped when started again with the same --out; with
# --parts, from the finished units committed there, on any machine (docs/evidence.md).
# Offline: MST_MM_WHEELHOUSE=DIR (see docs/install.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
bash "$ROOT/tools/setup_env.sh" --ops
cd "$ROOT"
exec "$ROOT/.venv/bin/python" projects/mst_research/tools/evidence.py "$@"
