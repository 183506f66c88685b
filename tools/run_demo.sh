#!/usr/bin/env bash
# README Quick start, command 1: set up .venv (idempotent), write the bundled demo images
# and pretrain MST (tiny ViT, full recipe) on them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
"$PY" tools/prepare_demo_data.py --out data/mst_demo
"$PY" tools/train.py configs/mst_vit-tiny_demo.py --work-dir work_dirs/mst_demo "$@"
