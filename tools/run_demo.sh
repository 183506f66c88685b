#!/usr/bin/env bash
# README Quick start, command 1: set up .venv (idempotent), then tools/demo.py: bundled real
# textures, MST and its baselines pretrained, a k-NN table and pictures. Extra arguments
# go to tools/demo.py (e.g. --seeds 3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
"$PY" tools/demo.py --work-dir work_dirs/mst_demo "$@"
