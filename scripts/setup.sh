#!/usr/bin/env bash
# Everything DaisyChain and its tests need, on a fresh machine: a venv in .venv with the
# package and its test extra, Debian's Chromium for the browser tests and Debian's nodejs for
# the JS mirror tests, and the WebAssembly kernels built from their .wat text. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# torch first, pinned to the local CPU build: an open range would pull a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || \
  .venv/bin/pip install -q torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/pip install -q -e ".[test]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import daisychain, torch, aiortc, playwright" # fail loudly if incomplete
# Debian packages the tests need: Chromium (browser tests) and Node.js (the JS mirror tests,
# which fail without node; npm for the WebAssembly build below).
apt_install() {
  if [ "$(id -u)" = 0 ]; then
    apt-get update -q && apt-get install -y -q "$@"
  else
    sudo apt-get update -q && sudo apt-get install -y -q "$@"
  fi
}
want=()
if [ "${DAISY_SKIP_CHROMIUM:-}" != 1 ] && [ ! -x /usr/bin/chromium ]; then want+=(chromium); fi
if ! command -v node >/dev/null 2>&1; then want+=(nodejs); fi
if [ ${#want[@]} -gt 0 ]; then apt_install "${want[@]}"; fi
command -v node >/dev/null || { echo "setup: node is still missing (apt-get install nodejs)" >&2; exit 1; }
# The tab's WebAssembly SIMD kernels: npm wabt (pinned in package-lock.json) assembles
# daisychain/webui/wasm/*.wat; the build refuses a module that differs from its pinned SHA-256.
if [ ! -d node_modules/wabt ]; then
  command -v npm >/dev/null || apt_install npm
  npm ci --no-audit --no-fund --loglevel=error
fi
node scripts/build_wasm.mjs
echo "setup done: .venv ready$( [ -x /usr/bin/chromium ] && echo ', chromium at /usr/bin/chromium'), node $(node --version)"
