"""The ring aggregator (daisychain/peer/run/ring.py): its pure state machine, its wire
messages, the room's choice of star or ring, and moments of a ring that the scenario files
(tests/scenarios/ring/, both languages: tests/test_scenarios.py) cannot reach."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from daisychain.peer import frames as F
from daisychain.peer import run as R
from daisychain.peer.run.ring import (
    Ring, RingError, choose, chunk_bounds, ring_seconds, star_seconds)

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "scenarios"))
from scenario_net import Net  # noqa: E402
from test_scenarios import reference  # noqa: E402



def wire(msg, run_id="00" * 8):
    """A message through the real encoder, frames and reassembler, back to its typed form."""
    m = F.to_message(msg, run_id)
    r = F.Reassembler()
    out = None
    for fr in F.encode_frames(m, 1):
        out = r.feed(fr)
    return F.from_message(out, 1000)


def play(n: int, size: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """n rings on a network that delivers each channel in order but interleaves channels
    and contributions at random; returns every member's total and the true sum."""
    rnd = random.Random(seed)
    peers = [f"p{i}" for i in range(n)]
    vecs = [np.array([rnd.randrange(-10**6, 10**6) for _ in range(size)], np.int64) for _ in peers]
    rings = {p: Ring(1, 0, 1, peers, p, size, 10**7) for p in peers}
    chans: dict[tuple[str, str], list] = {}
    todo = list(peers)  # members yet to contribute

    def send(p, chunks):
        for c in chunks:
            chans.setdefault((p, rings[p].next), []).append(wire(c))

    while todo or any(chans.values()):
        busy = [k for k, v in chans.items() if v]
        if todo and (not busy or rnd.random() < 0.3):
            p = todo.pop(rnd.randrange(len(todo)))
            send(p, rings[p].contribute(vecs[peers.index(p)]))
            continue
        a, b = rnd.choice(busy)
        send(b, rings[b].receive(a, chans[(a, b)].pop(0)))
    return [rings[p].total for p in peers], np.sum(vecs, axis=0)


@pytest.mark.parametrize("n,size", [(2, 1), (2, 7), (3, 610), (4, 3), (5, 1001), (8, 64)])
def test_ring_sums_exactly_in_any_order(n, size):
    for seed in range(3):
        totals, want = play(n, size, seed)
        for t in totals:
            assert t is not None and np.array_equal(t, want)


def test_chunk_bounds_cover_the_vector_once():
    for size in (0, 1, 5, 610, 1001):
        for n in (1, 2, 3, 7):
            b = chunk_bounds(size, n)
            assert b[0][0] == 0 and b[-1][1] == size
            assert all(x[1] == y[0] for x, y in zip(b, b[1:]))
            assert max(hi - lo for lo, hi in b) - min(hi - lo for lo, hi in b) <= 1


def test_ring_refuses_what_does_not_fit():
    r = Ring(2, 5, 3, ["a", "b", "c"], "b", 9, 100)
    ok = F.RingChunk(2, 5, 3, 0, 0, 0, np.arange(3))
    bad = {
        "not from the ring predecessor a": ("c", ok),
        "ring is term 2, step 5, ring 3": ("a", F.RingChunk(2, 6, 3, 0, 0, 0, np.arange(3))),
        "phase 0 round 0 is due": ("a", F.RingChunk(2, 5, 3, 1, 0, 1, np.arange(3))),
        "takes chunk 0": ("a", F.RingChunk(2, 5, 3, 0, 0, 2, np.arange(3))),
        "chunk 0 has 3": ("a", F.RingChunk(2, 5, 3, 0, 0, 0, np.arange(4))),
        "over the step's clamp bound 100": ("a", F.RingChunk(2, 5, 3, 0, 0, 0, np.array([0, 101, 0]))),
    }
    for words, (sender, msg) in bad.items():
        with pytest.raises(RingError, match=words):
            r.receive(sender, msg)
    assert r.receive("a", ok) == [] and r.queue == [ok]  # before our contribution: it waits
    out = r.contribute(np.ones(9, np.int64))
    assert [(c.phase, c.round, c.chunk) for c in out] == [(0, 0, 1), (0, 1, 0)]
    assert list(out[1].ints) == [1, 2, 3]


def test_ring_messages_cross_the_wire():
    plan = F.RingPlan(3, 7, 2, ("a", "b"), (F.Task(4, "b", (1, 2)),))
    assert wire(plan) == plan
    s = F.RingSum(3, 7, 2, (1, 2), 1.5, 1)
    assert wire(s) == s
    c = F.RingCommit(3, 7, 2, (("a", 2), ("b", 2)), 2.25, "ab" * 32)
    assert wire(c) == c
    ch = wire(F.RingChunk(3, 7, 2, 1, 0, 1, np.array([-5, 0, 2**40])))
    assert (ch.term, ch.step, ch.ring, ch.phase, ch.round, ch.chunk) == (3, 7, 2, 1, 0, 1)
    assert list(ch.ints) == [-5, 0, 2**40]
    for peers, words in ((["a"], "2 or more distinct"), (["a", "a"], "2 or more distinct"),
                         (["a", 7], "2 or more distinct")):
        m = F.Message(F.FrameType.CONTROL, "", 0, {"t": "ring_plan", "term": 1, "ring": 1,
                                                    "peers": peers, "tasks": []})
        with pytest.raises(F.FrameError, match=words):
            F.from_message(m)


def test_choice_of_star_or_ring():
    assert choose("auto", 0.05, 3, 4, 1e-3, 10_000)[0] == "star"
    assert "spot-checks at rate 0.05" in choose("auto", 0.05, 3, 4, 1e-3, 10_000)[1]
    assert choose("auto", 0.0, 1, 4, 1e-3, 10_000) == ("star", "1 device")
    assert choose("star", 0.0, 4, 4, 1e-3, 10_000)[0] == "star"
    assert choose("ring", 0.0, 4, 4, 1e-3, 10_000)[0] == "ring"
    # the cost model: a small model's step is hops (the ring has 2n - 1 of them, the star 2);
    # a large one's is bytes (the star's coordinator moves 2 (n - 1) whole vectors, a ring
    # member 2 (n - 1) / n of one)
    assert choose("auto", 0.0, 3, 4, 1e-3, 9_610)[0] == "star"
    assert "the cost model: star" in choose("auto", 0.0, 3, 4, 1e-3, 9_610)[1]
    for n in (2, 4, 8, 16):
        assert ring_seconds(n, 256, 1e-3, 200_000) < star_seconds(n, 256, 1e-3, 200_000)
        assert choose("auto", 0.0, n, 256, 1e-3, 200_000)[0] == "ring"
    with pytest.raises(ValueError, match="--verify-rate 0"):
        R.RunPeer("a", aggregate="ring", verify_rate=0.05)
    with pytest.raises(ValueError, match="auto, star, ring"):
        R.RunPeer("a", aggregate="tree", verify_rate=0.0)


def test_member_still_gathering_when_a_ring_peer_dies_resyncs():
    """The coordinator has the whole total (and commits) while p2 still waits for p1's last
    all-gather chunk; p1 dies with it: p2 asks for the state and goes on to the reference."""
    sc = json.loads((HERE / "scenarios" / "ring" / "ring_join.json").read_text())
    net = Net(sc)
    for e in sc["events"][:-1]:
        net.op(e)
    p0, p2 = net.peers["p0"], net.peers["p2"]
    for _ in range(10_000):
        if p0.step == 1 and p2.step == 0 and p2.ring is not None and p2.ring.seen == 3:
            break
        if net.wire and (net.wire[0][0] != "p1" or net.wire[0][1] != "p2" or p2.ring is None
                         or p2.ring.seen < 3):
            net.deliver_one()
        elif net.wire and len(net.wire) > 1:
            net.wire.rotate(-1)
        elif not net.compute_one():
            raise AssertionError("the ring never reached the moment")
    assert p0.step == 1 and p2.step == 0
    net.op({"op": "kill", "id": "p1", "host": "p0"})
    net.settle()
    assert ["log", "p2", False, "a member left while step 0's ring was gathering: resyncing"] in net.out
    want = reference(tuple(sc["settings"]))
    assert p0._hash() == want and p2._hash() == want and p2.step == 3


def test_member_dying_with_its_sum_in_flight_after_the_total_is_in():
    """Regression: the coordinator had gathered the whole total, but p1's ring_sum (its own
    channel to the coordinator, not the ring's) was still in flight when p1 died; the
    coordinator waited for it for ever. Now the ring is abandoned and the step done again."""
    sc = json.loads((HERE / "scenarios" / "ring" / "ring_join.json").read_text())
    net = Net(sc)
    for e in sc["events"][:-1]:
        net.op(e)
    p0 = net.peers["p0"]
    for _ in range(10_000):
        if p0.ring is not None and p0.ring.total is not None:
            break
        held = [("p1", "p0") == w[:2] and b'"ring_sum"' in b"".join(w[2]) for w in net.wire]
        if not all(held):
            while held[0]:  # the sum waits on its own channel; everything else goes on
                net.wire.rotate(-1)
                held = held[1:] + held[:1]
            net.deliver_one()
        elif not net.compute_one():
            raise AssertionError("the ring never reached the moment")
    assert p0.step == 0 and "p1" not in p0.ring_sums
    net.op({"op": "kill", "id": "p1", "host": "p0"})
    net.settle()
    assert ["log", "p0", False, "p1 left during step 0: its ring is abandoned, the step is done "
            "again by the others"] in net.out
    want = reference(tuple(sc["settings"]))
    assert p0.step == 3 and p0._hash() == want and net.peers["p2"]._hash() == want


def test_the_end_waits_for_a_members_last_ring():
    """Regression: the coordinator commits the last step as soon as it has the whole total
    and sends ``end``; p2 still waited for p1's last all-gather chunk, took the end first and
    finished one step short (agreed: false, the wrong hash). Now the end waits for the ring."""
    sc = json.loads((HERE / "scenarios" / "ring" / "ring_join.json").read_text())
    net = Net(sc)
    for e in sc["events"][:-1]:
        net.op(e)
    p0, p2 = net.peers["p0"], net.peers["p2"]
    last = p0.steps - 1
    for _ in range(10_000):
        if p0.ended:
            break
        gathering = p2.step == last and p2.ring is not None and p2.ring.seen == 3
        held = [gathering and w[:2] == ("p1", "p2") for w in net.wire]
        if not all(held):
            while held[0]:  # p1's last chunk to p2 waits; everything else goes on
                net.wire.rotate(-1)
                held = held[1:] + held[:1]
            net.deliver_one()
        elif not net.compute_one():
            raise AssertionError("the run never reached the moment")
    assert p0.ended and p2.step == last
    while any(w[:2] != ("p1", "p2") for w in net.wire):  # the end reaches p2 before the chunk
        while net.wire[0][:2] == ("p1", "p2"):
            net.wire.rotate(-1)
        net.deliver_one()
    net.settle()
    want = reference(tuple(sc["settings"]))
    assert ["ended", "p2", last + 1, want, True] in net.out
    assert not any(o[:2] == ["ended", "p2"] and not o[4] for o in net.out)
