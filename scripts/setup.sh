#!/usr/bin/env bash
# Everything DaisyChain and its tests need, on a fresh machine: a venv in .venv with the
# package and its test extra, and Debian's Chromium for the browser tests. Idempotent.
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
if [ "${DAISY_SKIP_CHROMIUM:-}" != 1 ] && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -q && apt-get install -y -q chromium
  else
    sudo apt-get update -q && sudo apt-get install -y -q chromium
  fi
fi
echo "setup done: .venv ready$( [ -x /usr/bin/chromium ] && echo ', chromium at /usr/bin/chromium')"
