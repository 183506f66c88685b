#!/usr/bin/env bash
# README Quick start, command 1: set up .venv (idempotent; mmcv-lite, so no compile, unless a
# compiled mmcv is already there), then the evidence run's demo (projects/mst_research/tools/evidence.py): real
# animal silhouettes rendered as object images, the DINO baseline and MST with the
# attention-guided mask pretrained (one seed), their k-NN, linear probe and guidance rows
# against raw pixels and a random network, curves and pictures in work_dirs/mst_demo.
# Extra arguments go to projects/mst_research/tools/evidence.py (e.g. --seeds 3, or --variants with all four).
# Offline: MST_MM_WHEELHOUSE=DIR (see docs/install.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" projects/mst_research/tools/evidence.py --out work_dirs/mst_demo --skip-transfer \
    --variants dino,mst_guided_mask --seeds 1 "$@"
