"""The ring aggregator: a step's int64 contributions summed by reduce-scatter + all-gather
over the members' own data channels, so that the coordinator no longer sends and receives
every whole vector (the star of :mod:`.aggregator`).

The ring of a step is the coordinator's live list (itself first, then the members in id
order). The vector is cut into n chunks, chunk c = ``[c * size // n, (c + 1) * size // n)``
(:func:`chunk_bounds`, the same for everyone). Member i (ring position) sends to i + 1 and
receives from i - 1:

- reduce-scatter, rounds r = 0 .. n-2: send the partial sum of chunk ``(i - r) mod n``;
  add the chunk ``(i - 1 - r) mod n`` received. After it, member i holds the whole sum of
  chunk ``(i + 1) mod n``.
- all-gather, rounds r = 0 .. n-2: send chunk ``(i + 1 - r) mod n`` of the total; take
  chunk ``(i - r) mod n`` received (and pass it on in the next round).

n - 1 + n - 1 chunk messages out and in per member, each ``size / n`` values; the sums are
exact integers, so every replica gets the star's total bit for bit. Every incoming chunk is
checked (:meth:`Ring.receive`): term, step, ring number, sender = the ring predecessor, its
place in the sequence (phase, round), its chunk index, its length and its values against
the step's clamp bound; chunks that come before this replica's own contribution (or before
the plan) wait, bounded: at most 2 (n - 1) per ring and two rings ahead.

Trust: a ring hides each contribution from the coordinator, so spot-checks and the rollback
cannot see them. The ring is used only when the run checks nothing (``verify_rate`` 0); the
room says which aggregation it uses when a run starts and whenever it changes
("aggregating by ring: ..." / "by star: ...").

Drops: a ring member that leaves (or a ring that misses its deadline) makes the coordinator
abandon the step's ring and do the step again with those still here (a new ring number: a
missed deadline redoes it by the star). A member that was still gathering a ring that the
coordinator already committed asks for the state (``sync``), as a member that is behind.

Local steps: a round between anchors is summed by the ring over its P parameter deltas
alone (:func:`ring_size`): its moment blocks are zero by rule (engine/local.py), so they never
travel and the total is padded with zeros; no member can slip moments into it. An anchor
round's contributions carry the replicas' inner moments, which the coordinator checks one by
one (``trainer.contribution_error``) and a ring would hide from it: anchor rounds are summed
by the star, and the room says so once (:func:`choose`). The cost model prices a delta at
:data:`LOCAL_BYTES_PER_VALUE` wire bytes.

This module is the ring itself (plain state, no I/O) and the choice; the protocol's two sides,
:class:`~.ring_roles.RingMember` (owned by the :class:`~.member.Member`) and
:class:`~.ring_roles.RingCoordinator` (owned by the :class:`~.coordinator.Coordinator`), are
in :mod:`.ring_roles`, behind the aggregation interfaces of :mod:`.aggregator` that the roles
call (``aggregation``).
"""

from __future__ import annotations

import math

import numpy as np

from daisychain.peer import frames as F
from daisychain.peer.intcodec import past_bound

AGGREGATES = ("auto", "star", "ring")
#: member kinds (their ``ready``) that take part in a ring: daisy-peer and the page's two
RING_KINDS = ("python", "cpu", "webgpu")
#: extra seconds a ring gets over its slowest member's task deadline (2 (n - 1) hops)
RING_SLACK_S = 2.0

# -- the cost model (docs/BENCHMARKS.md, "Star or ring: 2 and 3 daisy-peers") ---------------
#: STAR_HOP_S / RING_HOP_S: one message from one peer process to another, its handling and
#: the receiver's wake-up included, in the star's step and in the ring's; MEMBER_S: what one
#: more member costs the star's coordinator per step beyond its bytes. The default run's fit
#: of ``bench.scaling --aggregate star,ring`` (docs/BENCHMARKS.md, "Star or ring"; a loaded
#: 2-core machine). LINK_B_S_PER_BYTE: seconds per wire byte (the raw data-channel rate of
#: the veth run); BYTES_PER_VALUE: wire bytes per parameter of a vector (the default run's
#: contribution: 15.2 kB for 9,610 parameters).
STAR_HOP_S = 7.7e-3
RING_HOP_S = 5.3e-3
MEMBER_S = 1.2e-3
LINK_B_S_PER_BYTE = 55e-9
BYTES_PER_VALUE = 1.5
#: wire bytes per parameter delta of a local-steps round between anchors (D = 32 fraction bits:
#: ~4 bytes each, docs/BENCHMARKS.md "Local steps: anchors")
LOCAL_BYTES_PER_VALUE = 4.0


def chunk_bounds(size: int, n: int) -> list[tuple[int, int]]:
    """The n chunks of a vector of ``size`` values: ``[c * size // n, (c + 1) * size // n)``."""
    return [(c * size // n, (c + 1) * size // n) for c in range(n)]


def star_seconds(n: int, micro: int, c: float, size: int, h: float = STAR_HOP_S, s: float = MEMBER_S,
                 b: float = LINK_B_S_PER_BYTE, w: float = BYTES_PER_VALUE) -> float:
    """A step by the star: T(n) = ceil(M/n) c + 2h + (n - 1) (s + 2 V b), V = size x w wire
    bytes: two hops on the critical path (the total with the next tasks down, a
    contribution up), and the coordinator sends and takes every member's whole vector, one
    after another."""
    v = size * w
    return math.ceil(micro / n) * c + 2 * h + (n - 1) * (s + 2 * v * b)


def ring_seconds(n: int, micro: int, c: float, size: int, h: float = RING_HOP_S,
                 b: float = LINK_B_S_PER_BYTE, w: float = BYTES_PER_VALUE) -> float:
    """A step by the ring: T(n) = ceil(M/n) c + (2n - 1) h + 2 (n - 1) b V / n: the plan
    (riding with the commit) and 2 (n - 1) chunk hops one after another, each V / n bytes."""
    v = size * w
    return math.ceil(micro / n) * c + (2 * n - 1) * h + 2 * (n - 1) * b * v / n


def ring_size(trainer, step: int) -> int:
    """The entries a ring of ``step`` sums: a local-steps round between anchors, its P
    parameter deltas (the moment blocks are zero by rule); any other step, the whole
    contribution (``trainer.total_size``)."""
    if trainer.total_size != trainer.layout.size and not trainer.is_anchor(step):
        return trainer.layout.size
    return trainer.total_size


def choose(aggregate: str, verify_rate: float, n: int, micro: int, c: float, size: int,
           local: bool = False, anchor: bool = False) -> tuple[str, str]:
    """(``star`` | ``ring``, why in words) for a step of ``n`` devices summing ``size``
    entries (``local``: a round of a local-steps run; ``anchor``: one whose contributions
    carry the inner moments, always by the star)."""
    if n < 2:
        return "star", "1 device"
    if local and anchor and aggregate != "star":
        return "star", (f"{n} devices, a local-steps anchor round (the coordinator checks each "
                        f"contribution's inner moments, which a ring would hide)")
    if verify_rate > 0:
        return "star", (f"{n} devices, spot-checks at rate {verify_rate:.3g} (a ring would hide "
                        f"the contributions from them)")
    rounds = "; anchor rounds by the star" if local else ""
    if aggregate == "ring":
        return "ring", f"{n} devices, no spot-checks (--aggregate ring){rounds}"
    if aggregate == "star":
        return "star", f"{n} devices (--aggregate star)"
    w, unit = (LOCAL_BYTES_PER_VALUE, "round") if local else (BYTES_PER_VALUE, "step")
    s, r = star_seconds(n, micro, c, size, w=w), ring_seconds(n, micro, c, size, w=w)
    model = f"the cost model: star {s * 1e3:.2f} ms, ring {r * 1e3:.2f} ms a {unit}"
    if r < s:
        return "ring", f"{n} devices, no spot-checks; {model}{rounds}"
    return "star", f"{n} devices; {model}"


class RingError(ValueError):
    """An incoming chunk that does not fit the ring; ``str(err)`` says what."""


class Ring:
    """One replica's part in one ring (one step, one ring number): plain state, no I/O."""

    def __init__(self, term: int, step: int, ring: int, peers, me: str, size: int, bound: int,
                 full: int | None = None):
        """``size``: the entries summed (:func:`ring_size`); ``full``: the total's entries, the
        rest zeros (default ``size``)."""
        self.full = size if full is None else full
        self.term, self.step, self.ring = term, step, ring
        self.peers = tuple(peers)
        self.n = len(self.peers)
        self.i = self.peers.index(me)
        self.prev = self.peers[self.i - 1]
        self.next = self.peers[(self.i + 1) % self.n]
        self.size = size
        self.bounds = chunk_bounds(size, self.n)
        self.bound = bound
        self.acc: np.ndarray | None = None   # own contribution, then partial sums, then the total
        self.queue: list[F.RingChunk] = []   # checked chunks that came before our contribution
        self.seen = 0                        # chunks taken or queued (the next one's sequence)
        self.total: np.ndarray | None = None

    def _send(self, phase: int, r: int, c: int) -> F.RingChunk:
        lo, hi = self.bounds[c]
        return F.RingChunk(self.term, self.step, self.ring, phase, r, c, self.acc[lo:hi].copy())

    def contribute(self, ints) -> list[F.RingChunk]:
        """This replica's contribution (its first ``size`` entries; the rest are zero by
        rule): the first chunk out, then whatever was waiting."""
        self.acc = np.array(np.asarray(ints)[:self.size], np.int64)
        out = [self._send(0, 0, self.i)]
        for msg in self.queue:
            out += self._take(msg)
        self.queue = []
        return out

    def receive(self, sender: str, msg: F.RingChunk) -> list[F.RingChunk]:
        """A chunk from ``sender``: checked, then summed or kept; raises RingError."""
        if (msg.term, msg.step, msg.ring) != (self.term, self.step, self.ring):
            raise RingError(f"it is of term {msg.term}, step {msg.step}, ring {msg.ring}; the "
                            f"ring is term {self.term}, step {self.step}, ring {self.ring}")
        if sender != self.prev:
            raise RingError(f"it comes from {sender}, not from the ring predecessor {self.prev}")
        last = self.n - 1
        if self.seen >= 2 * last:
            raise RingError("the ring already has all its chunks")
        want_phase, want_round = divmod(self.seen, last)
        if (msg.phase, msg.round) != (want_phase, want_round):
            raise RingError(f"it is phase {msg.phase} round {msg.round}; phase {want_phase} round "
                            f"{want_round} is due")
        want = (self.i - 1 - msg.round) % self.n if msg.phase == 0 else (self.i - msg.round) % self.n
        if msg.chunk != want:
            raise RingError(f"it is chunk {msg.chunk}; this ring position takes chunk {want}")
        lo, hi = self.bounds[want]
        ints = np.asarray(msg.ints)
        if ints.dtype.kind not in "iu" or ints.size != hi - lo:
            raise RingError(f"it holds {ints.size} values; chunk {want} has {hi - lo}")
        peak = past_bound(ints.astype(np.int64, copy=False), int(self.bound))
        if peak is not None:
            raise RingError(f"a value of magnitude {peak} is over the step's clamp bound {self.bound}")
        self.seen += 1
        if self.acc is None:
            self.queue.append(msg)
            return []
        return self._take(msg)

    def _take(self, msg: F.RingChunk) -> list[F.RingChunk]:
        lo, hi = self.bounds[msg.chunk]
        last = msg.round == self.n - 2
        if msg.phase == 0:
            self.acc[lo:hi] += np.asarray(msg.ints, np.int64)
            return [self._send(1, 0, msg.chunk) if last else self._send(0, msg.round + 1, msg.chunk)]
        self.acc[lo:hi] = np.asarray(msg.ints, np.int64)
        if last:
            pad = self.full - self.size
            self.total = self.acc if not pad else np.concatenate([self.acc, np.zeros(pad, np.int64)])
            return []
        return [self._send(1, msg.round + 1, msg.chunk)]


