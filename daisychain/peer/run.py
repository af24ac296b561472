"""The run and its steps as a plain object: no sockets, no clock, no threads.

:class:`RunPeer` is one replica's view of a run. The shell (``rtc.py`` / ``cli.py``) feeds it
what happens — ``receive(sender, message)`` (a decoded data-channel message),
``room_changed(ids, host)`` (the signaling room changed), ``channel_open(peer)``,
``computed(step, task, result)`` (a compute it asked for finished), ``data(bytes|None)``
(the dataset fetch it asked for), ``tick(now)`` — and performs what it answers:
:class:`Send`, :class:`Compute`, :class:`FetchData` and events (:class:`Committed`,
:class:`Refused`, :class:`Log`, :class:`Ended`, :class:`Failed`).

The room host is the step *coordinator*. It announces the run (:class:`~frames.Run`); each
member checks the identity and its own self-test and answers ``Ready`` (with its state's
step and hash) or ``Refuse``. A member whose state differs gets the coordinator's STATE.
Per step the coordinator splits the micro-batch ids into *tasks* by capacity and by what
each member's link costs a step (:func:`finish_shares`: everyone finishes together, each
live member keeps at least one micro-batch); each task
is committed from exactly one contribution (the first that arrives from one of its
assignees, with the task's exact micro-batch list), so each micro-batch counts exactly
once. A task whose peer leaves is split over the others; a task past its adaptive
deadline gets a backup assignee. When every task has a contribution the coordinator sums
them, applies the total, and sends it (TOTAL) with its new parameter hash to everyone;
each member applies it and compares hashes (mismatch: loud report, resync).

Hand-over: when the signaling server names another host, that peer becomes coordinator
with ``term + 1`` and restarts the step it holds; members report their state and whoever
is behind (the new coordinator included) is brought forward by STATE.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable, Union

import numpy as np

from daisychain.engine.model import Result
from daisychain.engine.trainer import Trainer, capacity_split, identity_differences
from daisychain.peer import frames as F

#: smallest and initial deadline (seconds) of a task
MIN_DEADLINE_S = 2.0
DEADLINE_FACTOR = 4.0
#: after a restore, how long the coordinator waits for the members to load the state
RESTORE_WAIT_S = 20.0
#: at the start, how long the host waits for the members it announced the run to
START_WAIT_S = 20.0
#: how long a coordinator waits for the STATE of a member that said it is ahead
SYNC_WAIT_S = 20.0
#: default share of micro-batches spot-checked by a second peer, and mismatches tolerated
VERIFY_RATE = 0.05
STRIKES = 3


# -- outputs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    to: str
    message: F.RunMessage


@dataclass(frozen=True)
class Compute:
    """Compute the integer sum of ``micro`` of ``step`` on ``theta`` (a private copy), then
    call ``computed(step, task, result)``."""
    step: int
    task: int
    micro: tuple[int, ...]
    theta: np.ndarray = field(repr=False, compare=False)


@dataclass(frozen=True)
class FetchData:
    """Fetch the dataset bytes (``/data/<task>.dcds``), then call ``data(bytes or None)``."""
    task: str
    fingerprint: str


@dataclass(frozen=True)
class Committed:
    step: int          #: the step that was applied (the replica is now at step + 1)
    loss: float
    contributors: tuple[tuple[str, int], ...]
    mine: int          #: micro-batches of this peer in it
    params_sha256: str


@dataclass(frozen=True)
class Refused:
    peer: str          #: who refused (this peer's own id when it refuses)
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Log:
    text: str
    loud: bool = False


@dataclass(frozen=True)
class Ended:
    step: int
    params_sha256: str
    agreed: bool       #: this replica's hash equals the coordinator's


@dataclass(frozen=True)
class Failed:
    reason: str


@dataclass(frozen=True)
class Restored:
    """This replica now holds a restored checkpoint state (``by``: the coordinator)."""
    step: int
    params_sha256: str
    by: str


@dataclass(frozen=True)
class Alarm:
    """A peer sent what an honest replica cannot have sent. ``kind``: ``mismatch`` (a
    spot-check found its contribution differs from the reference), ``refused`` (a malformed
    message or a contribution over the clamp bound), ``removed`` (it reached the run's
    strikes and takes no further part)."""
    kind: str
    peer: str
    name: str
    step: int
    micro: int | None
    strikes: int
    text: str


class RestoreError(ValueError):
    """A state the coordinator cannot restore (wrong size, hash, or not the coordinator)."""


Output = Union[Send, Compute, FetchData, Committed, Refused, Log, Ended, Failed, Restored, Alarm]


def checked_micro(key: str, step: int, n_micro: int, rate: float) -> list[int]:
    """The micro-batches of ``step`` that are spot-checked: micro-batch j is when the first
    8 bytes of SHA-256(``key:step:j``), as a big-endian u64, are below ``floor(rate * 2**64)``.
    ``key`` is the coordinator's secret, so no member can tell in advance."""
    bound = math.floor(rate * 2.0**64)
    out = []
    for j in range(n_micro):
        h = hashlib.sha256(f"{key}:{step}:{j}".encode()).digest()
        if int.from_bytes(h[:8], "big") < bound:
            out.append(j)
    return out


def finish_shares(spm: list[float], fixed: list[float], n: int) -> list[float]:
    """Micro-batch shares (summing to ~n) with which every peer finishes a step at the same
    time T: peer k takes max(1, (T - fixed[k]) / spm[k]) micro-batches, where spm[k] is its
    seconds per micro-batch and fixed[k] the seconds its link adds to a step (the total
    reaching it, its contribution coming back). T by bisection (the same float operations
    as runpeer.js finishShares; shared cases in tests/scenarios/split.json)."""
    def taken(t: float) -> float:
        acc = 0.0
        for s, x in zip(spm, fixed):
            acc += max(1.0, (t - x) / s)
        return acc
    lo, hi = 0.0, max(fixed) + n * max(spm)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if taken(mid) >= n:
            hi = mid
        else:
            lo = mid
    return [max(1.0, (hi - x) / s) for s, x in zip(spm, fixed)]


def message_name(msg) -> str:
    return getattr(msg, "T", None) or type(msg).__name__.lower()


def contribute_at(trainer: Trainer, theta: np.ndarray, step: int, micro) -> Result:
    """``Trainer.contribute`` on a given parameter vector (a snapshot, so that a compute in a
    thread never sees the replica change under it)."""
    x, y = trainer.inputs(step, np.asarray(micro, np.int64))
    return trainer.engine.grad(theta, x, y, trainer.hp.grad_frac_bits, trainer.limit)


def measure_capacity(trainer: Trainer, seconds: float = 0.3) -> float:
    """Micro-batches per second of this machine on this run (a few step-0 micro-batches)."""
    theta = trainer.theta.copy()
    n, t0 = 0, time.perf_counter()
    while True:
        contribute_at(trainer, theta, 0, [n % trainer.hp.n_micro])
        n += 1
        dt = time.perf_counter() - t0
        if dt > seconds or n >= 200:
            return n / dt


def tensor_bounds(trainer: Trainer) -> list[int]:
    """Segment bounds of the flat vector: one segment per canonical tensor."""
    return [0] + [int(o + np.prod(s)) for o, s in zip(trainer.layout.offsets, trainer.layout.shapes)]


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


@dataclass
class _Task:
    task: int
    micro: tuple[int, ...]
    assignees: list[str]
    sent_at: float
    deadline: float
    result: tuple[str, np.ndarray, float, int] | None = None  # (peer, ints, loss, correct)
    kind: str = "main"   # main: counts in the total; check / referee: a spot-check's second opinion


@dataclass
class _Check:
    """A spot-checked micro-batch of the current step: every peer's answer (``votes``) and,
    once decided, the reference answer the total uses."""
    micro: int
    votes: dict = field(default_factory=dict)   # peer -> (ints, loss, correct)
    decided: tuple | None = None
    decided_by: str | None = None
    refereed: bool = False


class RunPeer:
    """One replica of one run. ``me`` is this peer's signaling id."""

    def __init__(self, me: str, *, kind: str = "python", make_trainer: Callable | None = None,
                 capacity: float | None = None, selftest: tuple[bool, str] = (True, "ok"),
                 trainer: Trainer | None = None, steps: int = 0, wait_peers: int = 0,
                 verify_rate: float = VERIFY_RATE, strikes: int = STRIKES,
                 verify_key: str | None = None):
        self.me = me
        if not (math.isfinite(verify_rate) and 0.0 <= verify_rate <= 1.0):
            raise ValueError("the verify rate must be in [0, 1]")
        if not 1 <= int(strikes) <= F.MAX_STRIKES:
            raise ValueError(f"strikes must be in [1, {F.MAX_STRIKES}]")
        self.verify_rate = float(verify_rate)
        self.strikes = int(strikes)
        self.verify_key = verify_key or secrets.token_hex(16)
        self.names: dict[str, str] = {}    # signaling id -> the name it gave (for logs)
        self.checks: dict[int, _Check] = {}  # coordinator: spot-checks of the current step
        self.strike_count: dict[str, int] = {}
        self.banned: set[str] = set()     # coordinator: removed from the run (liars)
        self.kind = kind
        self.make_trainer = make_trainer   # (identity, Dataset) -> Trainer (this peer's units)
        self.capacity = capacity
        self.selftest = selftest
        self.trainer = trainer
        self.bounds = tensor_bounds(trainer) if trainer else None
        self.steps = steps
        self.wait_peers = wait_peers
        self.now = 0.0
        self.host: str | None = None      # the room host per the signaling server
        self.coord: str | None = None     # the coordinator whose run announce we follow
        self.open: set[str] = set()       # peers with an open data channel
        self.room: set[str] = set()       # approved members per the signaling server
        self.term = 0
        self.run: F.Run | None = None     # the announce (members), or our own (coordinator)
        self.coordinating = False
        self.members: dict[str, _Member] = {}
        self.tasks: dict[int, _Task] = {}
        self.next_task = 0
        self.self_spm: float | None = None  # the coordinator's own seconds per micro-batch
        self.timing_from = 0                # ... timed from this step on (see _time_task)
        self.step_started = False
        self.ended = False
        self.refused = False
        self.pending: dict[tuple[int, int], tuple[int, ...]] = {}  # member: (step, task) -> micro
        self.done_by: dict[str, int] = {}  # peer -> micro-batches committed (everyone tracks)
        self.awaiting_data = False
        self.catching_up = False
        self.catch_from: str | None = None  # coordinator: the member ahead whose state we asked for
        self.catch_until = 0.0
        self.restoring: tuple[int, str] | None = None  # member: (step, hash) a restore announced
        self.restored_term = -1           # coordinator: this term's state came from a restore
        self.wait_for: set[str] = set()   # coordinator: members to hear from before a step
        self.wait_until = 0.0
        if trainer is not None:  # the host of a new room: the run is ours
            self.run = self._announce()
            if capacity is None:
                self.capacity = measure_capacity(trainer)

    # -- properties ------------------------------------------------------------------------

    @property
    def step(self) -> int:
        return self.trainer.state.step if self.trainer else 0

    @property
    def run_id(self) -> str:
        return self.run.run_id if self.run else ""

    def _hash(self) -> str:
        return self.trainer.params_sha256()

    def _announce(self) -> F.Run:
        tr = self.trainer
        return F.Run(tr.identity, tr.run_id, self.steps, self.term, self.step, self._hash(), self.me,
                     self.verify_rate, self.strikes)

    def _name(self, peer: str) -> str:
        name = self.names.get(peer)
        return f"{name} ({peer})" if name and name != peer else peer

    def _send(self, to: str, msg) -> Send:
        return Send(to, msg)

    # -- inputs ----------------------------------------------------------------------------

    def tick(self, now: float) -> list[Output]:
        self.now = now
        if not self.coordinating or self.ended:
            return []
        return self._check_catch_up() + self._check_deadlines() + self._maybe_begin()

    def room_changed(self, ids, host: str | None, names: dict | None = None) -> list[Output]:
        """The signaling room changed: approved online members ``ids`` (self included);
        ``names``: id -> the name each gave the server (used in logs)."""
        out: list[Output] = []
        self.room = set(ids)
        if names:
            self.names.update({str(k): str(v)[:64] for k, v in names.items()})
        gone = [m for m in self.members if m not in self.room]
        old_host, self.host = self.host, host
        if host == self.me and not self.coordinating and self.trainer is not None and self.run:
            out += self._become_coordinator(old_host)
        elif host != self.me and self.coordinating:
            self.coordinating = False  # another host was named (we were away): follow it
            out.append(Log(f"{host} is the coordinator now"))
        for m in gone:
            out += self._member_left(m)
        return out

    def channel_open(self, peer: str) -> list[Output]:
        self.open.add(peer)
        if self.coordinating and self.run and not self.ended:
            return [Send(peer, self._announce())]
        return []

    def channel_closed(self, peer: str) -> list[Output]:
        self.open.discard(peer)
        return self._member_left(peer) if self.coordinating else []

    def receive(self, sender: str, msg: F.RunMessage, run_id: str = "") -> list[Output]:
        """A decoded message; ``run_id`` is its frame header's. Messages of another run than
        the one this peer follows are dropped (loudly); only a peer whose run ended takes a
        ``run`` announce of a new one."""
        if run_id and self.run_id and run_id != self.run_id and not (
                isinstance(msg, F.Run) and self.ended and not self.coordinating):
            return [Log(f"a {message_name(msg)} message of run {run_id} from {self._name(sender)}; "
                        f"this peer follows run {self.run_id}: dropped", loud=True)]
        handler = getattr(self, "_on_" + type(msg).__name__.lower())
        return handler(sender, msg)

    def bad_message(self, sender: str, reason: str) -> list[Output]:
        """``sender`` sent bytes that are not a valid message (``reason``). Logged by name;
        the coordinator counts it as a strike against a member of the run."""
        if self.coordinating and sender in self.members and sender not in self.banned:
            return self._strike(sender, "refused", None,
                                f"refused a message from {self._name(sender)}: {reason}")
        return [Log(f"refused a message from {self._name(sender)}: {reason}", loud=True)]

    def computed(self, step: int, task: int, result: Result) -> list[Output]:
        key = (step, task)
        micro = self.pending.pop(key, None)
        if micro is None or self.ended:
            return []
        loss = float(np.sum(result.loss)) if len(result.loss) else 0.0
        correct = int(np.sum(result.correct))
        if self.coordinating:
            return self._take_contrib(self.me, step, task, micro, result.grad, loss, correct)
        if self.coord is None or step != self.step:
            return []
        return [Send(self.coord, F.Contrib(self.term, step, task, micro, loss, correct, result.grad))]

    def data(self, blob: bytes | None) -> list[Output]:
        """The dataset fetch finished (``None``: failed)."""
        from daisychain.engine.data import DataError, Dataset
        if not self.awaiting_data or self.run is None:
            return []
        want = self.run.identity.get("dataset")
        if blob is not None:
            import hashlib
            if hashlib.sha256(blob).hexdigest() == want:
                self.awaiting_data = False
                try:
                    ds = Dataset.from_bytes(blob)
                except DataError as exc:
                    return self._refuse([f"dataset: {exc}"])
                return self._prepared(ds)
        if self.coord and self.coord != self.me:  # ask the coordinator over the channel
            return [Log("the server has no matching dataset; asking the coordinator"),
                    Send(self.coord, F.DataRequest(want))]
        return self._refuse(["dataset fingerprint: no copy of the run's dataset found"])

    # -- member side -----------------------------------------------------------------------

    def _on_run(self, sender: str, msg: F.Run) -> list[Output]:
        if self.refused or self.coordinating or msg.term < self.term or (
                msg.term == self.term and sender != self.coord):
            return []
        self.coord = sender
        self.steps = msg.steps
        self.verify_rate, self.strikes = msg.verify_rate, msg.strikes
        first = self.run is None or msg.run_id != self.run.run_id
        if first or msg.term != self.term:
            self.pending.clear()  # (the same announce again, on a reopened channel: work goes on)
        self.term, self.run = msg.term, msg
        self.ended = False
        if self.trainer is not None and not first:
            return [Send(sender, self._ready())]
        if self.trainer is not None and first:  # another run (ours ended): start over from its data
            self.trainer, self.bounds = None, None
        self.awaiting_data = True
        return [FetchData(str(msg.identity.get("task", "")), str(msg.identity.get("dataset", "")))]

    def _prepared(self, ds) -> list[Output]:
        try:
            self.trainer = self.make_trainer(self.run.identity, ds)
        except Exception as exc:  # noqa: BLE001 - a run we cannot build is refused, in words
            return self._refuse([f"cannot build the run here: {exc}"])
        self.bounds = tensor_bounds(self.trainer)
        return self._check_identity()

    def _check_identity(self) -> list[Output]:
        reasons = identity_differences(self.trainer.identity, self.run.identity)
        if not self.selftest[0]:
            reasons.append(f"self-test failed: {self.selftest[1]}")
        if reasons:
            return self._refuse(reasons)
        if self.capacity is None:
            self.capacity = measure_capacity(self.trainer)
        return [Log(f"joined run {self.run.run_id} (step {self.run.step} of {self.run.steps})"),
                Send(self.coord, self._ready())]

    def _ready(self) -> F.Ready:
        return F.Ready(self.term, float(self.capacity or 1.0), self.kind, self.step, self._hash())

    def _refuse(self, reasons: list[str]) -> list[Output]:
        self.refused = True
        out: list[Output] = [Refused(self.me, tuple(reasons))]
        if self.coord and self.coord != self.me:
            out.insert(0, Send(self.coord, F.Refuse(self.term, tuple(reasons))))
        return out

    def _on_assign(self, sender: str, msg: F.Assign) -> list[Output]:
        if self.coordinating or sender != self.coord or msg.term != self.term or self.trainer is None:
            return []
        if msg.step != self.step:
            return []
        out: list[Output] = []
        for t in msg.tasks:
            if t.peer == self.me and (msg.step, t.task) not in self.pending:
                self.pending[(msg.step, t.task)] = t.micro
                out.append(Compute(msg.step, t.task, t.micro, self.trainer.theta.copy()))
        return out

    def _on_total(self, sender: str, msg: F.Total) -> list[Output]:
        if self.coordinating or sender != self.coord or self.trainer is None:
            return []
        if msg.step < self.step:
            return []
        if msg.step > self.step:
            return [Log(f"missed steps {self.step}..{msg.step - 1}: resyncing", loud=True),
                    Send(sender, F.SyncRequest(self.term, self.step, self._hash(), "behind"))]
        out = self._apply(msg.ints, msg.loss, msg.contributors, msg.params_sha256, sender)
        if msg.tasks and msg.term == self.term and self._hash() == msg.params_sha256:
            # the next step's tasks, started the moment the total is applied (not on a
            # replica that just diverged: it waits for its STATE; a backup takes the task)
            out += self._on_assign(sender, F.Assign(msg.term, msg.step + 1, msg.tasks))
        return out

    def _on_state(self, sender: str, msg: F.State) -> list[Output]:
        if self.trainer is None or (sender != self.coord and not self.coordinating):
            return []
        from daisychain.engine.trainer import params_sha256
        restore, self.restoring = (self.restoring, None) if not self.coordinating else (None, None)
        if params_sha256(msg.theta) != msg.params_sha256:
            return [Log(f"state from {sender} does not match its hash: ignored", loud=True)]
        if restore is not None and restore != (msg.step, msg.params_sha256):
            return [Log(f"restore from {sender}: the state (step {msg.step}, params "
                        f"{msg.params_sha256[:12]}) is not the announced checkpoint (step "
                        f"{restore[0]}, params {restore[1][:12]}): ignored", loud=True)]
        if self.coordinating and msg.step <= self.step:
            return []
        st = self.trainer.state
        st.theta[:] = msg.theta
        st.adam.m, st.adam.v = msg.m, msg.v
        st.adam.b1t, st.adam.b2t = msg.b1t, msg.b2t
        st.adam.step = st.step = msg.step
        self.pending.clear()
        out: list[Output] = [Log(f"synced to step {msg.step} from {sender} "
                                 f"(params {msg.params_sha256[:12]})")]
        if restore is not None:
            out.append(Restored(msg.step, msg.params_sha256, sender))
        if self.coordinating:  # caught up with a member that was ahead: restart from there
            self.catching_up = False
            self.tasks.clear()
            self.checks.clear()
            self.step_started = False
            for m in self.members.values():
                m.synced = False
            return out + [Send(p, self._announce()) for p in self._announce_targets()]
        return out

    def _on_restore(self, sender: str, msg: F.Restore) -> list[Output]:
        """The coordinator restored the room: the STATE that follows replaces ours."""
        if self.refused or self.coordinating or self.trainer is None or msg.term < self.term:
            return []
        if sender not in (self.coord, self.host):
            return [Log(f"a restore from {sender}, who does not coordinate the run: ignored", loud=True)]
        self.coord, self.term = sender, msg.term
        self.restoring = (msg.step, msg.params_sha256)
        self.pending.clear()
        self.ended = False
        return [Log(f"{sender} restores the room from a checkpoint: step {msg.step}, "
                    f"params {msg.params_sha256[:12]}")]

    def _on_end(self, sender: str, msg: F.End) -> list[Output]:
        if sender != self.coord or self.trainer is None or self.ended:
            return []
        self.ended = True
        return [Ended(msg.step, self._hash(), self._hash() == msg.params_sha256 and msg.step == self.step)]

    def _on_data(self, sender: str, msg: F.Data) -> list[Output]:
        if sender != self.coord:
            return []
        return self.data(msg.data) if self.awaiting_data else []

    # -- coordinator side ------------------------------------------------------------------

    def _announce_targets(self) -> list[str]:
        return sorted(p for p in self.open if p in self.room and p != self.me)

    def _become_coordinator(self, old_host: str | None) -> list[Output]:
        self.coordinating = True
        self.coord = self.me
        self.term += 1
        self.members = {}
        self.tasks = {}
        self.checks = {}
        self.step_started = False
        self.pending.clear()
        self.self_spm, self.timing_from = None, self.step + 1  # a term's first step warms up
        out: list[Output] = [Log(f"coordinating the run from step {self.step} (term {self.term})")]
        return out + [Send(p, self._announce()) for p in self._announce_targets()]

    def _on_ready(self, sender: str, msg: F.Ready) -> list[Output]:
        if not self.coordinating or msg.term != self.term or self.ended:
            return []
        if sender in self.banned:
            return [Log(f"{self._name(sender)} was removed from the run: its ready is ignored", loud=True)]
        m = self.members.setdefault(sender, _Member(sender))
        m.capacity = max(msg.capacity, 1e-3)
        m.kind, m.ready, m.refused = msg.kind, True, False
        m.sec_per_micro = 1.0 / m.capacity
        if msg.step == self.step and msg.params_sha256 == self._hash():
            m.synced = True
            return [Log(f"{sender} is ready ({msg.kind}, {msg.capacity:.0f} micro-batches/s)")] + \
                self._maybe_begin()
        if msg.step > self.step and self.restored_term != self.term:
            # it holds a later step than we do: take its state first (not after a restore:
            # then the restored state is the run's, wherever the member was)
            self.catching_up, self.catch_from = True, sender
            self.catch_until = self.now + SYNC_WAIT_S
            return [Log(f"{sender} is ahead (step {msg.step}): taking its state"),
                    Send(sender, F.SyncRequest(self.term, self.step, self._hash(), "coordinator behind"))]
        m.synced = True  # by channel order the state arrives before the next assign / total
        return [Log(f"{sender} joins at step {self.step}: sending the state"),
                Send(sender, self._state())] + self._maybe_begin()

    def _state(self) -> F.State:
        st = self.trainer.state
        return F.State(self.step, self._hash(), st.theta.copy(), st.adam.m.copy(),
                       st.adam.v.copy(), st.adam.b1t, st.adam.b2t)

    def _on_refuse(self, sender: str, msg: F.Refuse) -> list[Output]:
        if not self.coordinating:
            return []
        m = self.members.setdefault(sender, _Member(sender))
        m.refused, m.ready, m.synced = True, False, False
        return [Refused(sender, msg.reasons)] + self._member_left(sender, quiet=True) + \
            self._maybe_begin()

    def _on_syncrequest(self, sender: str, msg: F.SyncRequest) -> list[Output]:
        if self.trainer is None:
            return []
        out: list[Output] = []
        if self.coordinating and msg.reason != "coordinator behind":
            out.append(Log(f"{sender} diverged at step {msg.step} (params {msg.params_sha256[:12]}, "
                           f"{msg.reason}): resyncing it", loud=True))
        return out + [Send(sender, self._state())]

    def _on_datarequest(self, sender: str, msg: F.DataRequest) -> list[Output]:
        if self.trainer is None or msg.fingerprint != self.trainer.ds.fingerprint:
            return []
        return [Send(sender, F.Data(self.trainer.ds.fingerprint, self.trainer.ds.to_bytes()))]

    def _on_contrib(self, sender: str, msg: F.Contrib) -> list[Output]:
        if not self.coordinating or msg.term != self.term or sender in self.banned:
            return []
        bound = len(msg.micro) * self.trainer.limit
        ints = np.asarray(msg.ints)
        if ints.dtype.kind not in "iu" or ints.size != self.trainer.layout.size:
            return self._strike(sender, "refused", None, f"refused a contribution from "
                                f"{self._name(sender)}: not {self.trainer.layout.size} integers")
        peak = int(np.abs(ints).max()) if ints.size else 0
        if peak > bound:
            return self._strike(sender, "refused", None, f"refused a contribution from "
                                f"{self._name(sender)}: a value of magnitude {peak} is over the "
                                f"clamp bound {int(bound)} of {len(msg.micro)} micro-batch(es)")
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
        if self.step_started or self.catching_up or not self.coordinating or self.ended:
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
        return self._begin_step(live)

    def _begin_step(self, live: list[str]) -> list[Output]:
        self.step_started = True
        self.tasks = {}
        self.checks = {}
        ids = list(range(self.trainer.hp.n_micro))
        parts = capacity_split(ids, self._split_weights(live, len(ids)))
        checked = set(checked_micro(self.verify_key, self.step, len(ids), self.verify_rate)) \
            if len(live) > 1 else set()
        new, out = [], []
        for i, (peer, micro) in enumerate(zip(live, parts)):
            plain = tuple(j for j in micro if j not in checked)
            if plain:
                new.append(self._new_task(peer, plain))
            for j in micro:
                if j in checked:  # its own task, and the same micro-batch for the next peer
                    self.checks[j] = _Check(j)
                    new.append(self._new_task(peer, (j,)))
                    new.append(self._new_task(live[(i + 1) % len(live)], (j,), "check"))
            if not micro and peer != self.me:
                out.append(Log(f"{self._name(peer)} gets no micro-batch of step {self.step}: "
                               f"its capacity {self._cap(peer):.3g} micro-batches/s is under "
                               f"1/{len(ids)} of the room's {sum(self._cap(p) for p in live):.3g}"))
        return out + self._dispatch(new)

    def _split_weights(self, live: list[str], n: int) -> list[float]:
        """The capacities, or once a member's link is seen to cost time, shares that make
        everyone finish together (:func:`finish_shares`): a coordinator that would wait for
        a member's contribution to cross the wire computes more itself meanwhile."""
        caps = [self._cap(p) for p in live]
        links = [0.0] + [self.members[p].link_s for p in live[1:]]
        if self.self_spm is None or n < len(live) or not any(x > 0 for x in links):
            return caps
        return finish_shares([self.self_spm * caps[0] / c for c in caps], links, n)

    def _new_task(self, peer: str, micro: tuple[int, ...], kind: str = "main") -> _Task:
        t = _Task(self.next_task, micro, [peer], self.now, self.now + self._deadline(peer, len(micro)),
                  kind=kind)
        self.next_task += 1
        self.tasks[t.task] = t
        return t

    def _deadline(self, peer: str, n: int) -> float:
        spm = 1.0 / float(self.capacity or 1.0) if peer == self.me else self.members[peer].sec_per_micro
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
                out.append(Compute(self.step, w.task, w.micro, self.trainer.theta.copy()))
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
            out += self._judge(t.micro[0])
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

    # -- spot-checks -----------------------------------------------------------------------

    def _open_for(self, j: int) -> list[_Task]:
        return [t for t in self.tasks.values() if t.micro == (j,) and t.result is None and t.assignees]

    def _judge(self, j: int) -> list[Output]:
        """Compare the answers for spot-checked micro-batch ``j``, bit for bit. All equal
        (two or more, or one when nobody else can still answer): decided. Different: the
        coordinator's own answer is the reference, or else one that two peers agree on;
        otherwise the coordinator computes it itself (the referee)."""
        c = self.checks.get(j)
        if c is None or c.decided is not None or not c.votes:
            return []
        values: dict[bytes, list[str]] = {}
        for peer, (ints, _, _) in c.votes.items():
            values.setdefault(ints.tobytes(), []).append(peer)
        if len(values) == 1:
            if len(c.votes) >= 2 or not self._open_for(j):
                return self._decide(j, next(iter(c.votes)))
            return []
        if self.me in c.votes:
            return self._decide(j, self.me)
        agreed = [peers for peers in values.values() if len(peers) >= 2]
        if agreed:
            return self._decide(j, agreed[0][0])
        if c.refereed:
            return []
        c.refereed = True
        who = sorted(c.votes)
        out: list[Output] = [Log(f"spot-check of micro-batch {j} of step {self.step}: "
                                 f"{' and '.join(self._name(p) for p in who)} differ; "
                                 "the coordinator computes it")]
        return out + self._dispatch([self._new_task(self.me, (j,), "referee")])

    def _decide(self, j: int, by: str) -> list[Output]:
        c = self.checks[j]
        c.decided, c.decided_by = c.votes[by], by
        ref = c.decided[0]
        out: list[Output] = []
        for peer, (ints, _, _) in sorted(c.votes.items()):
            if not np.array_equal(ints, ref):
                out += self._strike(peer, "mismatch", j,
                                    f"spot-check mismatch: {self._name(peer)} sent a wrong "
                                    f"contribution for micro-batch {j} of step {self.step} "
                                    f"(the reference is {self._name(by)}'s)")
        return out

    def _strike(self, peer: str, kind: str, micro: int | None, text: str) -> list[Output]:
        """One strike against ``peer``; at the run's ``strikes`` it is removed."""
        if peer == self.me or peer in self.banned:
            return [Log(text, loud=True)]
        n = self.strike_count[peer] = self.strike_count.get(peer, 0) + 1
        text = f"{text} (strike {n} of {self.strikes})"
        out: list[Output] = [Log(text, loud=True),
                             Alarm(kind, peer, self.names.get(peer, peer), self.step, micro, n, text)]
        if n >= self.strikes:
            out += self._remove(peer, n)
        return out

    def _remove(self, peer: str, n: int) -> list[Output]:
        """Remove a liar: it gets no more work or totals, and none of its answers of this
        step that a spot-check did not confirm is used (they are computed again)."""
        self.banned.add(peer)
        text = f"liar removed: {self.names.get(peer, peer)} ({peer}) after {n} strikes"
        out: list[Output] = [Log(text, loud=True),
                             Alarm("removed", peer, self.names.get(peer, peer), self.step, None, n, text)]
        for t in self.tasks.values():
            if t.result is not None and t.result[0] == peer:
                c = self.checks.get(t.micro[0]) if len(t.micro) == 1 else None
                if c is None or c.decided is None:
                    t.result = None
        for c in self.checks.values():
            if c.decided is None:
                c.votes.pop(peer, None)
        return out + self._member_left(peer, quiet=True, force=True)

    def _commit(self) -> list[Output]:
        total = np.zeros(self.trainer.layout.size, np.int64)
        per: dict[str, int] = {}
        loss_sum, n = 0.0, 0
        for t in sorted((t for t in self.tasks.values() if t.kind == "main"), key=lambda t: t.task):
            peer, ints, loss, _ = t.result
            c = self.checks.get(t.micro[0]) if len(t.micro) == 1 else None
            if c is not None:  # a spot-checked micro-batch: the reference answer counts
                ref, loss, _ = c.decided
                if not np.array_equal(ints, ref):
                    peer, ints = c.decided_by, ref
            total += ints
            per[peer] = per.get(peer, 0) + len(t.micro)
            loss_sum += loss
            n += len(t.micro)
        contributors = tuple(sorted(per.items()))
        step = self.step
        self.trainer.apply(total)
        sha = self._hash()
        loss = loss_sum / max(n, 1)  # the mean over micro-batches of their mean loss
        receivers = self._receivers()
        self.step_started = False
        self.tasks, self.checks = {}, {}
        self.pending = {k: v for k, v in self.pending.items() if k[0] > step}
        committed = self._committed(step, loss, contributors, sha)
        # the next step's assign rides on each member's total: one message down per step
        nxt, carried = [], {}
        for o in self._maybe_begin():
            if isinstance(o, Send) and isinstance(o.message, F.Assign) and o.to in receivers \
                    and o.message.step == self.step and o.to not in carried:
                carried[o.to] = o.message.tasks
            else:
                nxt.append(o)
        out: list[Output] = [Send(p, F.Total(self.term, step, contributors, loss, sha, total,
                                             carried.get(p, ()))) for p in receivers]
        return out + committed + nxt

    def _committed(self, step, loss, contributors, sha) -> list[Output]:
        for peer, n in contributors:
            self.done_by[peer] = self.done_by.get(peer, 0) + n
        mine = dict(contributors).get(self.me, 0)
        return [Committed(step, loss, contributors, mine, sha)]

    def _apply(self, ints, loss, contributors, sha, sender) -> list[Output]:
        step = self.step
        self.trainer.apply(ints)
        self.pending = {k: v for k, v in self.pending.items() if k[0] > step}
        out = self._committed(step, loss, contributors, sha)
        mine = self._hash()
        if mine != sha:
            out.append(Log(f"PARAMETER HASH MISMATCH after step {step}: {mine[:16]} here, "
                           f"{sha[:16]} at the coordinator: resyncing", loud=True))
            out.append(Send(sender, F.SyncRequest(self.term, self.step, mine, "hash mismatch")))
        return out

    def _check_catch_up(self) -> list[Output]:
        """A member that said it is ahead sent no usable STATE in SYNC_WAIT_S (it never
        answered, or its state was refused): go on from ours and bring it to it."""
        if not self.catching_up or self.now < self.catch_until:
            return []
        self.catching_up = False
        peer, m = self.catch_from, self.members.get(self.catch_from)
        out: list[Output] = [Log(f"{self._name(peer)} sent no state in {SYNC_WAIT_S:g} s: going "
                                 f"on from step {self.step}", loud=True)]
        if m is not None and m.ready and not m.refused and peer not in self.banned:
            m.synced = True
            out.append(Send(peer, self._state()))
        return out

    def _member_left(self, peer: str, quiet: bool = False, force: bool = False) -> list[Output]:
        if not self.coordinating or peer == self.me:
            return []
        if self.catching_up and peer == self.catch_from:
            self.catching_up = False
            return [Log(f"{self._name(peer)} left before sending its state: going on from step "
                        f"{self.step}", loud=True)] + self._member_left(peer, quiet, force) + \
                self._maybe_begin()
        m = self.members.get(peer)
        if m is not None and (not m.refused or force):
            del self.members[peer]
        orphans = []
        for t in list(self.tasks.values()):
            if t.result is None and peer in t.assignees:
                t.assignees.remove(peer)
                if not t.assignees:
                    orphans.append(t)
        if not orphans:
            out: list[Output] = [] if quiet or m is None else [Log(f"{self._name(peer)} left")]
            for j in sorted(self.checks):
                out += self._judge(j)
            return out + self._maybe_commit()
        live = self._live()
        new = []
        for t in orphans:  # split its micro-batches over those still here
            del self.tasks[t.task]
            if t.kind != "main":
                continue  # a second opinion nobody gives: the check decides with the others
            for who, micro in zip(live, capacity_split(list(t.micro), [self._cap(p) for p in live])):
                if micro:
                    new.append(self._new_task(who, tuple(micro)))
        mains = [j for t in orphans if t.kind == "main" for j in t.micro]
        out: list[Output] = [Log(f"{self._name(peer)} left during step {self.step}: its micro-batches "
                                 f"{mains} go to the others")] if mains else []
        out += self._dispatch(new)
        for j in sorted(self.checks):
            out += self._judge(j)
        return out + self._maybe_commit()

    def _check_deadlines(self) -> list[Output]:
        if not self.step_started:
            return []
        late, added, dropped = [], {}, []
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
            if not spare and t.kind != "main":
                dropped.append(t)  # nobody else can give this second opinion: go without it
                continue
            if not spare:
                t.deadline = self.now + self._deadline(t.assignees[0], len(t.micro))
                continue
            backup = max(spare, key=lambda p: (self._cap(p), p == self.me))
            t.assignees.append(backup)
            t.sent_at = self.now
            t.deadline = self.now + self._deadline(backup, len(t.micro))
            late.append(t)
            added[t.task] = backup
        out: list[Output] = []
        if late:
            out += [Log(f"task(s) {[t.task for t in late]} of step {self.step} missed the deadline: "
                        "backup assigned")] + self._dispatch(late, added)
        if dropped:
            for t in dropped:
                del self.tasks[t.task]
            out.append(Log(f"spot-check(s) of micro-batch(es) {[t.micro[0] for t in dropped]} of step "
                           f"{self.step} got no second answer in time: dropped"))
            for j in sorted(self.checks):
                out += self._judge(j)
            out += self._maybe_commit()
        return out

    def _end(self) -> list[Output]:
        self.ended = True
        sha = self._hash()
        msg = F.End(self.term, self.step, sha)
        return [Send(p, msg) for p in self._receivers()] + [Ended(self.step, sha, True)]

    def _answered(self, peer: str) -> bool:
        m = self.members.get(peer)
        return m is not None and (m.ready or m.refused)

    def restore(self, step: int, theta: np.ndarray, adam, params_sha256: str | None = None,
                source: str = "a checkpoint", steps: int | None = None) -> list[Output]:
        """The coordinator restores the whole room from a checked state (``adam``: an
        ``AdamState``): it loads it, opens a new term (open work is dropped) and sends each
        member ``restore`` + STATE + ``run``; training continues from ``step`` (to ``steps``,
        the run's total, if given). Raises
        RestoreError when this peer does not coordinate or the state does not fit the run."""
        from daisychain.engine.trainer import params_sha256 as sha_of
        if not self.coordinating or self.trainer is None:
            raise RestoreError("only the coordinator (the room's host) restores the room")
        n = self.trainer.layout.size
        theta = np.array(theta, np.float64)
        m, v = np.array(adam.m, np.float64), np.array(adam.v, np.float64)
        if theta.shape != (n,) or m.shape != (n,) or v.shape != (n,):
            raise RestoreError(f"the state holds {theta.size} parameters, the run's model {n}")
        if not (np.isfinite(theta).all() and np.isfinite(m).all() and np.isfinite(v).all()):
            raise RestoreError("the state holds non-finite values")
        sha = sha_of(theta)
        if params_sha256 is not None and params_sha256 != sha:
            raise RestoreError(f"the state's parameters hash to {sha}, not {params_sha256}")
        st = self.trainer.state
        st.theta[:] = theta
        st.adam.m, st.adam.v = m, v
        st.adam.b1t, st.adam.b2t = float(adam.b1t), float(adam.b2t)
        st.adam.step = st.step = int(step)
        if steps is not None:
            self.steps = int(steps)
        self.term += 1
        self.restored_term = self.term
        self.tasks, self.step_started, self.catching_up, self.ended = {}, False, False, False
        self.checks = {}
        self.pending.clear()
        for mem in self.members.values():
            mem.ready = mem.synced = False
        targets = self._announce_targets()
        self.wait_for, self.wait_until = set(targets), self.now + RESTORE_WAIT_S
        out: list[Output] = [Log(f"restored the room from {source}: step {step}, params {sha[:12]} "
                                 f"(term {self.term})"), Restored(int(step), sha, self.me)]
        state, announce = self._state(), self._announce()
        for p in targets:  # a member that never joined gets the state when it answers `run`
            if p in self.members and not self.members[p].refused:
                out += [Send(p, F.Restore(self.term, int(step), sha)), Send(p, state)]
            out.append(Send(p, announce))
        return out + self._maybe_begin()

    def start(self, now: float) -> list[Output]:
        """The host of a new room: start coordinating (call once the signaling id is known)."""
        self.now = now
        if self.host is None:
            self.host = self.me
        out = [] if self.coordinating else self._become_coordinator(None)
        # members the run was announced to get a while to answer before the first step
        self.wait_for, self.wait_until = set(self._announce_targets()), now + START_WAIT_S
        return out + self._maybe_begin()

    def summary(self) -> dict:
        return {"run_id": self.run_id, "step": self.step, "done_by": dict(self.done_by),
                "params_sha256": self._hash() if self.trainer else None}
