"""Mesh tier: a task of your own (examples/my_task.py, regression with mse) trained by a
2-peer ``daisychain demo`` ends on the hash of ``daisychain train --task``; a daisy-peer whose
``--task`` gives other data is refused in words, and one with the same task joins and ends
on the host's hash. Run inside the private network namespace:
``scripts/in-netns.sh .venv/bin/python -m pytest tests/mesh/test_my_task_demo.py -q``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from peer_process import PeerProcess, server_thread

ROOT = Path(__file__).resolve().parents[2]
TASK = ["--task", "examples.my_task:MyTask", "--steps", "30", "--batch", "32", "--micro-batch", "8"]

pytestmark = pytest.mark.mesh


def _json(args: list[str]) -> dict:
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", *args, *TASK, "--json", "--quiet"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_demo_two_peers_give_trains_hash_for_my_task():
    reference = _json(["train"])
    demo = _json(["demo", "--peers", "2", "--port", "0"])
    assert demo["all_agree"] and demo["params_sha256"] == reference["params_sha256"]
    assert demo["identity"]["model"]["loss"] == "mse"
    assert demo["identity"]["dataset"] == reference["dataset_fingerprint"]
    assert demo["test_mse"] == reference["test_mse"]


def test_peer_with_other_data_is_refused_and_the_same_task_joins():
    err_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    made = []

    def peer(url, *args, name):
        made.append(PeerProcess(url, *args, "--quiet", name=name, err_dir=err_dir))
        return made[-1]

    try:
        with server_thread() as url:
            host = peer(url, "--create-room", "--approve", "all", "--wait-peers", "1", *TASK, name="host")
            code = host.wait_for(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})").group(1)
            odd = peer(url, "--room", code, "--task", "tests.other_task:OtherTask", name="odd")
            rc, _ = odd.finish()
            assert rc == 1
            assert "this peer's task gives other data" in odd.stderr(), odd.stderr()[-2000:]
            good = peer(url, "--room", code, "--task", "examples.my_task:MyTask", name="good")
            assert good.hash() == host.hash() == _json(["train"])["params_sha256"]
    finally:
        for p in made:
            p.stop()


JOIN = """
import json, sys
import daisychain as dc
from daisychain.peer.node import PeerFailed
try:
    out = dc.join(sys.argv[1], sys.argv[2], name=sys.argv[3], task=sys.argv[4])
except PeerFailed as exc:
    print(json.dumps({"refused": str(exc)}))
else:
    print(json.dumps({"params_sha256": out["params_sha256"], "test_mse": out["test_mse"]}))
"""


def test_api_join_is_a_daisy_peer():
    """``daisychain.join`` from Python code joins a room as daisy-peer does: with the host's
    task it ends on the hash; with a task of other data it is refused in words."""
    err_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    host = None

    def join(url, code, name, task):
        r = subprocess.run([sys.executable, "-c", JOIN, url, code, name, task], capture_output=True,
                           text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    try:
        with server_thread() as url:
            host = PeerProcess(url, "--create-room", "--approve", "all", "--wait-peers", "1", "--quiet",
                               *TASK, name="host", err_dir=err_dir)
            code = host.wait_for(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})").group(1)
            odd = join(url, code, "odd", "tests.other_task:OtherTask")
            assert "this peer's task gives other data" in odd["refused"]
            good = join(url, code, "good", "examples.my_task:MyTask")
            assert good["params_sha256"] == host.hash() == _json(["train"])["params_sha256"]
            assert good["test_mse"] is not None
    finally:
        if host is not None:
            host.stop()
