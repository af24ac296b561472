"""Unit tier: what ``bench/chaos.py`` found in the run protocol (``daisychain.peer.run``),
each as a regression test on the sans-IO ``RunPeer`` (``run_net.Net``: the real frame
encoder and reassembler, computes run in order, time advances one second per idle tick)."""

from __future__ import annotations

import pytest

from daisychain.engine.cli import train
from daisychain.peer import frames as F
from daisychain.peer import run as R

from run_net import Net, settings


@pytest.fixture(scope="module")
def rs():
    return settings()


@pytest.fixture(scope="module")
def ref(rs):
    return train(rs, quiet=True)["params_sha256"]


def _under_way(net: Net, step: int = 2) -> None:
    """Deliver and compute until the coordinator has committed ``step`` steps."""
    for _ in range(100000):
        if net.peers["p0"].step >= step:
            return
        if net.pump_wire():
            continue
        if net.computes:
            net.do_compute(*net.computes.popleft())
            continue
        net.now += 1.0
        for pid in net.room():
            net.feed(pid, net.peers[pid].tick(net.now))
    raise AssertionError("the run did not get under way")


def _claims_to_be_ahead(net: Net, who: str = "p1", also: str = "p2") -> None:
    """``also``, then ``who`` tell the coordinator they hold the same later step (as members
    do after a hand-over; or liars): confirmed by a second member (issue 35), the coordinator
    asks ``who`` for its state."""
    coord = net.peers["p0"]
    ready = F.Ready(coord.term, 1.0, "python", coord.step + 50, "f" * 64)
    out = coord.receive(also, ready)
    assert not any(isinstance(o, R.Send) and isinstance(o.message, F.SyncRequest) for o in out)
    net.feed("p0", out)
    out = coord.receive(who, ready)
    assert any(isinstance(o, R.Send) and isinstance(o.message, F.SyncRequest) and o.to == who
               for o in out)
    net.feed("p0", out)


def test_a_member_ahead_that_leaves_before_its_state_does_not_stall_the_coordinator(rs, ref):
    """Seen in bench/chaos.py (garbage trial): a coordinator that asked a member ahead of it
    for its state waited for that STATE for ever when the member left first (the run stalled
    at its step, alone, until killed)."""
    net = Net(rs, 3)
    _under_way(net)
    _claims_to_be_ahead(net, "p1")
    net.kill("p1", "p0")  # gone before the sync request was answered
    net.run(limit=20000)
    assert net.of(R.Ended, "p0")[0].params_sha256 == ref
    assert net.of(R.Ended, "p2")[0].params_sha256 == ref
    texts = [e.text for e in net.of(R.Log, "p0")]
    assert any("left before sending its state" in t for t in texts), texts[-5:]


def test_a_member_ahead_that_never_sends_its_state_does_not_stall_the_coordinator(rs, ref):
    """A member that claims a later step and then never answers the sync request (a liar,
    or one whose state was lost on the way) held the coordinator for ever; now it waits
    ``R.SYNC_WAIT_S``, goes on from its own state and brings that member to it."""
    net = Net(rs, 3)
    _under_way(net)
    _claims_to_be_ahead(net, "p1")
    net.wire.clear()  # the sync request never reaches p1
    net.run(limit=20000)
    assert net.of(R.Ended, "p0")[0].params_sha256 == ref
    assert net.of(R.Ended, "p1")[0].params_sha256 == ref
    texts = [e.text for e in net.of(R.Log, "p0")]
    assert any("sent no state" in t for t in texts), texts[-5:]


def test_a_state_that_does_not_match_its_hash_does_not_stall_the_coordinator(rs, ref):
    """The STATE the coordinator asked for arrives but is ignored (its hash is wrong): the
    coordinator used to keep waiting for another one."""
    net = Net(rs, 3)
    _under_way(net)
    _claims_to_be_ahead(net, "p1")
    net.wire.clear()
    coord = net.peers["p0"]
    st = coord.trainer.state
    bad = F.State(coord.step + 50, "f" * 64, st.theta.copy(), st.adam.m.copy(), st.adam.v.copy(),
                  st.adam.b1t, st.adam.b2t)
    out = coord.receive("p1", bad)
    assert any(isinstance(o, R.Log) and "does not match its hash" in o.text for o in out)
    net.feed("p0", out)
    net.run(limit=20000)
    assert net.of(R.Ended, "p0")[0].params_sha256 == ref
    assert net.of(R.Ended, "p1")[0].params_sha256 == ref
