"""The ring's two sides in the run protocol (the ring itself: :mod:`.ring`), behind the
aggregation interfaces of :mod:`.aggregator`; each holds a star for the steps the ring does
not sum.

- :class:`RingMember`, the :class:`~.member.Member`'s ``aggregation``: a member's
  ring state (the plan, its :class:`~.ring.Ring`, chunks that came early, the commit, the
  next step's plan, an end that overtook the last chunk), applying the total on the commit,
  asking for the state when its ring broke after the commit.
- :class:`RingCoordinator`, the :class:`~.coordinator.Coordinator`'s ``aggregation``:
  the choice star / ring, the plan, the sums, the commit, a ring
  member that left, a ring that missed its deadline (the step again by the star); the
  coordinator's own replica takes part in the ring through it.

Both share :class:`_RingPart` (this replica's ring and the early chunks). The driver routes
``ringplan`` / ``ringcommit`` to the member's side, ``ringsum`` to the coordinator's and
``ringchunk`` to the side of the role that speaks for the replica (``on_message``). A coordinator built at a
hand-over starts with no ring; stepping down drops the coordinator's with it.
"""

from __future__ import annotations

import numpy as np

from daisychain.engine.trainer import capacity_split
from daisychain.peer import frames as F
from daisychain.peer.run.aggregator import Aggregation, MemberAggregation, Star, StarMember
from daisychain.peer.run.outputs import Compute, Log, Output, Send
from daisychain.peer.run.ring import RING_KINDS, RING_SLACK_S, Ring, RingError, choose, ring_size


class _RingPart:
    """This replica's ring under ``role`` (a Member or a Coordinator: its ``peer``,
    ``trainer``, ``term``, ``step``, ``pending``)."""

    def __init__(self, role):
        self.role = role
        self.peer = role.peer
        self.early: dict = {}  # (term, step, ring) -> [(sender, chunk)] of rings not planned yet
        self.ring: Ring | None = None
        self.plan: F.RingPlan | None = None
        self.drop()

    def drop(self) -> None:
        """Rings under way are dropped (a new term, a restore, a catch-up, a broken ring)."""
        if self.plan is not None:
            for t in self.plan.tasks:
                self.role.pending.pop((self.plan.step, t.task), None)
        self.ring, self.plan = None, None

    def _owns(self, step: int, task: int) -> bool:
        """Is this compute this replica's share of its ring?"""
        return self.ring is not None and self.ring.step == step and any(
            t.task == task and t.peer == self.peer.me for t in self.plan.tasks)

    def _new(self, plan: F.RingPlan) -> tuple[list[Output], list]:
        """Take part in ``plan``: compute this replica's tasks (none: a zero contribution).
        Returns (outputs, the chunks that waited for the plan)."""
        self.drop()  # an abandoned ring's work is not wanted any more
        self.plan = plan
        tr, me = self.role.trainer, self.peer.me
        size = ring_size(tr, plan.step)  # a local round between anchors: its deltas alone
        self.ring = Ring(plan.term, plan.step, plan.ring, plan.peers, me, size,
                         int(tr.n_tasks * tr.limit), tr.total_size)
        out: list[Output] = []
        mine = [t for t in plan.tasks if t.peer == me]
        for t in mine:
            self.role.pending[(plan.step, t.task)] = t.micro
            out.append(Compute(plan.step, t.task, t.micro, tr.theta.copy(), self.role.term))
        if not mine:
            out += self._sends(self.ring.contribute(np.zeros(size, np.int64)))
        return out, self.early.pop((plan.term, plan.step, plan.ring), [])

    def _start(self, plan: F.RingPlan) -> list[Output]:
        out, early = self._new(plan)
        for sender, msg in early:
            out += self.on_ringchunk(sender, msg)
        return out

    def _sends(self, chunks) -> list[Output]:
        return [Send(self.ring.next, c) for c in chunks]

    def on_message(self, sender: str, msg) -> list[Output]:
        """``ringplan`` / ``ringcommit`` / ``ringsum`` / ``ringchunk``: its handler here."""
        return getattr(self, "on_" + type(msg).__name__.lower())(sender, msg)

    def on_ringchunk(self, sender: str, msg: F.RingChunk) -> list[Output]:
        role = self.role
        if role.trainer is None or msg.term < role.term or msg.step < role.step:
            return []  # an old term's or step's ring: nothing to do with it any more
        r = self.ring
        if r is not None and (msg.term, msg.step) == (r.term, r.step) and msg.ring < r.ring:
            return []  # an abandoned ring's
        if r is None or (msg.term, msg.step, msg.ring) != (r.term, r.step, r.ring):
            return self._keep(sender, msg)
        try:
            chunks = r.receive(sender, msg)
        except RingError as exc:
            return self._refused(sender, f"refused a ring chunk from {self.peer._name(sender)}: {exc}")
        out = self._sends(chunks)
        return out if r.total is None else out + self._gathered()

    def _refused(self, sender: str, text: str) -> list[Output]:
        return [Log(text, loud=True)]

    def _gathered(self) -> list[Output]:
        raise NotImplementedError

    def _keep(self, sender: str, msg: F.RingChunk) -> list[Output]:
        """A chunk of a ring this replica has no plan of yet (its predecessor is ahead):
        kept, at most two rings of 2 (n - 1) chunks, half a vector each."""
        role, name = self.role, self.peer._name(sender)
        size = ring_size(role.trainer, msg.step)
        key = (msg.term, msg.step, msg.ring)
        self.early = {k: v for k, v in self.early.items() if k[1] >= role.step and k[0] >= role.term}
        if msg.step > role.step + 1 or (key not in self.early and len(self.early) >= 2):
            return [Log(f"refused a ring chunk from {name}: step {msg.step} ring {msg.ring} is "
                        f"not planned here (step {role.step})", loud=True)]
        kept = self.early.setdefault(key, [])
        limit = 2 * (max(len(self.peer.room), 2) - 1)
        if len(kept) >= limit or np.asarray(msg.ints).size > size // 2 + 1:
            return [Log(f"refused a ring chunk from {name}: more or larger chunks than a ring of "
                        f"step {msg.step} has", loud=True)]
        kept.append((sender, msg))
        return []


class RingMember(_RingPart, MemberAggregation):
    """A member's ring (``member.aggregation``): ``commit`` (the commit of its ring), ``next``
    (the plan of the step after, while its ring still gathers), ``end`` (an end that
    overtook its last chunk); ``star``: a share outside a ring goes to the coordinator."""

    def __init__(self, member):
        self.star = StarMember(member)
        super().__init__(member)

    def drop(self) -> None:
        super().drop()
        self.commit: F.RingCommit | None = None
        self.next: F.RingPlan | None = None
        self.end: F.End | None = None

    def _new(self, plan: F.RingPlan):
        nxt = self.next
        out = super()._new(plan)
        self.next = nxt if nxt is not None and nxt.step > plan.step else None
        return out

    def computed(self, step, task, micro, grad, loss, correct) -> list[Output]:
        """A share of this replica's ring: into the ring, its sum to the coordinator; any
        other share: the star's."""
        if not self._owns(step, task):
            return self.star.computed(step, task, micro, grad, loss, correct)
        m = self.role
        micro = next(t.micro for t in self.plan.tasks if t.task == task)
        out = self._sends(self.ring.contribute(grad))
        return [Send(m.coord, F.RingSum(m.term, step, self.ring.ring, micro, loss, correct))] + out

    def _gathered(self) -> list[Output]:
        return self._maybe_apply()

    def on_ringplan(self, sender: str, msg: F.RingPlan) -> list[Output]:
        m = self.role
        if sender != m.coord or msg.term != m.term or m.trainer is None or self.peer.me not in msg.peers:
            return []
        if msg.step == m.step + 1:
            self.next = msg  # our ring of this step is still gathering
            return []
        if msg.step != m.step or (self.plan is not None and
                                  (self.plan.step, self.plan.ring) == (msg.step, msg.ring)):
            return []
        return self._start(msg)

    def on_ringcommit(self, sender: str, msg: F.RingCommit) -> list[Output]:
        m = self.role
        if sender != m.coord or msg.term != m.term or m.trainer is None or msg.step < m.step:
            return []
        plan = self.plan
        if msg.step > m.step or plan is None or (plan.step, plan.ring) != (msg.step, msg.ring):
            return [Log(f"missed step {m.step}'s ring: resyncing", loud=True),
                    Send(sender, F.SyncRequest(m.term, m.step, m.sha(), "behind"))]
        self.commit = msg
        return self._maybe_apply() or self.peers_changed()

    def _maybe_apply(self) -> list[Output]:
        m, r, c = self.role, self.ring, self.commit
        if r is None or c is None or r.total is None or r.step != m.step:
            return []
        total = r.total
        self.ring = None
        out = m._apply(total, c.loss, c.contributors, c.params_sha256, m.coord)
        nxt, self.next = self.next, None
        if nxt is not None and nxt.step == m.step and m.sha() == c.params_sha256:
            out += self._start(nxt)
        return out + self._ended()

    def holds_end(self, msg: F.End) -> bool:
        """The run's end overtook the last total this replica's
        ring is still gathering (the coordinator commits when it has the whole total; a
        member may still wait for a chunk): the end waits for it."""
        r = self.ring
        if r is None or r.total is not None or r.step != self.role.step or self.commit is None:
            return False
        self.end = msg
        return True

    def _ended(self) -> list[Output]:
        end, self.end = self.end, None
        return self.role.on_end(self.role.coord, end) if end is not None else []

    def peers_changed(self) -> list[Output]:
        """A channel closed, the room changed, or a commit came: when the coordinator committed our ring's step but a ring peer is gone before our part of
        the total came: ask for the state."""
        m, r, p = self.role, self.ring, self.peer
        if r is None or r.total is not None or self.commit is None or r.step != m.step or \
                        all(q in p.open and q in p.room for q in r.peers if q != p.me):
            return []
        self.ring = self.commit = None
        return [Log(f"a member left while step {m.step}'s ring was gathering: resyncing"),
                Send(m.coord, F.SyncRequest(m.term, m.step, m.sha(), "ring broken"))]

    def synced(self) -> list[Output]:
        """A state was loaded; a held plan of its step starts."""
        self.ring = self.commit = None
        nxt, self.next = self.next, None
        if nxt is not None and nxt.step == self.role.step and nxt.term == self.role.term:
            return self._start(nxt)
        return self._ended()


class RingCoordinator(_RingPart, Aggregation):
    """The coordinator's ring (``coordinator.aggregation``): ``said`` (the last choice
    logged), ``count`` (ring numbers of this term), ``star_step`` (a step redone by the
    star), ``until`` (the ring's deadline), ``sums`` (peer -> (task, micro, loss, correct));
    ``star``: the steps the ring does not sum."""

    def __init__(self, coordinator, star: Star):
        self.star = star
        self.said: tuple | None = None
        self.count = 0
        self.star_step = -1
        self.until = 0.0
        super().__init__(coordinator)

    def drop(self) -> None:
        super().drop()
        self.sums: dict = {}

    def _refused(self, sender: str, text: str) -> list[Output]:
        c = self.role
        if sender in c.members and sender not in c.banned:
            return c.trust.strike(sender, "refused", None, text)
        return [Log(text, loud=True)]

    def _gathered(self) -> list[Output]:
        return self._maybe_commit()

    def begin(self, live: list[str]) -> list[Output]:
        """The step by a ring or by the star (:meth:`_choice`)."""
        ring, said = self._choice(live)
        return said + (self._begin(live) if ring else self.star.begin(live))

    def _choice(self, live: list[str]) -> tuple[bool, list[Output]]:
        """Sum this step by a ring? Says so in the log when the choice or the number of
        devices changes."""
        c, p = self.role, self.peer
        if p.aggregate == "star":
            return False, []
        tr = c.trainer
        spm = c.self_spm if c.self_spm is not None else 1.0 / float(c.capacity or 1.0)
        local = tr.total_size != tr.layout.size
        anchor = local and tr.is_anchor(c.step)
        mode, why = choose(p.aggregate, c.verify_rate, len(live), tr.n_tasks, spm, ring_size(tr, c.step),
                           local=local, anchor=anchor)
        odd = [c.members[q].kind for q in live[1:] if q in c.members
               and c.members[q].kind not in RING_KINDS]
        if mode == "ring" and odd:
            mode, why = "star", f"{len(live)} devices, one of kind {odd[0]} among them (it has no ring)"
        if self.star_step == c.step:
            mode, why = "star", f"{len(live)} devices, this step's ring missed its deadline"
        out: list[Output] = []
        if anchor and mode == "star" and self.said is not None:
            return False, out  # the star for an anchor round, said once with the ring's reason
        if (mode, len(live)) != self.said:
            self.said = (mode, len(live))
            out.append(Log(f"aggregating by {mode}: {why}"))
        return mode == "ring", out

    def _begin(self, live: list[str]) -> list[Output]:
        """Split the step by capacity, one task per member (none for a member whose share is
        empty: it adds zeros), and send each member the ring's plan."""
        c = self.role
        out: list[Output] = []
        c.step_started = True
        c.tasks, c.checks = {}, {}
        ids = list(range(c.trainer.n_tasks))
        parts = capacity_split(ids, c._split_weights(live, len(ids)))
        tasks = []
        for peer, micro in zip(live, parts):
            if micro:
                tasks.append(F.Task(c.next_task, peer, tuple(micro)))
                c.next_task += 1
        self.count += 1
        plan = F.RingPlan(c.term, c.step, self.count, tuple(live), tuple(tasks))
        self.until = c.now + RING_SLACK_S + max(c._deadline(t.peer, len(t.micro)) for t in tasks)
        for q in live[1:]:
            out.append(Send(q, self._plan_for(plan, q)))
        mine, _ = self._new(plan)  # nothing can wait for a ring the coordinator just made
        return out + mine

    @staticmethod
    def _plan_for(plan: F.RingPlan, peer: str) -> F.RingPlan:
        return F.RingPlan(plan.term, plan.step, plan.ring, plan.peers,
                          tuple(t for t in plan.tasks if t.peer == peer))

    def computed(self, step, task, micro, grad, loss, correct) -> list[Output]:
        """Our own share of the ring; any other share: the star's."""
        if not self._owns(step, task):
            return self.star.computed(step, task, micro, grad, loss, correct)
        micro = next(t.micro for t in self.plan.tasks if t.task == task)
        out = self._sends(self.ring.contribute(grad))
        self.sums[self.peer.me] = (task, micro, loss, correct)
        return out + self._maybe_commit()

    def on_ringsum(self, sender: str, msg: F.RingSum) -> list[Output]:
        c, plan = self.role, self.plan
        if plan is None or self.ring is None or \
                (msg.term, msg.step, msg.ring) != (c.term, plan.step, plan.ring):
            return []
        task = next((t for t in plan.tasks if t.peer == sender), None)
        if task is None or task.micro != msg.micro or sender in self.sums:
            return []
        self.sums[sender] = (task.task, msg.micro, msg.loss, msg.correct)
        return self._maybe_commit()

    def _maybe_commit(self) -> list[Output]:
        c, r, plan = self.role, self.ring, self.plan
        if r is None or r.total is None or r.step != c.step or any(
                t.peer not in self.sums for t in plan.tasks):
            return []
        step, total = c.step, r.total
        sums = sorted(self.sums.items(), key=lambda kv: kv[1][0])  # task order, as the star
        contributors = tuple(sorted((p, len(s[1])) for p, s in sums))
        loss = sum(s[2] for _, s in sums) / max(sum(len(s[1]) for _, s in sums), 1)
        c.trainer.apply(total)
        unchecked = {p for p, _ in contributors if p != c.me}
        c.trust.record(step, total, unchecked)
        sha = c._hash()
        self.ring, c.step_started = None, False
        c.pending = {k: v for k, v in c.pending.items() if k[0] > step}
        out: list[Output] = []
        for p in c._receivers():  # a ring member gets the commit; anyone else the total
            if p in plan.peers:
                out.append(Send(p, F.RingCommit(c.term, step, plan.ring, contributors, loss, sha)))
            else:
                out.append(Send(p, F.Total(c.term, step, contributors, loss, sha, total)))
        return out + c.member.committed(step, loss, contributors, sha) + c._maybe_begin()

    def member_left(self, peer: str, gone, quiet: bool) -> list[Output]:
        """A ring member left before the step was committed (its part of the total, or its
        sum, may be missing): abandon the ring, do the step again with those still here.
        Anyone else: the star's."""
        c, r = self.role, self.ring
        if r is None or peer not in r.peers:
            return self.star.member_left(peer, gone, quiet)
        self.drop()
        c.step_started = False
        return [Log(f"{self.peer._name(peer)} left during step {c.step}: its ring is abandoned, "
                    f"the step is done again by the others")] + c._maybe_begin()

    def deadline(self) -> list[Output]:
        """The star's tasks past their deadline; a ring not gathered by its deadline is
        abandoned, the step is done again by the star."""
        out = self.star.deadline()
        c, r = self.role, self.ring
        if r is None or r.total is not None or c.now < self.until:
            return out
        self.drop()
        c.step_started = False
        self.star_step = c.step
        return out + [Log(f"the ring of step {c.step} missed its deadline: the step is done "
                          f"again by the star", loud=True)] + c._maybe_begin()

    def resend(self, peer: str) -> list[Output]:
        """A ring member that asked for the state gets the plan of the step under way after
        it."""
        plan = self.plan
        if self.ring is None or plan is None or peer not in plan.peers:
            return []
        return [Send(peer, self._plan_for(plan, peer))]
