# Sourced by run_demos.sh, test.sh and tensorboard.sh. Sets ROOT and PY, the python to run.
# Default: .venv, created on first use and holding the project as it is now (reinstalled only
# when pyproject.toml changed). With PYTHON=/path/to/python: that interpreter as it is, for a
# machine that already has PyTorch (conda, a container, a cluster module, matched to the GPU
# driver): no venv, nothing installed, only a check that it has what the scripts import.
# EXTRA_MODULES, set by the caller: what that check needs besides PROJECT_MODULES.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
# What the demos, the harness and the report import; each is also its pip name. orjson is left
# out on purpose (json stands in for it), and so is torch_tb_profiler (only TensorBoard needs it).
PROJECT_MODULES="torch torchvision numpy matplotlib tensorboard"
# Exits 3 after one line if the Python is too old, 4 after the names of the missing modules.
# find_spec finds a module without importing it (importing torch takes seconds). Plain syntax,
# so an old Python reaches the version message instead of a SyntaxError.
CHECK_PYTHON='
import sys
if sys.version_info[:2] < (3, 10):
    print("is Python %d.%d; 3.10 or newer is needed" % sys.version_info[:2])
    sys.exit(3)
import importlib.util
missing = [name for name in sys.argv[1:] if importlib.util.find_spec(name) is None]
print(" ".join(missing))
sys.exit(4 if missing else 0)
'

if [ -n "${PYTHON:-}" ]; then
    if ! PY="$(command -v "$PYTHON")"; then
        echo "error: PYTHON=$PYTHON: no such program" >&2
        exit 2
    fi
    [[ "$PY" == /* ]] || PY="$PWD/$PY"  # test.sh changes folder before it runs PY
    # shellcheck disable=SC2086  # the module lists are words on purpose
    found="$("$PY" -c "$CHECK_PYTHON" $PROJECT_MODULES ${EXTRA_MODULES:-} 2>&1)" \
        && status=0 || status=$?
    found="${found##*$'\n'}"  # the check's own line comes last, after any warning
    case "$status:$found" in
        0:) ;;
        3:*) echo "error: PYTHON=$PYTHON $found" >&2; exit 2 ;;
        4:*) echo "error: PYTHON=$PYTHON lacks ${found// /, }; install them with: $PYTHON -m" \
                  "pip install $found (or unset PYTHON to use .venv)" >&2; exit 2 ;;
        *) echo "error: PYTHON=$PYTHON did not run as a Python interpreter${found:+: $found}" >&2
           exit 2 ;;
    esac
    # Nothing is pip-installed here, so the project root goes on the path: the demo scripts run
    # as files from any folder and import `common` from it.
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    return 0
fi

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
