"""The ring aggregator (daisychain/peer/run/ring.py): its pure state machine, its wire
messages and the room's choice of star or ring. The ring's runs (joins, drops, deadlines,
bad chunks, an end or a death while a member still gathers) are the shared scenario files
tests/scenarios/ring/*.json, played in both languages by tests/run/test_scenarios.py."""

from __future__ import annotations

import random

import numpy as np
import pytest

from daisychain.peer import frames as F
from daisychain.peer import run as R
from daisychain.peer.run.ring import (
    Ring, RingError, choose, chunk_bounds, ring_seconds, ring_size, star_seconds)


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


def test_a_local_steps_round_is_summed_by_the_ring_between_anchors():
    """Between anchors a local-steps round rides the ring (its P deltas, priced at 4 wire
    bytes each); an anchor round's inner moments are checked by the coordinator, so the
    star; spot-checks keep the star; 1 device is the star."""
    assert choose("ring", 0.0, 3, 4, 1e-3, 20_000, local=True) == \
        ("ring", "3 devices, no spot-checks (--aggregate ring); anchor rounds by the star")
    for aggregate in ("ring", "auto"):
        mode, why = choose(aggregate, 0.0, 3, 4, 1e-3, 20_000, local=True, anchor=True)
        assert mode == "star" and "a local-steps anchor round" in why
    assert choose("ring", 0.05, 3, 4, 1e-3, 20_000, local=True)[0] == "star"
    assert choose("ring", 0.0, 1, 4, 1e-3, 20_000, local=True) == ("star", "1 device")
    # auto: a local round's deltas are bytes (V = 4 P), so the ring wins where a synchronous
    # step of the same parameter count (V = 1.5 P) is still the star's
    sync, local = choose("auto", 0.0, 3, 3, 0.1, 20_000), choose("auto", 0.0, 3, 3, 0.1, 20_000, local=True)
    assert sync[0] == "star" and local[0] == "ring", (sync, local)
    assert "ms a round" in local[1] and local[1].endswith("; anchor rounds by the star")


def test_ring_size_is_the_deltas_between_anchors():
    """ring_size: P entries in a local round between anchors, the whole contribution in an
    anchor round and in a synchronous run; a ring of P entries pads its total with zeros."""
    from daisychain.engine.local import LocalTrainer
    from daisychain.units import load_luts
    from local_cases import LOCAL, TINY, settings

    rs = settings(4, *LOCAL, "--moments-every", "2")
    tr = LocalTrainer(rs.spec, rs.hp, rs.ds, load_luts())
    p = tr.layout.size
    assert tr.total_size > p
    assert [ring_size(tr, n) for n in range(4)] == [p, tr.total_size, p, tr.total_size]
    sync = settings(2, *TINY)
    from daisychain.engine.trainer import Trainer
    st = Trainer(sync.spec, sync.hp, sync.ds, load_luts())
    assert ring_size(st, 0) == st.total_size == st.layout.size
    # two replicas each hold half the replicas; the ring over P entries gives the star's total
    halves = [tr.contribute([0, 1]).grad, tr.contribute([2]).grad]
    assert not any(h[p:].any() for h in halves)
    rings = [Ring(1, 0, 1, ("a", "b"), me, p, int(tr.n_tasks * tr.limit), tr.total_size) for me in "ab"]
    out = {me: r.contribute(h) for me, r, h in zip("ab", rings, halves)}
    while any(out.values()):
        for me, r in zip("ab", rings):
            other = "b" if me == "a" else "a"
            msgs, out[other] = out[other], []
            for m in msgs:
                out[me] += r.receive(other, wire(m))
    for r in rings:
        assert r.total.size == tr.total_size and r.total.tobytes() == (halves[0] + halves[1]).tobytes()
        assert all(len(c.ints) <= p // 2 + 1 for c in [r._send(0, 0, 0)])  # chunks of the deltas alone
