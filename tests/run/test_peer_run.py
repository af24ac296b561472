"""Unit tier: the run/step coordinator (daisychain.peer.run) driven without sockets.

Every message between the replicas goes through the real frame encoder and reassembler, so
these tests also cover the wire format end to end; computes run synchronously, in an order
the test controls, so drops, duplicates and late contributions happen exactly where wanted.
"""

from __future__ import annotations


import numpy as np
import pytest

from daisychain import ENGINE_VERSION
from daisychain.engine.cli import train
from daisychain.peer import frames as F
from daisychain.peer import run as R

from run_net import STEPS, Net, settings


@pytest.fixture(scope="module")
def rs():
    return settings()


@pytest.fixture(scope="module")
def reference(rs):
    return train(rs, quiet=True)["params_sha256"]


def test_three_peers_reach_the_reference_hash(rs, reference):
    net = Net(rs, 3)
    net.run()
    for pid in net.room():
        ends = net.of(R.Ended, pid)
        assert ends and ends[0].params_sha256 == reference and ends[0].agreed
    committed = net.of(R.Committed, "p0")
    assert [c.step for c in committed] == list(range(STEPS))
    assert {p for c in committed for p, _ in c.contributors} == {"p0", "p1", "p2"}
    assert all(sum(n for _, n in c.contributors) == rs.hp.n_micro for c in committed)


def test_capacity_decides_the_shares(rs, reference):
    net = Net(rs, 2, caps={"p0": 1.0, "p1": 3.0})
    net.run()
    first = net.of(R.Committed, "p0")[0]
    assert dict(first.contributors) == {"p0": 1, "p1": 3}
    assert net.of(R.Ended, "p1")[0].params_sha256 == reference


def test_peer_drop_mid_step_reassigns_and_keeps_the_total(rs, reference):
    """A peer that dies holding work: its micro-batches go to the others, same hash."""
    state = {"killed": False}

    def hook(net):
        if not state["killed"] and net.peers["p0"].step == 2 and any(
                pid == "p2" for pid, _ in net.computes):
            net.kill("p2")
            state["killed"] = True
            return True
        return False

    net = Net(rs, 3)
    net.run(hook)
    assert state["killed"]
    assert any("left during step 2" in e.text for e in net.of(R.Log, "p0"))
    assert net.of(R.Ended, "p0")[0].params_sha256 == reference
    assert net.of(R.Ended, "p1")[0].params_sha256 == reference
    step2 = net.of(R.Committed, "p0")[2]
    assert "p2" not in dict(step2.contributors) and sum(dict(step2.contributors).values()) == 4


def test_duplicate_and_late_contributions_are_ignored(rs, reference):
    """A slow peer gets a backup after its deadline; both answers arrive; the first counts
    and the other is dropped, so no micro-batch is counted twice."""
    state = {"held": None, "replayed": 0}

    def hook(net):
        # hold p1's compute of step 1 until its deadline passed and a backup was assigned
        if state["held"] is None:
            for i, (pid, c) in enumerate(net.computes):
                if pid == "p1" and c.step == 1:
                    state["held"] = c
                    del net.computes[i]
                    return True
        elif state["held"] is not False and any(
                ("missed the deadline" in e.text or "given to a backup" in e.text) for e in net.of(R.Log, "p0")) and not net.computes \
                and not net.wire:
            held, state["held"] = state["held"], False
            net.do_compute("p1", held)  # late: the backup's contribution was committed already
            return True
        return False

    net = Net(rs, 3)
    coord = net.peers["p0"]
    orig = coord.coordinator._take_contrib
    seen = []

    def spy(sender, step, task, micro, *rest):
        out = orig(sender, step, task, micro, *rest)
        seen.append((sender, step, task))
        return out
    coord.coordinator._take_contrib = spy
    # a contribution sent twice on the wire is ignored as well
    net.run(hook)
    assert state["held"] is False
    assert net.of(R.Ended, "p0")[0].params_sha256 == reference
    assert net.of(R.Ended, "p1")[0].params_sha256 == reference
    # replaying an old, already committed contribution changes nothing
    c = F.Contrib(coord.term, 1, 0, (0,), 0.0, 0, np.ones(coord.trainer.layout.size, np.int64))
    assert coord.receive("p1", c) == []


def test_identity_mismatch_is_refused_with_the_difference(rs, reference):
    net = Net(rs, 3, wait=1, engine_version="999")
    net.run()
    mine = net.of(R.Refused, "p2")
    assert mine and any(f"engine version: 999 here, {ENGINE_VERSION} in the run" in r for r in mine[0].reasons)
    seen = net.of(R.Refused, "p0")
    assert seen and seen[0].peer == "p2"
    assert net.of(R.Ended, "p0")[0].params_sha256 == reference
    assert all("p2" not in dict(c.contributors) for c in net.of(R.Committed, "p0"))


def test_failed_selftest_is_refused(rs):
    net = Net(rs, 2, wait=0, selftest=(False, "relu unit: 3 of 256 outputs differ"))
    net.run()
    assert any("self-test failed: relu unit" in r for r in net.of(R.Refused, "p1")[0].reasons)


def test_late_joiner_gets_the_state_and_the_same_hash(rs, reference):
    state = {"joined": False}

    def hook(net):
        if not state["joined"] and net.peers["p0"].step == 3:
            net.add("p9")
            state["joined"] = True
            return True
        return False

    net = Net(rs, 2)
    net.run(hook)
    assert any("synced to step 3" in e.text for e in net.of(R.Log, "p9"))
    assert net.of(R.Ended, "p9")[0].params_sha256 == reference
    assert any("p9" in dict(c.contributors) for c in net.of(R.Committed, "p0"))


def test_host_leaves_mid_step_and_the_next_host_finishes(rs, reference):
    state = {"gone": False}

    def hook(net):
        if not state["gone"] and net.peers["p0"].step == 2 and net.computes:
            net.kill("p0", new_host="p1")
            state["gone"] = True
            return True
        return False

    net = Net(rs, 3)
    net.run(hook)
    assert net.peers["p1"].coordinating and net.peers["p1"].term == 2
    for pid in ("p1", "p2"):
        assert net.of(R.Ended, pid)[0].params_sha256 == reference


def test_new_host_behind_a_member_goes_on_from_its_own_state(rs, reference):
    """The old host's TOTAL reached p2 but not p1 (the new host). p2 says it is ahead; with
    nobody left to confirm that step, one member's word does not replace the run's state
    (issue 35): p1 goes on from its own step and sends p2 its state. The step is computed
    again, never lost: both end on the reference hash."""
    state = {"gone": False}

    def hook(net):
        if state["gone"]:
            return False
        for i, (sender, to, fr) in enumerate(net.wire):
            if sender == "p0" and F.decode_frame(fr).type == F.FrameType.TOTAL and to == "p1" \
                    and F.decode_frame(fr).step == 3:
                del net.wire[i]          # p1 never gets step 3's total
                net.pump_wire(True)      # p2 does
                net.kill("p0", new_host="p1")
                state["gone"] = True
                return True
        return False

    net = Net(rs, 3)
    net.run(hook)
    assert any("no other member confirms step 4 of p2" in e.text for e in net.of(R.Log, "p1"))
    assert any("synced to step 3 from p1" in e.text for e in net.of(R.Log, "p2"))
    for pid in ("p1", "p2"):
        assert net.of(R.Ended, pid)[0].params_sha256 == reference


def test_hash_mismatch_is_loud_and_resyncs(rs, reference):
    state = {"broken": False}

    def hook(net):
        if not state["broken"] and net.peers["p1"].step == 2:
            net.peers["p1"].trainer.state.theta[0] += 1e-9  # a replica that went wrong
            state["broken"] = True
        return False

    net = Net(rs, 2)
    net.run(hook)
    assert any(e.loud and "HASH MISMATCH" in e.text for e in net.of(R.Log, "p1"))
    assert any(e.loud and "diverged" in e.text for e in net.of(R.Log, "p0"))
    assert net.of(R.Ended, "p1")[0].params_sha256 == reference
