"""Mesh tier, local steps (``--replicas R --sync-every H``, daisychain/engine/local.py): real
``daisy-peer`` processes and real ``daisychain demo`` rooms over real aiortc data channels
end on ``daisychain train``'s hash: a round is a step, its replicas the tasks. A member
killed mid-round has its replicas recomputed from the round's start by the others; a late
joiner loads the whole round state (theta_g, the outer buffer, every replica's moments).

    scripts/in-netns.sh .venv/bin/python -m pytest tests/mesh/test_local_steps_mesh.py -q
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest

from daisychain.engine.cli import train
from daisychain.engine.settings import add_run_arguments, settings_from_args

from .test_mesh import ROOT, host, peers, server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.mesh

#: a tiny text run with local steps: 4 replicas, 4 inner steps a round
RUN = ["--task", "text", "--hidden", "16", "--embed-dim", "4", "--context", "4", "--batch", "16",
       "--micro-batch", "4", "--seed", "3", "--replicas", "4", "--sync-every", "4"]
LONG = 150  # rounds: several seconds, so that a kill or a join lands mid-run


def reference(steps: int, *argv: str) -> str:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    rs = settings_from_args(p.parse_args(["--steps", str(steps), *argv]))
    return train(rs, quiet=True)["params_sha256"]


@pytest.mark.parametrize("n", [2, 3])
def test_demo_with_local_steps_ends_on_trains_hash(n):
    argv = ["--task", "text", "--replicas", "4", "--sync-every", "8", "--steps", "3"]
    r = subprocess.run([sys.executable, "-m", "daisychain.cli", "demo", "--peers", str(n), "--port", "0",
                        "--json", *argv], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["all_agree"] and out["steps"] == 3
    assert out["identity"]["hyper"]["replicas"] == 4 and out["identity"]["hyper"]["sync_every"] == 8
    assert out["params_sha256"] == reference(3, *argv)
    assert sum(p["micro_batches"] for p in out["peers"]) >= 3 * 4  # every replica of every round


def test_member_killed_mid_round_keeps_the_hash(server, peers):
    h, code = host(peers, server, LONG, 2, *RUN)
    m1 = peers(server, "--room", code, name="m1")
    m2 = peers(server, "--room", code, name="m2")
    m2.wait_for("joined run")
    h.wait_for(r"train: +\d+%.*?\| *[1-9]\d*/")  # rounds are being committed
    m2.kill()
    ref = reference(LONG, *RUN)
    outs = [p.finish() for p in (h, m1)]
    for rc, out in outs:
        assert rc == 0 and re.search(f"^params-sha256: {ref}$", out, re.M), out
    assert "left" in h.stderr()
    # m2's replicas were taken over by devices without their moments (none travel between
    # anchors, engine/local.py): replayed from the anchor, and still on the hash
    replayed = [int(re.search(r"replica rounds replayed from an anchor here: (\d+)", out).group(1))
                for _, out in outs]
    assert sum(replayed) > 0, replayed


def test_late_joiner_loads_the_round_state_and_ends_on_the_hash(server, peers):
    h, code = host(peers, server, LONG, 1, *RUN)
    m1 = peers(server, "--room", code, name="m1")
    h.wait_for(r"train: +\d+%.*?\| *[1-9]\d*/")
    late = peers(server, "--room", code, name="late")
    late.wait_for(r"synced to step [1-9]")
    ref = reference(LONG, *RUN)
    assert late.hash() == ref
    assert h.hash() == ref and m1.hash() == ref


def test_host_leaves_mid_run_and_the_next_host_finishes(server, peers):
    h, code = host(peers, server, LONG, 2, *RUN)
    m1 = peers(server, "--room", code, name="m1")
    m1.wait_for("joined run")
    m2 = peers(server, "--room", code, name="m2")
    m2.wait_for("joined run")
    m1.wait_for(r"train: +\d+%.*?\| *[1-9]\d*/")
    h.kill()
    ref = reference(LONG, *RUN)
    assert m1.hash() == ref
    assert m2.hash() == ref
    assert "coordinating the run from step" in m1.stderr() + m2.stderr()


def test_a_host_resumes_a_local_steps_checkpoint_in_a_room(server, peers, tmp_path):
    """`daisy-peer --create-room --resume` of a `train` checkpoint at round 20 (the whole
    round state): the room goes on to round 40 and ends on the uninterrupted run's hash."""
    ck = tmp_path / "local.pt"
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    train(settings_from_args(p.parse_args(["--steps", "20", *RUN])), quiet=True, save=str(ck))
    h, code = host(peers, server, 40, 1, *RUN, "--resume", str(ck))
    m1 = peers(server, "--room", code, name="m1")
    ref = reference(40, *RUN)
    assert h.hash() == ref and m1.hash() == ref
    assert "resuming run" in h.stderr()
