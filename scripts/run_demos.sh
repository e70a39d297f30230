#!/usr/bin/env bash
# Run the bad and fixed script of each demo and compare them. See --help.
# From .venv (created on first use), or PYTHON=/path/to/python: an interpreter that already has
# PyTorch, used as it is (scripts/_venv.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
exec "$PY" "$ROOT/scripts/run_demos.py" "$@"
