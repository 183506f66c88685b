#!/usr/bin/env bash
# The GPU check (tools/check_gpu.py --help): this wrapper picks the interpreter and puts the
# repository and its research kit on PYTHONPATH, so that it also runs with a GPU node's own
# Python and CUDA torch, before anything of ours is installed there (--wheels DIR).
#   PYTHON=/path/to/python bash tools/check_gpu.sh [options]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# With --wheels, the node's python3 (its CUDA torch) unless PYTHON says otherwise; a dry run
# with wheels on this checkout's environment keeps .venv; else the checkout's .venv.
case " $* " in
    *" --wheels "*) [[ " $* " == *" --dry-run "* && -x .venv/bin/python ]] \
                    && DEFAULT="$ROOT/.venv/bin/python" || DEFAULT=python3 ;;
    *) DEFAULT="$ROOT/.venv/bin/python" ;;
esac
PYTHON="${PYTHON:-$DEFAULT}"
command -v "$PYTHON" >/dev/null 2>&1 || { echo "check_gpu: error: no Python at '$PYTHON': set PYTHON to the interpreter with the node's CUDA torch, or install with bash tools/setup_env.sh --no-torch (docs/install.md)" >&2; exit 2; }
"$PYTHON" -c 'import torch' 2>/dev/null || { echo "check_gpu: error: '$PYTHON' cannot import torch: set PYTHON to the interpreter that holds the node's CUDA torch" >&2; exit 2; }
export PYTHONPATH="$ROOT/projects/mst_research:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" tools/check_gpu.py "$@"
