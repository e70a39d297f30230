#!/usr/bin/env bash
# TensorBoard with the PyTorch Profiler plugin on traces/ (or --logdir DIR), from .venv
# (or from PYTHON=/path/to/python, which needs tensorboard and torch_tb_profiler).
# Usage: ./scripts/tensorboard.sh [--port N] [--logdir DIR]
# Traces the harness writes are ready for the plugin; for traces from elsewhere, run
# `python -m common.tensorboard_compat DIR` first (README.md, "Viewing traces").
set -euo pipefail
PORT=6006
LOGDIR=""
# Flags first: a typo or --help answers at once, before any .venv is created or checked.
while [ $# -gt 0 ]; do
    case "$1" in
        # At most 5 digits: a longer number would make `[` print its own error as a second line.
        --port) [[ "${2:-}" =~ ^[0-9]{1,5}$ ]] && [ "$2" -ge 1 ] && [ "$2" -le 65535 ] \
                    || { echo "error: --port needs a number from 1 to 65535" >&2; exit 2; }
                PORT="$2"; shift 2 ;;
        --logdir) [ -d "${2:-}" ] || { echo "error: --logdir needs an existing folder" >&2; exit 2; }
                  LOGDIR="$2"; shift 2 ;;
        -h|--help) sed -n '2,6p' "$0" | sed 's/^# //'; exit 0 ;;
        *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
EXTRA_MODULES="torch_tb_profiler"  # checked with PYTHON=...; TensorBoard is no use here without it
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
LOGDIR="${LOGDIR:-$ROOT/traces}"
if [ -z "$(find "$LOGDIR" -name '*.pt.trace.json*' -print -quit 2>/dev/null)" ]; then
    echo "note: no traces under $LOGDIR yet; ./scripts/run_demos.sh writes them (TensorBoard" \
         "picks up new run folders while it runs)"
fi
echo "TensorBoard on http://localhost:$PORT/#pytorch_profiler (logdir $LOGDIR); Ctrl-C stops it"
# The plugin parses each run in a process of its own, by default spawned: a fresh Python that
# imports TensorBoard and the plugin before it reads a byte. Forked from the server, the 42
# committed H100 runs load in 142 s instead of 182 s on 2 cores. Linux only: macOS frameworks
# are not safe to fork.
if [ "$(uname -s)" = Linux ]; then
    export TORCH_PROFILER_START_METHOD="${TORCH_PROFILER_START_METHOD:-fork}"
fi
# tensorboard's own entry point (its console script runs tensorboard.main:run_main), so that
# PYTHON=... works where no `tensorboard` command sits beside that python.
exec "$PY" -m tensorboard.main --logdir "$LOGDIR" --port "$PORT"
