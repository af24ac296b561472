"""The transformer (issue 37) trained by a room: a 2-peer ``daisychain demo`` (real server,
real aiortc peers, the micro-batches split between them) gives ``daisychain train``'s
params-sha256 for the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _last_json(argv):
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", *argv, "--json", "--quiet"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_two_peer_demo_gives_train_hash():
    run = ["--task", "text", "--layers", "block16h2", "--steps", "4", "--seed", "2"]
    demo = _last_json(["demo", "--peers", "2", "--port", "0", *run])
    train = _last_json(["train", *run])
    assert demo["run_id"] == train["run_id"]
    assert demo["params_sha256"] == train["params_sha256"]
