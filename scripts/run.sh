#!/usr/bin/env bash
# Installs nvdash into a virtualenv (once) and starts the dashboard server.
# Usage: bash scripts/run.sh [--port 8000] [--simulate dgx-h100] [any other nvdash option]
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${NVDASH_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import nvdash, bokeh, pynvml, psutil" >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip install -q -e .
fi
exec "$VENV/bin/python" -m nvdash "$@"
