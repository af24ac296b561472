"""How a step's contributions become its total: the :class:`Aggregation` interface of the
coordinator and its member-side counterpart :class:`MemberAggregation`, and the star behind
them. The roles call only the interface (``coordinator.aggregation``,
``member.aggregation``) and never ask which topology sums a step.

- :class:`Star`: every contribution comes to the coordinator, which sums them (each
  micro-batch exactly once; a spot-checked one from its reference answer) and sends the
  total to everyone. Its book of the step (tasks, checks, backups, the commit) is the
  coordinator's, which the trust checks share.
- :class:`StarMember`: a member sends its contribution to the coordinator.
- The ring (:mod:`.ring_roles`): ``RingCoordinator`` and ``RingMember`` implement the same
  interfaces. They hold a star and hand it the steps that the ring does not sum (the choice
  per step: :func:`.ring.choose`; ``--aggregate star``: every step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from daisychain.engine.trainer import capacity_split
from daisychain.peer import frames as F
from daisychain.peer.run.checks import checked_micro
from daisychain.peer.run.outputs import Log, Output, Send
from daisychain.peer.run.split import split_tasks


@dataclass
class _Task:
    task: int
    micro: tuple[int, ...]
    assignees: list[str]
    sent_at: float
    deadline: float
    result: tuple[str, np.ndarray, float, int] | None = None  # (peer, ints, loss, correct)
    kind: str = "main"   # main: counts in the total; check / referee: a spot-check's second opinion
    busy_s: float | None = None  # the coordinator's own task: its compute's seconds (the shell's clock)


@dataclass
class _Check:
    """A spot-checked micro-batch of the current step: every peer's answer (``votes``) and,
    once decided, the reference answer the total uses."""
    micro: int
    votes: dict = field(default_factory=dict)   # peer -> (ints, loss, correct)
    decided: tuple | None = None
    decided_by: str | None = None
    refereed: bool = False


class Aggregation:
    """The coordinator's side of a step's sum. Every method returns the outputs of what it
    did (``drop``: nothing)."""

    def begin(self, live: list[str]) -> list[Output]:
        """Start the step with ``live`` (self first): split it, tell the members."""
        raise NotImplementedError

    def computed(self, step: int, task: int, micro, grad, loss: float, correct: int) -> list[Output]:
        """The coordinator's own share ``task`` of ``step`` is computed."""
        raise NotImplementedError

    def on_message(self, sender: str, msg) -> list[Output]:
        """A message of this aggregation (the driver routes them here)."""
        return []

    def member_left(self, peer: str, gone, quiet: bool) -> list[Output]:
        """``peer`` left (``gone``: its record, if it had one; ``quiet``: no line for it)."""
        raise NotImplementedError

    def deadline(self) -> list[Output]:
        """The clock moved: work past its deadline."""
        return []

    def drop(self) -> None:
        """Work under way is dropped (a new term, a restore, a catch-up)."""

    def resend(self, peer: str) -> list[Output]:
        """What a member that asked for the state needs besides it to take part in the step."""
        return []


class MemberAggregation:
    """A member's side of a step's sum (the interface; see :class:`Aggregation`)."""

    def computed(self, step: int, task: int, micro, grad, loss: float, correct: int) -> list[Output]:
        """This replica's share ``task`` of ``step`` is computed."""
        raise NotImplementedError

    def on_message(self, sender: str, msg) -> list[Output]:
        return []

    def drop(self) -> None:
        """Work under way is dropped (a new term, this peer leads, a restore)."""

    def synced(self) -> list[Output]:
        """A state was loaded."""
        return []

    def holds_end(self, msg: F.End) -> bool:
        """Whether the run's ``end`` waits for a total still under way (kept, then)."""
        return False

    def peers_changed(self) -> list[Output]:
        """The room changed or a channel closed."""
        return []


class StarMember(MemberAggregation):
    """A member of a star: its contribution goes to the coordinator."""

    def __init__(self, member):
        self.member = member

    def computed(self, step, task, micro, grad, loss, correct) -> list[Output]:
        m = self.member
        return [Send(m.coord, F.Contrib(m.term, step, task, micro, loss, correct, grad))]


class Star(Aggregation):
    """The star, over the coordinator ``c``'s book of the step (``tasks``, ``checks``)."""

    def __init__(self, coordinator):
        self.c = coordinator

    def begin(self, live: list[str]) -> list[Output]:
        """Split the step by capacity (sticky replicas for local steps), spot-check some
        micro-batches with a second peer, and dispatch."""
        c = self.c
        c.step_started = True
        c.tasks = {}
        c.checks = {}
        ids = list(range(c.trainer.n_tasks))  # micro-batches; a local-steps run's replicas
        last = getattr(c, "owner", {}) if c.trainer.hp.local else None  # sticky replicas
        parts, c.owner = split_tasks(ids, c._split_weights(live, len(ids)), live, last)
        checked = set(checked_micro(c.peer.verify_key, c.step, len(ids), c.verify_rate)) \
            if len(live) > 1 else set()
        new, out = [], []
        for i, (peer, micro) in enumerate(zip(live, parts)):
            plain = tuple(j for j in micro if j not in checked)
            if plain:
                new.append(c._new_task(peer, plain))
            for j in micro:
                if j in checked:  # its own task, and the same micro-batch for the next peer
                    c.checks[j] = _Check(j)
                    new.append(c._new_task(peer, (j,)))
                    new.append(c._new_task(live[(i + 1) % len(live)], (j,), "check"))
            if not micro:  # the coordinator too: in a local-steps room of more peers than replicas it may be the one
                out.append(Log(f"{c._name(peer)} gets no micro-batch of step {c.step}: "
                               f"its capacity {c._cap(peer):.3g} micro-batches/s is under "
                               f"1/{len(ids)} of the room's {sum(c._cap(p) for p in live):.3g}"))
        return out + c._dispatch(new)

    def computed(self, step, task, micro, grad, loss, correct) -> list[Output]:
        return self.c._take_contrib(self.c.me, step, task, micro, grad, loss, correct)

    def member_left(self, peer: str, gone, quiet: bool) -> list[Output]:
        """Its open tasks go to the others (split by capacity); checks it would have
        answered decide with the others."""
        c = self.c
        orphans = []
        for t in list(c.tasks.values()):
            if t.result is None and peer in t.assignees:
                t.assignees.remove(peer)
                if not t.assignees:
                    orphans.append(t)
        if not orphans:
            out: list[Output] = [] if quiet or gone is None else [Log(f"{c._name(peer)} left")]
            for j in sorted(c.checks):
                out += c.trust.judge(j)
            return out + c._maybe_commit()
        live = c._live()
        new = []
        for t in orphans:  # split its micro-batches over those still here
            del c.tasks[t.task]
            if t.kind != "main":
                continue  # a second opinion nobody gives: the check decides with the others
            for who, micro in zip(live, capacity_split(list(t.micro), [c._cap(p) for p in live])):
                if micro:
                    new.append(c._new_task(who, tuple(micro)))
        mains = [j for t in orphans if t.kind == "main" for j in t.micro]
        out = [Log(f"{c._name(peer)} left during step {c.step}: its micro-batches "
                   f"{mains} go to the others")] if mains else []
        out += c._dispatch(new)
        for j in sorted(c.checks):
            out += c.trust.judge(j)
        return out + c._maybe_commit()

    def deadline(self) -> list[Output]:
        return self.c._check_deadlines()

    @staticmethod
    def total(tasks, checks, size: int, me: str):
        """``tasks``: the step's tasks (their ``kind == "main"`` results count), ``checks``:
        micro-batch -> its decided check. Returns (int64 total, contributors as sorted
        (peer, micro-batches), mean loss over micro-batches, the peers other than ``me``
        whose contribution in the total no spot-check confirmed)."""
        total = np.zeros(size, np.int64)
        per: dict[str, int] = {}
        unchecked: set[str] = set()
        loss_sum, n = 0.0, 0
        for t in sorted((t for t in tasks if t.kind == "main"), key=lambda t: t.task):
            peer, ints, loss, _ = t.result
            c = checks.get(t.micro[0]) if len(t.micro) == 1 else None
            if c is not None:  # a spot-checked micro-batch: the reference answer counts
                ref, loss, _ = c.decided
                if not np.array_equal(ints, ref):
                    peer, ints = c.decided_by, ref
                if len(c.votes) < 2 and peer != me:  # one answer, nobody confirmed it
                    unchecked.add(peer)
            elif peer != me:
                unchecked.add(peer)
            total += ints
            per[peer] = per.get(peer, 0) + len(t.micro)
            loss_sum += loss
            n += len(t.micro)
        return total, tuple(sorted(per.items())), loss_sum / max(n, 1), unchecked
