#!/usr/bin/env bash
# TensorBoard with the PyTorch Profiler plugin on traces/ (or --logdir DIR), from the project's .venv.
# Usage: ./scripts/tensorboard.sh [--port N] [--logdir DIR]
# Traces the harness writes are ready for the plugin; for traces from elsewhere, run
# `python -m common.tensorboard_compat DIR` first (README.md, "Viewing traces").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
PORT=6006
LOGDIR="$ROOT/traces"
while [ $# -gt 0 ]; do
    case "$1" in
        --port) [[ "${2:-}" =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] && [ "$2" -le 65535 ] \
                    || { echo "error: --port needs a number from 1 to 65535" >&2; exit 2; }
                PORT="$2"; shift 2 ;;
        --logdir) [ -d "${2:-}" ] || { echo "error: --logdir needs an existing folder" >&2; exit 2; }
                  LOGDIR="$2"; shift 2 ;;
        -h|--help) sed -n '2,5p' "$0" | sed 's/^# //'; exit 0 ;;
        *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$(find "$LOGDIR" -name '*.pt.trace.json*' -print -quit 2>/dev/null)" ]; then
    echo "note: no traces under $LOGDIR yet; ./scripts/run_demos.sh writes them (TensorBoard" \
         "picks up new run folders while it runs)"
fi
echo "TensorBoard on http://localhost:$PORT/#pytorch_profiler (logdir $LOGDIR); Ctrl-C stops it"
exec "$VENV/bin/tensorboard" --logdir "$LOGDIR" --port "$PORT"
