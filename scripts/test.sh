#!/usr/bin/env bash
# Run the test suite; arguments go to pytest. From .venv (created on first use), or
# PYTHON=/path/to/python: an interpreter that already has PyTorch, used as it is (scripts/_venv.sh).
# On a GPU machine: PYTHON=python3 ./scripts/test.sh -m cuda (every pair, smoke sizes, on the GPU).
set -euo pipefail
EXTRA_MODULES="pytest"  # checked with PYTHON=...; .venv has it from the [test] extra
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"
exec "$PY" -m pytest "$@"
