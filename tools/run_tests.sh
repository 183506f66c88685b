#!/usr/bin/env bash
# README Quick start, command 2: set up .venv (idempotent) and run the whole test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
