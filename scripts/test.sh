#!/usr/bin/env bash
# The test command: set up, check the committed unit tables, then run the whole suite inside
# a private network namespace (no packet leaves the machine). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/daisychain export-luts --check
exec ./scripts/in-netns.sh .venv/bin/python -m pytest -q --durations=40 "$@"
