#!/usr/bin/env bash
# The GPU check (projects/mst_research/tools/check_gpu.py --help) with the repository and mst_research on
# PYTHONPATH, so that it runs where nothing of ours is installed, e.g. an air-gapped node's own
# Python and CUDA torch (--wheels DIR installs the rest). PYTHON picks the interpreter; its
# default is python3 with --wheels (but .venv's for a dry run), else .venv/bin/python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
DEFAULT="$ROOT/.venv/bin/python"
[[ " $* " == *" --wheels"* && ( " $* " != *" --dry-run "* || ! -x $DEFAULT ) ]] && DEFAULT=python3
PYTHON="${PYTHON:-$DEFAULT}"
"$PYTHON" -c 'import torch' 2>/dev/null || { echo "check_gpu: error: '$PYTHON' is no Python that imports torch: set PYTHON to the one with the node's CUDA torch (docs/install.md)" >&2; exit 2; }
cd "$ROOT" && PYTHONPATH="$ROOT/projects/mst_research:$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" projects/mst_research/tools/check_gpu.py "$@"
