# Sourced by run_demos.sh and test.sh: make sure .venv exists and holds the project as it is now.
# Sets PY to the virtual environment's python. Installs only when pyproject.toml changed.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "error: python3 >= 3.10 is needed (found: $(python3 --version 2>&1))" >&2
    exit 2
fi
if [ ! -x "$PY" ] || ! "$PY" -c 'import sys' 2>/dev/null; then
    echo "[setup] creating $VENV (first run)"
    rm -rf "$VENV"
    python3 -m venv "$VENV" || { echo "error: python3 -m venv failed" >&2; exit 2; }
fi
# The stamp names a hash of pyproject.toml, so editing the dependencies triggers a reinstall.
STAMP="$VENV/.installed-$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
    echo "[setup] installing the project and its dependencies into .venv (torch is large: a few minutes)"
    if ! "$PY" -m pip install --quiet -e "$ROOT[test]"; then
        echo "error: pip install into $VENV failed (see above)" >&2
        exit 2
    fi
    rm -f "$VENV"/.installed-*
    touch "$STAMP"
    echo "[setup] done"
fi
