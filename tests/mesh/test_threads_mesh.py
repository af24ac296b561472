"""Mesh tier, ``--threads N`` (issue 33, item 2): real daisy-peer processes whose step's
micro-batches run on 1, 2 or 3 threads end on ``daisychain train``'s hash, and so does
``daisychain demo --threads N``. Run inside the private network namespace:
``scripts/in-netns.sh .venv/bin/python -m pytest tests/mesh/test_threads_mesh.py -q``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from peer_process import PeerProcess, server_thread

pytestmark = pytest.mark.mesh

ROOT = Path(__file__).resolve().parents[2]
RUN = ["--steps", "6", "--layers", "32,16", "--seed", "4"]


def _train_hash() -> str:
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", "train", "--json", "--quiet", *RUN],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])["params_sha256"]


def test_daisy_peers_on_1_2_3_threads_end_on_trains_hash():
    want = _train_hash()
    err_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    with server_thread() as url:
        made = []
        try:
            host = PeerProcess(url, "--create-room", "--approve", "all", "--wait-peers", "2", *RUN,
                               "--threads", "1", name="t1", err_dir=err_dir)
            made.append(host)
            code = host.wait_for(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})").group(1)
            for n in (2, 3):
                made.append(PeerProcess(url, "--room", code, "--threads", str(n), name=f"t{n}", err_dir=err_dir))
            assert [p.hash() for p in made] == [want] * 3
            assert "--threads 3 is more than" in made[2].stderr() or os.cpu_count() >= 3
        finally:
            for p in made:
                p.stop()


@pytest.mark.parametrize("n", [1, 2, 3])
def test_demo_on_n_threads_ends_on_trains_hash(n):
    want = _train_hash()
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", "demo", "--peers", "2", "--port", "0",
                        "--threads", str(n), "--json", "--quiet", *RUN],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["all_agree"] and out["params_sha256"] == want
