#!/usr/bin/env bash
# README Quick start, command 1: set up .venv (idempotent; mmcv-lite, so no compile, unless a
# compiled mmcv is already there), then tools/demo.py: bundled real textures, MST and its
# baselines pretrained, a k-NN table and pictures. Extra arguments go to tools/demo.py
# (e.g. --seeds 3). Offline: MST_MM_WHEELHOUSE=DIR (see docs/install.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
"$PY" tools/demo.py --work-dir work_dirs/mst_demo "$@"
