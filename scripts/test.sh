#!/usr/bin/env bash
# Run the test suite from the project's .venv (created on first use). Arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"
exec "$PY" -m pytest "$@"
