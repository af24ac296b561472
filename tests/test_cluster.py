"""daisychain cluster over torch.distributed (Gloo): every world size ends on the hash of
`daisychain train` with the same settings; a cluster checkpoint resumes in daisy-peer's format."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
SETTINGS = ["--steps", "12", "--seed", "5", "--hidden", "32"]


def _hash(out: str) -> str:
    m = re.findall(r"params-sha256: ([0-9a-f]{64})", out)
    assert m, out[-2000:]
    return m[-1]


def _run(cmd, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, **kw)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


@pytest.fixture(scope="module")
def reference():
    return _hash(_run([str(BIN / "daisychain"), "train", *SETTINGS]))


def test_world_size_one_matches_train(reference):
    assert _hash(_run([sys.executable, "-m", "daisychain.cluster", "--quiet", *SETTINGS])) == reference


def test_torchrun_two_ranks_match_train(reference, tmp_path):
    ckpt = tmp_path / "cluster.pt"
    out = _run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m",
                "daisychain.cluster", "--quiet", *SETTINGS, "--save-checkpoint", str(ckpt)])
    assert _hash(out) == reference
    assert "multiply" in out  # rank 0 prints the unit-invocation counts
    # the checkpoint is the daisy-peer format: the engine's checked loader accepts it
    from daisychain.engine.checkpoint import read_checkpoint_file
    ck = read_checkpoint_file(ckpt)
    assert ck.step == 12 and ck.params_sha256 == reference

def test_bad_environment_is_refused_in_words():
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29555", WORLD_SIZE="two", RANK="0")
    r = subprocess.run([sys.executable, "-m", "daisychain.cluster", "--quiet", *SETTINGS],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode != 0
    assert "WORLD_SIZE" in (r.stdout + r.stderr)
    assert "Traceback" not in r.stderr
