#!/usr/bin/env bash
# README Quick start, command 2: set up .venv (idempotent) with mmcv compiled with ops, which
# the mmdet / mmseg tests need (it replaces mmcv-lite if command 1 installed that), and run the
# whole test suite in two parallel workers (pytest-xdist; MST_MM_TEST_WORKERS=N for another
# count, 0 for one process). A test file's tests stay in one worker (--dist loadfile), so the
# module fixtures that train or install run once. Extra arguments go to pytest.
# Offline: MST_MM_WHEELHOUSE=DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh" --ops
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -n "${MST_MM_TEST_WORKERS:-2}" --dist loadfile "$@"
