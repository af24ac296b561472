"""Unit tier: the run/step coordinator (daisychain.peer.run) driven without sockets.

Every message between the replicas goes through the real frame encoder and reassembler, so
these tests also cover the wire format end to end; computes run synchronously, in an order
the test controls, so drops, duplicates and late contributions happen exactly where wanted.
"""

from __future__ import annotations


import pytest

from daisychain import ENGINE_VERSION
from daisychain.engine.cli import train
from daisychain.peer import frames as F
from daisychain.peer import run as R

from run_net import Net, settings


@pytest.fixture(scope="module")
def rs():
    return settings()


@pytest.fixture(scope="module")
def reference(rs):
    return train(rs, quiet=True)["params_sha256"]


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


