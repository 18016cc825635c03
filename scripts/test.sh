#!/usr/bin/env bash
# Runs every test (unit, server, browser) after installing what they need: a virtualenv with nvdash and its
# test tools, and Debian's chromium for the browser tests. Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${NVDASH_VENV:-.venv}

if ! command -v chromium >/dev/null 2>&1; then
  echo "== installing chromium (Debian package) for the browser tests"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  python3 -m venv "$VENV"
fi
echo "== installing nvdash and its test tools into $VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[test]"

echo "== ruff"
"$VENV/bin/ruff" check nvdash tests benchmarks
echo "== mypy"
"$VENV/bin/mypy"

echo "== pytest"
set +e
"$VENV/bin/python" -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
