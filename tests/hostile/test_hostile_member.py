"""Hostile tier, a member that turns hostile (issue 35): a real daisy-peer (attacker.py) joins a
private room normally, trains honestly, then writes the run protocol's own frames into its
data channels in its own name. Against a daisy-peer host and an honest daisy-peer member
(real aiortc, the real server, inside the private network namespace):

    scripts/in-netns.sh .venv/bin/python -m pytest tests/hostile/test_hostile_member.py -q

Each attack must end with the attacker refused by name (and struck or dropped), the honest
peers on ``daisychain train``'s hash, and no honest peer's RSS grown by more than 300 MB.
Every attack here succeeded against the main of 2026-12-06 (d554184), which is how each
test was checked to fail first.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from bench.hostile import Peak
from peer_process import PeerProcess, server_thread

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "mesh"))
from test_mesh import reference  # noqa: E402

STEPS = 300
MB = 1 << 20
#: how much an honest peer's RSS may grow under an attack (issue 35, "How it is shown")
MAX_GROWTH = 300 * MB
ATTACKER = [sys.executable, str(HERE / "attacker.py")]


@pytest.fixture(scope="module")
def server():
    with server_thread() as url:
        yield url


def room(server, tmp_path, attacks: str, *host_extra, start: int = 3):
    """A host (waits for two members), an honest member m1 and the attacker; returns them
    and the peak-RSS watcher of the honest two, started once every peer joined the run."""
    made = []

    def peer(*args, name, command=None, env=None):
        old = dict(os.environ)
        os.environ.update(env or {})
        try:
            p = PeerProcess(server, *args, name=name, err_dir=tmp_path, command=command)
        finally:
            os.environ.clear()
            os.environ.update(old)
        made.append(p)
        return p

    h = peer("--create-room", "--approve", "all", "--wait-peers", "2", "--steps", str(STEPS),
             *host_extra, name="host")
    code = h.wait_for(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})").group(1)
    m1 = peer("--room", code, name="m1")
    bad = peer("--room", code, name="mallory", command=ATTACKER,
               env={"DAISY_ATTACKS": attacks, "DAISY_ATTACK_FROM": str(start)})
    for p in (m1, bad):
        p.wait_for("joined run", 90)
    return h, m1, bad, Peak({"host": h.proc, "m1": m1.proc}), made


@pytest.fixture
def stop_all():
    made = []
    yield made
    for group in made:
        for p in group:
            p.stop()


def _check(h, m1, peak):
    ref = reference(STEPS)
    assert h.hash() == ref, h.stderr()[-3000:]
    assert m1.hash() == ref, m1.stderr()[-3000:]
    grown = peak.growth_mb()
    assert grown < MAX_GROWTH / MB, grown
    for p in (h, m1):
        assert "internal error" not in p.stderr(), p.stderr()[-3000:]


def test_a_member_cannot_end_another_members_run_or_replace_the_state(server, tmp_path, stop_all):
    """Items 1, 2, 3, 4, 6 in one run: a forged run announce + end to m1 (m1 holds it: the
    server names the host), 1,000 sync requests to each (one STATE a step at most), a STATE
    nobody asked for to the host (refused, strike 1), a contribution holding -2**63 (refused
    at the decoder, strike 2), and two segment bombs to each (refused before anything is
    inflated; strike 3: removed)."""
    h, m1, bad, peak, made = room(server, tmp_path, "forged-run,sync-flood,unasked-state,"
                                                    "min-int64,segment-bomb")
    stop_all.append(made)
    bad.wait_for("ATTACK segment-bomb", 120)
    _check(h, m1, peak)
    host, mem = h.stderr(), m1.stderr()
    assert "held until it does" in mem and "(term " in mem, mem[-3000:]
    assert "host stopped" not in mem
    assert re.search(r"refused a state \(step \d+\) from mallory \(\w+\): nobody asked for it", host), host[-3000:]
    assert "not below 2**53" in host, host[-3000:]
    assert "declares 11000000 segments" in host and "declares 11000000 segments" in mem, host[-3000:]
    assert "liar removed: mallory" in host, host[-3000:]
    # the flood of 1,000 sync requests cost the host at most a line (and a STATE) a step
    assert len(re.findall(r"\w+ diverged at step", host)) <= 3, host[-3000:]


def test_a_64_mib_message_drops_its_sender_and_the_room_trains_on(server, tmp_path, stop_all):
    """Item 5: one 64 MiB data-channel message (the attacker lifts its own send limit) is
    not reassembled: the host drops the connection at the announced maximum and the room
    goes on."""
    h, m1, bad, peak, made = room(server, tmp_path, "big-frame")
    stop_all.append(made)
    bad.wait_for("ATTACK big-frame", 120)
    h.wait_for(r"past the 262144-byte maximum message", 60)
    _check(h, m1, peak)
