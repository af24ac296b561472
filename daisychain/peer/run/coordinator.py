"""The coordinator role (the room host): announce the run, admit members, split each step
into tasks (:mod:`.split`), dispatch them, give late ones a backup, collect contributions
and commit the step's total (:mod:`.aggregator`) to everyone; restore the room from a state.
A :class:`Coordinator` is built from this peer's :class:`~.member.Member` when the peer
becomes the room's host (hand-over) and dropped when it steps down. It reads the replica only
through the member's narrow interface (``trainer``, ``bounds``, ``step``, ``sha()``,
``state()``, ``load()``, ``committed()``) and the room through the driver; every attribute of
the coordinating (members, tasks, checks) lives here. It holds its trust in the members, a
:class:`~.trust.Trust` (strikes, the removed list, the rollback window), and delegates to
it; the catch-up (:mod:`.catchup`) is its methods."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from daisychain.peer import frames as F
from daisychain.peer.intcodec import past_bound
from daisychain.peer.run.aggregator import Aggregation, Star, _Check, _Task
from daisychain.peer.run.catchup import SYNC_WAIT_S, CatchUpRole
from daisychain.peer.run.outputs import Compute, Ended, Log, Output, Refused, Send
from daisychain.peer.run.ring_roles import RingCoordinator
from daisychain.peer.run.split import finish_shares
from daisychain.peer.run.trust import Trust

#: smallest and initial deadline (seconds) of a task
MIN_DEADLINE_S = 2.0
DEADLINE_FACTOR = 4.0
#: after a restore, how long the coordinator waits for the members to load the state
#: at the start, how long the host waits for the members it announced the run to
START_WAIT_S = 20.0


@dataclass
class _Member:
    id: str
    capacity: float = 1.0
    kind: str = "python"
    ready: bool = False          # sent Ready for this term
    synced: bool = False         # its replica is at the coordinator's step (or will be by order)
    refused: bool = False
    sec_per_micro: float = 1.0   # adaptive deadline estimate
    link_s: float = 0.0          # seconds its link adds to a step (estimate, see _time_task)
    timed: int = 0               # shares of it timed (the first is left out: warm-up)
    done: int = 0                # micro-batches committed from it
    ahead: tuple[int, str] | None = None  # (step, params hash) it said it holds, past ours
    ahead_until: float = 0.0     # ... until then another member may confirm it
    answered: tuple[int, int] | None = None  # (term, step) of the last sync request answered


def _of_peer(name: str) -> property:
    return property(lambda self: getattr(self.peer, name))


class Coordinator(CatchUpRole):
    """The room host's side of the run. ``peer``: the run context (read-only: settings, room, clock);
    ``member``: this peer's replica, which the coordinator commits to."""

    def __init__(self, peer, member):
        self.peer = peer
        self.member = member
        member.lead()
        self.term = member.term + 1
        self.ended = member.ended
        self.wait_peers = peer.wait_peers  # the host waits once, at the start (the driver's ends now)
        self.steps = peer.steps  # the run's length (a restore may change it: a Setting tells the driver)
        self.members: dict[str, _Member] = {}
        self.tasks: dict[int, _Task] = {}
        self.checks: dict[int, _Check] = {}
        self.next_task = 0
        self.pending: dict[tuple[int, int], tuple[int, ...]] = {}  # our own tasks: (step, task) -> micro
        self.own_micro: dict[tuple[int, int], int] = {}  # ... -> their micro-batch count, until the shell times them
        self.own_spm: float | None = None   # our own seconds per micro-batch, from every compute the shell timed
        self.step_started = False
        self.self_spm: float | None = None  # our own seconds per micro-batch
        self.self_fixed = 0.0  # what our own share waits beyond its compute (the step's handling)
        self.timing_from = self.step + 1    # ... timed from this step on (a term's first warms up)
        self.excused: set[str] = set()      # peers whose first share's lateness was excused (once)
        self.catching_up = False
        self.catch_from: str | None = None  # the member ahead whose state we asked for
        self.catch_until = 0.0
        self.catch_report: tuple[int, str] | None = None  # the (step, hash) we asked it for
        self.asked_state: set[str] = set()  # members we asked for their state
        self.restored_term = -1             # this term's state came from a restore
        self.wait_for: set[str] = set()     # members to hear from before a step
        self.wait_until = 0.0
        #: strikes, the liars removed from the run (handed over) and the rollback window
        self.trust = Trust(self, member.removed, member.window_for())
        self.run: F.Run | None = None  # our announce (made by begin())
        #: how a step is summed (aggregator.py): the ring, which hands the star the steps it
        #: does not sum (every step, with --aggregate star)
        self.aggregation: Aggregation = RingCoordinator(self, Star(self))

    # -- what the coordinator reads: the replica through the member, the room through the peer

    @property
    def trainer(self):
        return self.member.trainer

    @property
    def bounds(self):
        return self.member.bounds

    @property
    def step(self) -> int:
        return self.member.step

    def _hash(self) -> str:
        return self.member.sha()

    @property
    def banned(self) -> set[str]:
        """The peers removed from the run (liars): the trust's, read only."""
        return self.trust.removed

    @property
    def window(self):
        """The rollback window: the trust's, read only."""
        return self.trust.window

    # the room and the run's settings: the driver's, read only
    me, now, open, room, names, capacity, verify_rate, strikes = (
        _of_peer(n) for n in ("me", "now", "open", "room", "names", "capacity", "verify_rate",
                              "strikes"))

    def _name(self, peer: str) -> str:
        return self.peer._name(peer)

    def _announce(self) -> F.Run:
        tr = self.trainer
        return F.Run(tr.identity, tr.run_id, self.steps, self.term, self.step, self._hash(), self.me,
                     self.verify_rate, self.strikes, tuple(sorted(self.banned)))

    def _announce_targets(self) -> list[str]:
        return sorted(p for p in self.open if p in self.room and p != self.me and p not in self.banned)

    def begin(self, old_host: str | None) -> list[Output]:
        """Announce the run (a new term) to everyone with an open channel."""
        self.run = self._announce()
        out: list[Output] = [Log(f"coordinating the run from step {self.step} (term {self.term})")]
        return out + [Send(p, self._announce()) for p in self._announce_targets()] + self.trust.tell_removed()

    def start(self) -> list[Output]:
        """The host of a new room: members the run was announced to get a while to answer
        before the first step."""
        self.wait_for, self.wait_until = set(self._announce_targets()), self.now + START_WAIT_S
        return self._maybe_begin()

    def tick(self) -> list[Output]:
        if self.ended:
            return []
        return self._check_catch_up() + self.aggregation.deadline() + self._maybe_begin()

    def room_left(self) -> list[Output]:
        """The signaling room changed: members no longer in it left."""
        out: list[Output] = []
        for m in [m for m in self.members if m not in self.room]:
            out += self.member_left(m)
        return out

    def channel_open(self, peer: str) -> list[Output]:
        if self.run and not self.ended:
            return [Send(peer, self._announce())]
        return []

    def bad_message(self, sender: str, reason: str) -> list[Output]:
        if sender in self.members and sender not in self.banned:
            return self.trust.strike(sender, "refused", None,
                                f"refused a message from {self._name(sender)}: {reason}")
        return [Log(f"refused a message from {self._name(sender)}: {reason}", loud=True)]

    def compute_took(self, step: int, task: int, seconds: float) -> None:
        """The shell timed our own compute of ``task`` (before :meth:`computed`): the split
        then learns our seconds per micro-batch apart from what the step's handling (sum,
        Adam, hash, encoding) adds before our share starts (``self_fixed``), and our own
        deadlines follow every compute timed from ``timing_from`` on (``own_spm``), also one
        whose step a backup's answer already closed: timed only by the split's share, a
        coordinator slower than its deadline was never timed, as a backup answered first
        every step."""
        t = self.tasks.get(task)
        if t is not None and step == self.step and seconds >= 0:
            t.busy_s = float(seconds)
        n = self.own_micro.pop((step, task), 0)
        if n and seconds >= 0 and step >= self.timing_from:
            per = float(seconds) / n
            self.own_spm = per if self.own_spm is None else 0.5 * self.own_spm + 0.5 * per

    def computed(self, step: int, task: int, result, term: int | None = None) -> list[Output]:
        if term is not None and term != self.term:
            return []  # asked in another term (as a member, or a coordinator before): its task numbers differ
        micro = self.pending.pop((step, task), None)
        if micro is None or self.ended:
            return []
        loss = float(np.sum(result.loss)) if len(result.loss) else 0.0
        correct = int(np.sum(result.correct))
        return self.aggregation.computed(step, task, micro, result.grad, loss, correct)

    def on_ready(self, sender: str, msg: F.Ready) -> list[Output]:
        if msg.term != self.term:
            return []
        if sender in self.banned:
            return [Log(f"{self._name(sender)} was removed from the run: its ready is ignored", loud=True)]
        if self.ended:  # it answered our announce after the last step: the state and the end
            return self._late_end(sender, msg)
        m = self.members.setdefault(sender, _Member(sender))
        m.capacity = max(msg.capacity, 1e-3)
        m.kind, m.ready, m.refused = msg.kind, True, False
        m.sec_per_micro = 1.0 / m.capacity
        m.ahead = None
        if msg.step == self.step and msg.params_sha256 == self._hash():
            m.synced = True
            rate = (f"{msg.capacity:.2f} replica rounds/s" if self.trainer.hp.local
                    else f"{msg.capacity:.0f} micro-batches/s")  # a local-steps run's tasks are rounds
            return [Log(f"{sender} is ready ({msg.kind}, {rate})")] + \
                self._maybe_begin()
        if msg.step > self.step and self.restored_term != self.term:
            # it holds a later step than we do: take its state once another member reports the
            # same (not after a restore: then the restored state is the run's)
            m.ahead, m.ahead_until = (msg.step, msg.params_sha256), self.now + SYNC_WAIT_S
            return self._ahead(sender)
        m.synced = True  # by channel order the state arrives before the next assign / total
        return [Log(f"{sender} joins at step {self.step}: sending the state"),
                Send(sender, self._state())] + self._maybe_begin()

    def _state(self) -> F.State:
        return self.member.state()

    def _new_window(self) -> None:
        """The rollback window: the member's (one object; it goes on across terms, and across
        a restore or a catch-up that loads a state it leads to: ``Window.rebase``)."""
        self.trust.use_window(self.member.window_for())

    def on_refuse(self, sender: str, msg: F.Refuse) -> list[Output]:
        m = self.members.setdefault(sender, _Member(sender))
        m.refused, m.ready, m.synced = True, False, False
        return [Refused(sender, msg.reasons)] + self.member_left(sender, quiet=True) + \
            self._maybe_begin()

    def on_contrib(self, sender: str, msg: F.Contrib) -> list[Output]:
        if msg.term != self.term or sender in self.banned:
            return []
        bound = len(msg.micro) * self.trainer.limit
        ints = np.asarray(msg.ints)
        if ints.dtype.kind not in "iu" or ints.size != self.trainer.total_size:
            return self.trust.strike(sender, "refused", None, f"refused a contribution from "
                                f"{self._name(sender)}: not {self.trainer.total_size} integers")
        peak = past_bound(ints.astype(np.int64, copy=False), int(bound))
        if peak is not None:
            return self.trust.strike(sender, "refused", None, f"refused a contribution from "
                                f"{self._name(sender)}: a value of magnitude {peak} is over the "
                                f"clamp bound {int(bound)} of {len(msg.micro)} micro-batch(es)")
        why = self.trainer.contribution_error(ints, msg.micro, msg.step)  # local steps: moments
        if why:
            return self.trust.strike(sender, "refused", None, f"refused a contribution from "
                                f"{self._name(sender)}: {why}")
        return self._take_contrib(sender, msg.step, msg.task, msg.micro, msg.ints, msg.loss,
                                  msg.correct)

    def _live(self) -> list[str]:
        """Peers that take work this step, in a fixed order (self first)."""
        return [self.me] + sorted(m.id for m in self.members.values()
                                  if m.synced and m.ready and not m.refused and m.id in self.room
                                  and m.id in self.open and m.id not in self.banned)

    def _cap(self, peer: str) -> float:
        return float(self.capacity or 1.0) if peer == self.me else self.members[peer].capacity

    def _maybe_begin(self) -> list[Output]:
        if self.step_started or self.catching_up or self.ended:
            return []
        if self.step >= self.steps:
            return self._end()
        if self.wait_for and self.now < self.wait_until and any(
                p in self.room and p in self.open and not self._answered(p) for p in self.wait_for):
            return []  # after a restore: give the members time to load the state
        self.wait_for = set()
        live = self._live()
        if len(live) - 1 < self.wait_peers:
            return []
        self.wait_peers = 0  # wait once, at the start
        return self.aggregation.begin(live)

    def _split_weights(self, live: list[str], n: int) -> list[float]:
        """The capacities, or once a member's link costs time, shares that make everyone
        finish together (:func:`finish_shares`: the coordinator computes more meanwhile)."""
        caps = [self._cap(p) for p in live]
        links = [self.self_fixed] + [self.members[p].link_s for p in live[1:]]
        if self.self_spm is None or n < len(live) or not any(x > 0 for x in links):
            return caps
        return finish_shares([self.self_spm * caps[0] / c for c in caps], links, n)

    def _new_task(self, peer: str, micro: tuple[int, ...], kind: str = "main") -> _Task:
        t = _Task(self.next_task, micro, [peer], self.now, self.now + self._deadline(peer, len(micro)),
                  kind=kind)
        self.next_task += 1
        self.tasks[t.task] = t
        return t

    def _timed(self, peer: str) -> bool:
        """Whether ``peer``'s seconds per micro-batch are known: it finished a share after the
        term's first step (its first shares include warm-up: compiles, first connections, a
        cold start), so that a late task of it is a miss, not noise."""
        if peer in self.excused:
            return True  # excused once already
        if peer == self.me:
            return self.self_spm is not None
        m = self.members.get(peer)
        return m is not None and m.timed >= 1

    def _deadline(self, peer: str, n: int) -> float:
        """When ``peer``'s ``n`` micro-batches (a local-steps run's replicas) are late. Our own
        follow our own timing once known (``own_spm``, else the split's ``self_spm``), as a
        member's follow its: with the capacity alone, a task longer than the floor (a
        local-steps round of seconds) was late every step, and a member computed it again as
        its backup."""
        if peer == self.me:
            own = self.own_spm if self.own_spm is not None else self.self_spm
            spm = own if own is not None else 1.0 / float(self.capacity or 1.0)
        else:
            spm = self.members[peer].sec_per_micro
        return max(MIN_DEADLINE_S, DEADLINE_FACTOR * spm * n + 0.5)

    def _dispatch(self, tasks: list[_Task], peers: dict[int, str] | None = None) -> list[Output]:
        """Tell everyone about new assignments (``peers``: task -> the newly added assignee)."""
        if not tasks:
            return []
        wire = tuple(F.Task(t.task, (peers or {}).get(t.task, t.assignees[-1]), t.micro) for t in tasks)
        out: list[Output] = []
        for p in self._receivers():  # each member hears of its own tasks only
            mine = tuple(w for w in wire if w.peer == p)
            if mine:
                out.append(Send(p, F.Assign(self.term, self.step, mine)))
        for w in wire:
            if w.peer == self.me:
                self.pending[(self.step, w.task)] = w.micro
                self.own_micro[(self.step, w.task)] = len(w.micro)
                out.append(Compute(self.step, w.task, w.micro, self.trainer.theta.copy(), self.term))
        return out

    def _receivers(self) -> list[str]:
        """Members that follow the run (get assigns and totals)."""
        return sorted(m.id for m in self.members.values()
                      if m.ready and m.synced and not m.refused and m.id in self.open
                      and m.id not in self.banned)

    def _take_contrib(self, sender, step, task, micro, ints, loss, correct) -> list[Output]:
        t = self.tasks.get(task)
        if step != self.step or t is None or t.result is not None or t.micro != tuple(micro) \
                or sender not in t.assignees:
            return []  # late, duplicate or not ours: ignored, the step counts each micro once
        t.result = (sender, ints, loss, correct)
        if sender != self.me and sender in self.members:
            m = self.members[sender]
            spent = max(1e-4, self.now - t.sent_at) / len(micro)
            m.sec_per_micro = 0.5 * m.sec_per_micro + 0.5 * spent
        self._time_task(sender, t)
        out: list[Output] = []
        if len(t.micro) == 1 and t.micro[0] in self.checks:
            self.checks[t.micro[0]].votes[sender] = (np.asarray(ints, np.int64), loss, correct)
            out += self.trust.judge(t.micro[0])
        return out + self._maybe_commit()

    def _time_task(self, sender: str, t: _Task) -> None:
        """Learn from a peer's whole share of the step once its last task is in (dispatch to
        contribution; the clock comes from the shell): the coordinator's own seconds per
        micro-batch, and what each member's link adds beyond computing its share at its
        capacity relative to the coordinator's (tasks it was first given: main and checks).
        A term's first step and each member's first share are left out: they include
        warm-up (compiles, first connections), which would skew the split for many steps."""
        if t.assignees[0] != sender or self.step < self.timing_from:
            return
        share = [x for x in self.tasks.values() if x.assignees[0] == sender]
        if any(x.result is None for x in share):
            return
        n = sum(len(x.micro) for x in share)
        spent = self.now - min(x.sent_at for x in share)
        if spent <= 0 or n == 0:
            return
        if sender == self.me:
            busy = [x.busy_s for x in share]
            if all(b is not None for b in busy):  # the shell timed each compute: the rest is handling
                per, fixed = sum(busy) / n, max(0.0, spent - sum(busy))
                self.self_fixed = 0.5 * self.self_fixed + 0.5 * fixed
            else:
                per = spent / n
            self.self_spm = per if self.self_spm is None else 0.5 * self.self_spm + 0.5 * per
        elif sender in self.members and self.self_spm is not None:
            m = self.members[sender]
            m.timed += 1
            if m.timed == 1:
                return
            own = n * self.self_spm * self._cap(self.me) / self._cap(sender)
            m.link_s = 0.5 * m.link_s + 0.5 * max(0.0, spent - own)

    def _maybe_commit(self) -> list[Output]:
        if not self.step_started or not self.tasks:
            return []
        if all(x.result is not None for x in self.tasks.values() if x.kind == "main") and \
                all(c.decided is not None for c in self.checks.values()):
            return self._commit()
        return []

    def _commit(self) -> list[Output]:
        step = self.step
        total, contributors, loss, unchecked = Star.total(
            self.tasks.values(), self.checks, self.trainer.total_size, self.me)
        self.trainer.apply(total)
        encoded = self.window.encode(total)  # once: the window's copy and every member's
        self.trust.record(step, total, unchecked, encoded)
        sha = self._hash()
        receivers = self._receivers()
        self.step_started = False
        self.tasks, self.checks = {}, {}
        self.pending = {k: v for k, v in self.pending.items() if k[0] > step}
        self.own_micro = {k: v for k, v in self.own_micro.items() if k[0] >= step}  # timed until the next commit
        committed = self.member.committed(step, loss, contributors, sha)
        # the next step's assign rides on each member's total: one message down per step
        nxt, carried = [], {}
        for o in self._maybe_begin():
            if isinstance(o, Send) and isinstance(o.message, F.Assign) and o.to in receivers \
                    and o.message.step == self.step and o.to not in carried:
                carried[o.to] = o.message.tasks
            else:
                nxt.append(o)
        marks = dict(unchecked=tuple(sorted(unchecked)), removed=tuple(sorted(self.banned)))
        out: list[Output] = [Send(p, F.Total(self.term, step, contributors, loss, sha, total,
                                             carried.get(p, ()), encoded, **marks)) for p in receivers]
        return out + committed + nxt

    def member_left(self, peer: str, quiet: bool = False, force: bool = False) -> list[Output]:
        if peer == self.me:
            return []
        if self.catching_up and peer == self.catch_from:
            self.catching_up = False
            return [Log(f"{self._name(peer)} left before sending its state: going on from step "
                        f"{self.step}", loud=True)] + self.member_left(peer, quiet, force) + \
                self._maybe_begin()
        m = self.members.get(peer)
        if m is not None and (not m.refused or force):
            del self.members[peer]
        return self.aggregation.member_left(peer, m, quiet)

    def _check_deadlines(self) -> list[Output]:
        if not self.step_started:
            return []
        late, added, dropped = [], {}, []
        timed = False  # a late task's peer whose timing is known (else it is no miss)
        live = self._live()
        for t in list(self.tasks.values()):
            if t.result is not None or self.now < t.deadline:
                continue
            if t.kind != "main" and t.micro[0] in self.checks:
                c = self.checks[t.micro[0]]
                if c.decided is not None:
                    continue
                busy = set(c.votes) | {p for u in self.tasks.values() if u.micro == t.micro
                                       for p in u.assignees}
            else:
                busy = set(t.assignees)
            spare = [p for p in live if p not in busy]
            timed = timed or any(self._timed(p) for p in t.assignees)
            if not spare and t.kind == "check":
                dropped.append(t)  # nobody else can give this second opinion: go without it
                continue  # (never a referee's: the answers it settles differ, it is waited for)
            if not spare or t.kind == "referee":  # (a referee's is ours alone: checks.verdict)
                t.deadline = self.now + self._deadline(t.assignees[0], len(t.micro))
                continue
            backup = max(spare, key=lambda p: (self._cap(p), p == self.me))
            t.assignees.append(backup)
            t.sent_at = self.now
            t.deadline = self.now + self._deadline(backup, len(t.micro))
            late.append(t)
            added[t.task] = backup
        out: list[Output] = []
        first = self.step < self.timing_from  # a term's first step: no timing known, no miss
        if not first and not timed:
            self.excused |= {p for t in late + dropped for p in t.assignees[:1]}
        if late:
            out += [Log(f"task(s) {[t.task for t in late]} of step {self.step} " + (
                "also given to a backup (the first step's timings are not known yet)" if first
                else "also given to a backup (a first share: its peer's timing is not known yet)"
                if not timed else "missed the deadline: backup assigned"))] + self._dispatch(late, added)
        if dropped:
            for t in dropped:
                del self.tasks[t.task]
            out.append(Log(f"spot-check(s) of micro-batch(es) {[t.micro[0] for t in dropped]} of step "
                           f"{self.step} " + ("skipped (the first step's timings are not known yet)"
                                              if first else "skipped (a first share: its peer's timing is "
                                              "not known yet)" if not timed else
                                              "got no second answer in time: dropped")))
            for j in sorted(self.checks):
                out += self.trust.judge(j)
            out += self._maybe_commit()
        return out

    def _end(self) -> list[Output]:
        self.ended = True
        sha = self._hash()
        msg = F.End(self.term, self.step, sha)
        # members still being brought in (ready, not synced: a catch-up was pending) get the
        # announce again: their ready then gets the final state and the end (:meth:`_late_end`)
        late = sorted(m.id for m in self.members.values() if m.ready and not m.synced and not m.refused
                      and m.id in self.open and m.id not in self.banned)
        return [Send(p, msg) for p in self._receivers()] + [Send(p, self._announce()) for p in late] + \
            [Ended(self.step, sha, True)]

    def _late_end(self, sender: str, msg: F.Ready) -> list[Output]:
        """A member's ``ready`` of this term came after the run ended (a new coordinator
        whose members answered late trained the last steps without them): it gets the final
        state, if it differs, and the end; without them it waited for ever."""
        sha = self._hash()
        out: list[Output] = [Log(f"{self._name(sender)} is ready after the run ended: sending "
                                 f"the state and the end")]
        if msg.step != self.step or msg.params_sha256 != sha:
            out.append(Send(sender, self._state()))
        return out + [Send(sender, F.End(self.term, self.step, sha))]

    def _answered(self, peer: str) -> bool:
        m = self.members.get(peer)
        return m is not None and (m.ready or m.refused)
