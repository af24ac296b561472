"""Mesh tier: a lying ``daisy-peer`` (``--fault``) in a room that spot-checks a share of the
micro-batches only. Its lies that no check saw go into the model until it is caught; at its
removal the host rolls the room back and computes those steps again, so the room ends on
``daisychain train``'s hash; the liar is named, told why, and exits non-zero.

    scripts/in-netns.sh .venv/bin/python -m pytest tests/mesh/test_rollback.py -q
"""

from __future__ import annotations

import re

import pytest

from .test_mesh import host, peers, reference, server  # noqa: F401 (fixtures)

STEPS = 60


@pytest.mark.parametrize("fault,rate", [("flip", "0.25"), ("scale", "0.1")])
def test_a_liar_is_rolled_back_and_the_room_ends_on_the_reference(server, peers, fault, rate):
    # equal capacities: the liar gets a micro-batch of its own each step, not only checks
    h, code = host(peers, server, STEPS, 2, "--verify-rate", rate, "--strikes", "2", "--capacity", "100")
    honest = peers(server, "--room", code, "--capacity", "100", name="honest")
    liar = peers(server, "--room", code, "--fault", fault, "--capacity", "100", name="liar")
    ref = reference(STEPS)
    assert h.hash() == ref
    assert honest.hash() == ref
    rc, _ = liar.finish()
    log = "\n".join(x for x in h.stderr().splitlines() if "train:" not in x)
    assert re.search(r"liar removed: liar \(\w+\) after 2 strikes", log), log[-3000:]
    # whether a rollback happens depends on which of its lies the random checks saw first (a
    # liar whose every committed contribution was checked leaves nothing to undo); the hash
    # above is the proof. A rollback that happens names the liar; the shared scenarios
    # (tests/scenarios/rollback_*.json) show the rollback itself deterministically.
    for m in re.finditer(r"rolled back \d+ steps?: liar (.*) sent unchecked contributions since step \d+", log):
        assert re.fullmatch(r"liar \(\w+\)", m.group(1)), m.group(0)
    assert "older than the rollback window" not in log
    assert rc == 1 and re.search(r"daisy-peer: removed from the run by \w+: 2 strikes \(the last: ", liar.stderr()), \
        liar.stderr()[-3000:]
