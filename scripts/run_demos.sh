#!/usr/bin/env bash
# Run the bad and fixed script of each demo and compare them. See --help.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
exec "$PY" "$ROOT/scripts/run_demos.py" "$@"
