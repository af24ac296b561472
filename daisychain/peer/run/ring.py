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

:class:`RingRole` is mixed into :class:`~.driver.RunPeer`; the roles' files call it through
hooks marked ``# ring hook``.
"""

from __future__ import annotations

import math

import numpy as np

from daisychain.engine.trainer import capacity_split
from daisychain.peer import frames as F
from daisychain.peer.run.outputs import Compute, Log, Output, Send

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


def chunk_bounds(size: int, n: int) -> list[tuple[int, int]]:
    """The n chunks of a vector of ``size`` values: ``[c * size // n, (c + 1) * size // n)``."""
    return [(c * size // n, (c + 1) * size // n) for c in range(n)]


def star_seconds(n: int, micro: int, c: float, size: int, h: float = STAR_HOP_S, s: float = MEMBER_S,
                 b: float = LINK_B_S_PER_BYTE) -> float:
    """A step by the star: T(n) = ceil(M/n) c + 2h + (n - 1) (s + 2 V b): two hops on the
    critical path (the total with the next tasks down, a contribution up), and the
    coordinator sends and takes every member's whole vector, one after another."""
    v = size * BYTES_PER_VALUE
    return math.ceil(micro / n) * c + 2 * h + (n - 1) * (s + 2 * v * b)


def ring_seconds(n: int, micro: int, c: float, size: int, h: float = RING_HOP_S,
                 b: float = LINK_B_S_PER_BYTE) -> float:
    """A step by the ring: T(n) = ceil(M/n) c + (2n - 1) h + 2 (n - 1) b V / n: the plan
    (riding with the commit) and 2 (n - 1) chunk hops one after another, each V / n bytes."""
    v = size * BYTES_PER_VALUE
    return math.ceil(micro / n) * c + (2 * n - 1) * h + 2 * (n - 1) * b * v / n


def choose(aggregate: str, verify_rate: float, n: int, micro: int, c: float, size: int) -> tuple[str, str]:
    """(``star`` | ``ring``, why in words) for a step of ``n`` devices."""
    if n < 2:
        return "star", "1 device"
    if verify_rate > 0:
        return "star", (f"{n} devices, spot-checks at rate {verify_rate:.3g} (a ring would hide "
                        f"the contributions from them)")
    if aggregate == "ring":
        return "ring", f"{n} devices, no spot-checks (--aggregate ring)"
    if aggregate == "star":
        return "star", f"{n} devices (--aggregate star)"
    s, r = star_seconds(n, micro, c, size), ring_seconds(n, micro, c, size)
    model = f"the cost model: star {s * 1e3:.2f} ms, ring {r * 1e3:.2f} ms a step"
    if r < s:
        return "ring", f"{n} devices, no spot-checks; {model}"
    return "star", f"{n} devices; {model}"


class RingError(ValueError):
    """An incoming chunk that does not fit the ring; ``str(err)`` says what."""


class Ring:
    """One replica's part in one ring (one step, one ring number): plain state, no I/O."""

    def __init__(self, term: int, step: int, ring: int, peers, me: str, size: int, bound: int):
        self.term, self.step, self.ring = term, step, ring
        self.peers = tuple(peers)
        self.n = len(self.peers)
        self.i = self.peers.index(me)
        self.prev = self.peers[self.i - 1]
        self.next = self.peers[(self.i + 1) % self.n]
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
        """This replica's contribution: the first chunk out, then whatever was waiting."""
        self.acc = np.array(ints, np.int64)
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
        peak = int(np.abs(ints.astype(np.int64)).max()) if ints.size else 0
        if peak > self.bound:
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
            self.total = self.acc
            return []
        return [self._send(1, msg.round + 1, msg.chunk)]


class RingRole:
    """Mixed into :class:`~.driver.RunPeer`: the ring's part of the coordinator and of the
    member. State (set by :meth:`_ring_init`): ``ring`` (this replica's current
    :class:`Ring`), ``ring_plan``, ``ring_sums`` (coordinator: peer -> (task, micro, loss,
    correct)), ``ring_commit`` (member: the commit of its ring), ``ring_next`` (member: the
    plan of the step after), ``ring_early`` (chunks of rings not planned here yet)."""

    def _ring_init(self, aggregate: str) -> None:
        if aggregate not in AGGREGATES:
            raise ValueError(f"the aggregation must be one of {', '.join(AGGREGATES)}")
        if aggregate == "ring" and self.verify_rate > 0:
            raise ValueError("--aggregate ring needs --verify-rate 0: a ring hides each "
                             "contribution from the spot-checks")
        self.aggregate = aggregate
        self.ring_said: tuple | None = None
        self.ring_count = 0
        self.ring_star_step = -1
        self.ring_deadline = 0.0
        self.ring_early: dict = {}
        self.ring_sums: dict = {}
        self.ring_plan: F.RingPlan | None = None
        self._ring_drop()

    def _ring_drop(self) -> None:
        """# ring hook (a new term, a restore, a catch-up): rings under way are dropped."""
        if self.ring_plan is not None:
            for t in self.ring_plan.tasks:
                self.pending.pop((self.ring_plan.step, t.task), None)
        self.ring: Ring | None = None
        self.ring_plan = None
        self.ring_sums = {}
        self.ring_commit: F.RingCommit | None = None
        self.ring_next: F.RingPlan | None = None
        self.ring_end: F.End | None = None

    def _ring_owns(self, step: int, task: int) -> bool:
        """# ring hook (driver.computed): is this compute this replica's share of its ring?"""
        return self.ring is not None and self.ring.step == step and any(
            t.task == task for t in self.ring_plan.tasks if t.peer == self.me)

    def _ring_new(self, plan: F.RingPlan) -> tuple[list[Output], list]:
        """Take part in ``plan``: compute this replica's tasks (none: a zero contribution).
        Returns (outputs, the chunks that waited for the plan)."""
        nxt = self.ring_next
        self._ring_drop()  # an abandoned ring's work is not wanted any more
        self.ring_next = nxt if nxt is not None and nxt.step > plan.step else None
        self.ring_plan = plan
        tr = self.trainer
        self.ring = Ring(plan.term, plan.step, plan.ring, plan.peers, self.me, tr.layout.size,
                         int(tr.hp.n_micro * tr.limit))
        out: list[Output] = []
        mine = [t for t in plan.tasks if t.peer == self.me]
        for t in mine:
            self.pending[(plan.step, t.task)] = t.micro
            out.append(Compute(plan.step, t.task, t.micro, tr.theta.copy()))
        if not mine:
            out += self._ring_sends(self.ring.contribute(np.zeros(tr.layout.size, np.int64)))
        return out, self.ring_early.pop((plan.term, plan.step, plan.ring), [])

    def _ring_start(self, plan: F.RingPlan) -> list[Output]:
        out, early = self._ring_new(plan)
        for sender, msg in early:
            out += self._on_ringchunk(sender, msg)
        return out

    def _ring_sends(self, chunks) -> list[Output]:
        return [Send(self.ring.next, c) for c in chunks]

    def _ring_computed(self, step: int, task: int, grad, loss: float, correct: int) -> list[Output]:
        """# ring hook (driver.computed): this replica's share of its ring is computed."""
        micro = next(t.micro for t in self.ring_plan.tasks if t.task == task)
        out = self._ring_sends(self.ring.contribute(grad))
        if self.coordinating:
            self.ring_sums[self.me] = (task, micro, loss, correct)
            return out + self._ring_maybe_commit()
        return [Send(self.coord, F.RingSum(self.term, step, self.ring.ring, micro, loss, correct))] + out

    # -- every replica: chunks -------------------------------------------------------------

    def _on_ringchunk(self, sender: str, msg: F.RingChunk) -> list[Output]:
        if self.trainer is None or msg.term < self.term or msg.step < self.step:
            return []  # an old term's or step's ring: nothing to do with it any more
        r = self.ring
        if r is not None and (msg.term, msg.step) == (r.term, r.step) and msg.ring < r.ring:
            return []  # an abandoned ring's
        if r is None or (msg.term, msg.step, msg.ring) != (r.term, r.step, r.ring):
            return self._ring_keep(sender, msg)
        try:
            chunks = r.receive(sender, msg)
        except RingError as exc:
            text = f"refused a ring chunk from {self._name(sender)}: {exc}"
            if self.coordinating and sender in self.members and sender not in self.banned:
                return self._strike(sender, "refused", None, text)
            return [Log(text, loud=True)]
        out = self._ring_sends(chunks)
        if r.total is None:
            return out
        return out + (self._ring_maybe_commit() if self.coordinating else self._ring_maybe_apply())

    def _ring_keep(self, sender: str, msg: F.RingChunk) -> list[Output]:
        """A chunk of a ring this replica has no plan of yet (its predecessor is ahead):
        kept, at most two rings of 2 (n - 1) chunks, half a vector each."""
        size = self.trainer.layout.size
        key = (msg.term, msg.step, msg.ring)
        self.ring_early = {k: v for k, v in self.ring_early.items()
                           if k[1] >= self.step and k[0] >= self.term}
        if msg.step > self.step + 1 or (key not in self.ring_early and len(self.ring_early) >= 2):
            return [Log(f"refused a ring chunk from {self._name(sender)}: step {msg.step} ring "
                        f"{msg.ring} is not planned here (step {self.step})", loud=True)]
        kept = self.ring_early.setdefault(key, [])
        limit = 2 * (max(len(self.room), 2) - 1)
        if len(kept) >= limit or np.asarray(msg.ints).size > size // 2 + 1:
            return [Log(f"refused a ring chunk from {self._name(sender)}: more or larger chunks "
                        f"than a ring of step {msg.step} has", loud=True)]
        kept.append((sender, msg))
        return []

    # -- member ----------------------------------------------------------------------------

    def _on_ringplan(self, sender: str, msg: F.RingPlan) -> list[Output]:
        if self.coordinating or sender != self.coord or msg.term != self.term or self.trainer is None \
                or self.me not in msg.peers:
            return []
        if msg.step == self.step + 1:
            self.ring_next = msg  # our ring of this step is still gathering
            return []
        if msg.step != self.step or (self.ring_plan is not None and
                                     (self.ring_plan.step, self.ring_plan.ring) == (msg.step, msg.ring)):
            return []
        return self._ring_start(msg)

    def _on_ringsum(self, sender: str, msg: F.RingSum) -> list[Output]:
        plan = self.ring_plan
        if not self.coordinating or plan is None or self.ring is None or \
                (msg.term, msg.step, msg.ring) != (self.term, plan.step, plan.ring):
            return []
        task = next((t for t in plan.tasks if t.peer == sender), None)
        if task is None or task.micro != msg.micro or sender in self.ring_sums:
            return []
        self.ring_sums[sender] = (task.task, msg.micro, msg.loss, msg.correct)
        return self._ring_maybe_commit()

    def _on_ringcommit(self, sender: str, msg: F.RingCommit) -> list[Output]:
        if self.coordinating or sender != self.coord or msg.term != self.term or self.trainer is None \
                or msg.step < self.step:
            return []
        plan = self.ring_plan
        if msg.step > self.step or plan is None or (plan.step, plan.ring) != (msg.step, msg.ring):
            return [Log(f"missed step {self.step}'s ring: resyncing", loud=True),
                    Send(sender, F.SyncRequest(self.term, self.step, self._hash(), "behind"))]
        self.ring_commit = msg
        return self._ring_maybe_apply() or self._ring_stuck()

    def _ring_maybe_apply(self) -> list[Output]:
        r, c = self.ring, self.ring_commit
        if r is None or c is None or r.total is None or r.step != self.step:
            return []
        total = r.total
        self.ring = None
        out = self._apply(total, c.loss, c.contributors, c.params_sha256, self.coord)
        nxt, self.ring_next = self.ring_next, None
        if nxt is not None and nxt.step == self.step and self._hash() == c.params_sha256:
            out += self._ring_start(nxt)
        return out + self._ring_ended()

    def _ring_holds_end(self, msg: F.End) -> bool:
        """# ring hook (member._on_end): the run's end overtook the last total this replica's
        ring is still gathering (the coordinator commits when it has the whole total; a
        member may still wait for a chunk): the end waits for it."""
        r = self.ring
        if r is None or r.total is not None or r.step != self.step or self.ring_commit is None:
            return False
        self.ring_end = msg
        return True

    def _ring_ended(self) -> list[Output]:
        end, self.ring_end = self.ring_end, None
        return self._on_end(self.coord, end) if end is not None else []

    def _ring_stuck(self) -> list[Output]:
        """# ring hook (member: a channel closed, the room changed, a commit came): the
        coordinator committed our ring's step but a ring peer is gone before our part of
        the total came: ask for the state."""
        r = self.ring
        if self.coordinating or r is None or r.total is not None or self.ring_commit is None or \
                r.step != self.step or all(p in self.open and p in self.room for p in r.peers if p != self.me):
            return []
        self.ring = self.ring_commit = None
        return [Log(f"a member left while step {self.step}'s ring was gathering: resyncing"),
                Send(self.coord, F.SyncRequest(self.term, self.step, self._hash(), "ring broken"))]

    def _ring_synced(self) -> list[Output]:
        """# ring hook (member._on_state): a state was loaded; a held plan of its step starts."""
        self.ring = self.ring_commit = None
        nxt, self.ring_next = self.ring_next, None
        if nxt is not None and nxt.step == self.step and nxt.term == self.term:
            return self._ring_start(nxt)
        return self._ring_ended()

    # -- coordinator -----------------------------------------------------------------------

    def _ring_choice(self, live: list[str]) -> tuple[bool, list[Output]]:
        """# ring hook (coordinator._begin_step): sum this step by a ring? Says so in the log
        when the choice or the number of devices changes."""
        if self.aggregate == "star":
            return False, []
        tr = self.trainer
        c = self.self_spm if self.self_spm is not None else 1.0 / float(self.capacity or 1.0)
        mode, why = choose(self.aggregate, self.verify_rate, len(live), tr.hp.n_micro, c, tr.layout.size)
        odd = [self.members[p].kind for p in live[1:] if p in self.members
               and self.members[p].kind not in RING_KINDS]
        if mode == "ring" and odd:
            mode, why = "star", f"{len(live)} devices, one of kind {odd[0]} among them (it has no ring)"
        if self.ring_star_step == self.step:
            mode, why = "star", f"{len(live)} devices, this step's ring missed its deadline"
        out: list[Output] = []
        if (mode, len(live)) != self.ring_said:
            self.ring_said = (mode, len(live))
            out.append(Log(f"aggregating by {mode}: {why}"))
        return mode == "ring", out

    def _ring_begin(self, live: list[str]) -> list[Output]:
        """Split the step by capacity, one task per member (none for a member whose share is
        empty: it adds zeros), and send each member the ring's plan."""
        out: list[Output] = []
        self.step_started = True
        self.tasks, self.checks = {}, {}
        ids = list(range(self.trainer.hp.n_micro))
        parts = capacity_split(ids, self._split_weights(live, len(ids)))
        tasks = []
        for peer, micro in zip(live, parts):
            if micro:
                tasks.append(F.Task(self.next_task, peer, tuple(micro)))
                self.next_task += 1
        self.ring_count += 1
        plan = F.RingPlan(self.term, self.step, self.ring_count, tuple(live), tuple(tasks))
        self.ring_deadline = self.now + RING_SLACK_S + max(
            self._deadline(t.peer, len(t.micro)) for t in tasks)
        for p in live[1:]:
            out.append(Send(p, self._ring_plan_for(plan, p)))
        mine, _ = self._ring_new(plan)  # nothing can wait for a ring the coordinator just made
        return out + mine

    def _ring_plan_for(self, plan: F.RingPlan, peer: str) -> F.RingPlan:
        return F.RingPlan(plan.term, plan.step, plan.ring, plan.peers,
                          tuple(t for t in plan.tasks if t.peer == peer))

    def _ring_maybe_commit(self) -> list[Output]:
        r, plan = self.ring, self.ring_plan
        if r is None or r.total is None or r.step != self.step or any(
                t.peer not in self.ring_sums for t in plan.tasks):
            return []
        step, total = self.step, r.total
        sums = sorted(self.ring_sums.items(), key=lambda kv: kv[1][0])  # task order, as the star
        contributors = tuple(sorted((p, len(s[1])) for p, s in sums))
        loss = sum(s[2] for _, s in sums) / max(sum(len(s[1]) for _, s in sums), 1)
        self.trainer.apply(total)
        unchecked = {p for p, _ in contributors if p != self.me}
        self.window.record(self.trainer, step, total, unchecked)
        for p in unchecked:
            self.unchecked_since.setdefault(p, step)
        sha = self._hash()
        self.ring, self.step_started = None, False
        self.pending = {k: v for k, v in self.pending.items() if k[0] > step}
        out: list[Output] = []
        for p in self._receivers():  # a ring member gets the commit; anyone else the total
            if p in plan.peers:
                out.append(Send(p, F.RingCommit(self.term, step, plan.ring, contributors, loss, sha)))
            else:
                out.append(Send(p, F.Total(self.term, step, contributors, loss, sha, total)))
        return out + self._committed(step, loss, contributors, sha) + self._maybe_begin()

    def _ring_member_left(self, peer: str) -> list[Output] | None:
        """# ring hook (coordinator._member_left): a ring member left before the step was
        committed (its part of the total, or its sum, may be missing): abandon the ring, do
        the step again with those still here."""
        r = self.ring
        if not self.coordinating or r is None or peer not in r.peers:
            return None
        self._ring_drop()
        self.step_started = False
        return [Log(f"{self._name(peer)} left during step {self.step}: its ring is abandoned, "
                    f"the step is done again by the others")] + self._maybe_begin()

    def _ring_check_deadline(self) -> list[Output]:
        """# ring hook (tick): a ring not gathered by its deadline is abandoned; the step is
        done again by the star."""
        r = self.ring
        if not self.coordinating or r is None or r.total is not None or self.now < self.ring_deadline:
            return []
        self._ring_drop()
        self.step_started = False
        self.ring_star_step = self.step
        return [Log(f"the ring of step {self.step} missed its deadline: the step is done "
                    f"again by the star", loud=True)] + self._maybe_begin()

    def _ring_resend(self, peer: str) -> list[Output]:
        """# ring hook (coordinator._on_syncrequest): a ring member that asked for the state
        gets the plan of the step under way after it."""
        plan = self.ring_plan
        if not self.coordinating or self.ring is None or plan is None or peer not in plan.peers:
            return []
        return [Send(peer, self._ring_plan_for(plan, peer))]
