"""The thin driver: one replica of one run, as a plain object (no sockets, no clock, no
threads). It holds what every role shares (the trainer, the room, the term) and routes each
input to its role: :class:`~.member.MemberRole` (follow a coordinator: compute, apply,
state sync), :class:`~.coordinator.CoordinatorRole` (split, dispatch, deadlines, commit),
:class:`~.trust.TrustRole` (spot-check verdicts, strikes, removal and rollback of a liar).
See the package docstring for the protocol."""

from __future__ import annotations

import math
import secrets
from typing import Callable

import numpy as np

from daisychain.engine.model import Result
from daisychain.engine.trainer import Trainer
from daisychain.peer import frames as F
from daisychain.peer.run.coordinator import CoordinatorRole
from daisychain.peer.run.member import MemberRole
from daisychain.peer.run.outputs import Log, Output, Send
from daisychain.peer.run.ring import RingRole
from daisychain.peer.run.rollback import Window
from daisychain.peer.run.split import measure_capacity
from daisychain.peer.run.state import tensor_bounds
from daisychain.peer.run.trust import TrustRole

#: default share of micro-batches spot-checked by a second peer, and mismatches tolerated
VERIFY_RATE = 0.05
STRIKES = 3


def message_name(msg) -> str:
    return getattr(msg, "T", None) or type(msg).__name__.lower()


class RunPeer(MemberRole, CoordinatorRole, TrustRole, RingRole):
    """One replica of one run. ``me`` is this peer's signaling id."""

    def __init__(self, me: str, *, kind: str = "python", make_trainer: Callable | None = None,
                 capacity: float | None = None, selftest: tuple[bool, str] = (True, "ok"),
                 trainer: Trainer | None = None, steps: int = 0, wait_peers: int = 0,
                 verify_rate: float = VERIFY_RATE, strikes: int = STRIKES,
                 verify_key: str | None = None, window: int | None = None, aggregate: str = "star"):
        self.me = me
        if not (math.isfinite(verify_rate) and 0.0 <= verify_rate <= 1.0):
            raise ValueError("the verify rate must be in [0, 1]")
        if not 1 <= int(strikes) <= F.MAX_STRIKES:
            raise ValueError(f"strikes must be in [1, {F.MAX_STRIKES}]")
        self.verify_rate = float(verify_rate)
        self.strikes = int(strikes)
        self.verify_key = verify_key or secrets.token_hex(16)
        self.window_size = window  # the rollback window in steps (None: from the verify rate)
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
        self.window = Window(0)           # coordinator: the rollback window (see rollback.py)
        self.unchecked_since: dict[str, int] = {}  # coordinator: peer -> first unchecked step
        self._ring_init(aggregate)  # ring hook: auto | star | ring (peer/run/ring.py)
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

    # -- inputs ----------------------------------------------------------------------------

    def tick(self, now: float) -> list[Output]:
        self.now = now
        if not self.coordinating or self.ended:
            return []
        return self._check_catch_up() + self._check_deadlines() + self._ring_check_deadline() + \
            self._maybe_begin()

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
        return out + self._ring_stuck()  # ring hook

    def channel_open(self, peer: str) -> list[Output]:
        self.open.add(peer)
        if self.coordinating and self.run and not self.ended:
            return [Send(peer, self._announce())]
        return []

    def channel_closed(self, peer: str) -> list[Output]:
        self.open.discard(peer)
        return self._member_left(peer) if self.coordinating else self._ring_stuck()  # ring hook

    def receive(self, sender: str, msg: F.RunMessage, run_id: str = "") -> list[Output]:
        """A decoded message; ``run_id`` is its frame header's. Messages of another run than
        the one this peer follows are dropped (loudly); only a peer whose run ended takes a
        ``run`` announce of a new one."""
        if run_id and self.run_id and run_id != self.run_id and not (
                isinstance(msg, F.Run) and self.ended and not self.coordinating):
            return [Log(f"a {message_name(msg)} message of run {run_id} from {self._name(sender)}; "
                        f"this peer follows run {self.run_id}: dropped", loud=True)]
        name = type(msg).__name__.lower()
        if name == "refuse" and not self.coordinating:
            return self._member_on_refuse(sender, msg)
        handler = getattr(self, "_on_" + name)
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
        if self._ring_owns(step, task):  # ring hook: a share of this replica's ring
            return self._ring_computed(step, task, result.grad, loss, correct)
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

    def summary(self) -> dict:
        return {"run_id": self.run_id, "step": self.step, "done_by": dict(self.done_by),
                "params_sha256": self._hash() if self.trainer else None}
