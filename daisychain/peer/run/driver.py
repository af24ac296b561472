"""The thin driver: one replica of one run, as a plain object (no sockets, no clock, no
threads). It holds what every role shares (the settings, the room, the clock) and two role
objects: always a :class:`~.member.Member` (the replica: its trainer, the run it follows,
compute, apply, state sync) and, while this peer is the room's host, a
:class:`~.coordinator.Coordinator` built from that member's state (split, dispatch,
deadlines, commit, and its :class:`~.trust.Trust`). Hand-over is building one;
stepping down is dropping it (the member takes over its term). Each input goes to the role
that handles it. The roles read the driver through a read-only :class:`~.context.RunContext`;
what they change of it comes back as outputs that the driver applies (:meth:`RunPeer._applied`)
before it returns the rest. See the package docstring for the protocol."""

from __future__ import annotations

import math
import secrets
from typing import Callable

from daisychain.engine.model import Result
from daisychain.engine.trainer import Trainer
from daisychain.peer import frames as F
from daisychain.peer.protocol_table import CONSTANTS, handled_by
from daisychain.peer.run.context import SETTINGS, RunContext
from daisychain.peer.run.coordinator import Coordinator
from daisychain.peer.run.member import Member
from daisychain.peer.run.outputs import Committed, Log, Output, RestoreError, Setting
from daisychain.peer.run.split import measure_capacity
from daisychain.peer.run.ring import AGGREGATES

#: default share of micro-batches spot-checked by a second peer, and mismatches tolerated
#: (the protocol table, peer/run_protocol.json, holds both languages' constants)
VERIFY_RATE = CONSTANTS["VERIFY_RATE"]
STRIKES = CONSTANTS["STRIKES"]

#: refusals of a sender's bad messages that are logged (and struck): at least the run's
#: strikes, so a member is removed first; past it the rest are dropped without a line (a flood
#: of 20,000 bad frames is 32 lines, not 20,000)
REFUSAL_LINES = CONSTANTS["REFUSAL_LINES"]

#: the messages each role handles, from the protocol table (others are dropped: a
#: coordinator takes no assign, a member no contribution)
MEMBER_MESSAGES = handled_by("member")
COORDINATOR_MESSAGES = handled_by("coordinator")
#: the messages of a way to sum a step (ring_roles.py), handled by the role's ``aggregation``: a chunk by whichever
#: role speaks for the replica, a plan and a commit by a member, a sum by the coordinator
MEMBER_RING_MESSAGES = handled_by("member_ring")
COORDINATOR_RING_MESSAGES = handled_by("coordinator_ring")


def message_name(msg) -> str:
    return getattr(msg, "T", None) or type(msg).__name__.lower()


class RunPeer:
    """One replica of one run. ``me`` is this peer's signaling id."""

    def __init__(self, me: str, *, kind: str = "python", make_trainer: Callable | None = None,
                 capacity: float | None = None, selftest: tuple[bool, str] = (True, "ok"),
                 trainer: Trainer | None = None, steps: int = 0, wait_peers: int = 0,
                 verify_rate: float = VERIFY_RATE, strikes: int = STRIKES,
                 verify_key: str | None = None, window: int | None = None, aggregate: str = "star"):
        self.me = me
        if aggregate not in AGGREGATES:
            raise ValueError(f"the aggregation must be one of {', '.join(AGGREGATES)}")
        if aggregate == "ring" and verify_rate > 0:
            raise ValueError("--aggregate ring needs --verify-rate 0: a ring hides each "
                             "contribution from the spot-checks")
        self.aggregate = aggregate  # auto | star | ring: how a coordinator sums (ring.py)
        if not (math.isfinite(verify_rate) and 0.0 <= verify_rate <= 1.0):
            raise ValueError("the verify rate must be in [0, 1]")
        if not 1 <= int(strikes) <= F.MAX_STRIKES:
            raise ValueError(f"strikes must be in [1, {F.MAX_STRIKES}]")
        self.verify_rate = float(verify_rate)   # the run's (a member takes its announce's)
        self.strikes = int(strikes)
        self.verify_key = verify_key or secrets.token_hex(16)
        self.window_size = window  # the rollback window in steps (None: from the verify rate)
        self.names: dict[str, str] = {}    # signaling id -> the name it gave (for logs)
        self.kind = kind
        self.make_trainer = make_trainer   # (identity, Dataset) -> Trainer (this peer's units)
        self.capacity = capacity
        self.selftest = selftest
        self.steps = steps                 # the run's length (the announce's, or ours as host)
        self.wait_peers = wait_peers       # the host waits once for this many members
        self.now = 0.0
        self.host: str | None = None      # the room host per the signaling server
        self.prev_host: str | None = None  # the host it named before (who hands over to the next)
        self.open: set[str] = set()       # peers with an open data channel
        self.room: set[str] = set()       # approved members per the signaling server
        self.done_by: dict[str, int] = {}  # peer -> micro-batches committed (everyone tracks)
        self.refusals: dict[str, int] = {}  # peer -> bad messages refused
        self.context = RunContext(self)    # what the roles read of this driver
        self.member = Member(self.context, trainer)
        if trainer is not None and self.capacity is None:  # the host of a new room
            self.capacity = measure_capacity(trainer)
        self.coordinator: Coordinator | None = None  # while this peer is the room's host

    # -- what callers read -----------------------------------------------------------------

    @property
    def coordinating(self) -> bool:
        return self.coordinator is not None

    @property
    def role(self):
        """The role that speaks for this replica now: the coordinator, else the member."""
        return self.coordinator or self.member

    @property
    def trainer(self) -> Trainer | None:
        return self.member.trainer

    @property
    def bounds(self):
        return self.member.bounds

    @property
    def step(self) -> int:
        return self.member.step

    @property
    def term(self) -> int:
        return self.role.term

    @property
    def run(self) -> F.Run | None:
        """The announce: our own while coordinating, else the one the member follows."""
        return self.role.run

    @property
    def run_id(self) -> str:
        return self.run.run_id if self.run else ""

    @property
    def ended(self) -> bool:
        return self.role.ended

    @property
    def refused(self) -> bool:
        return self.member.refused

    @property
    def coord(self) -> str | None:
        return self.me if self.coordinator else self.member.coord

    def _name(self, peer: str) -> str:
        name = self.names.get(peer)
        return f"{name} ({peer})" if name and name != peer else peer

    def _applied(self, out: list[Output]) -> list[Output]:
        """The roles' outputs of one input: their ``Setting``s applied here (and dropped), the
        micro-batches of each ``Committed`` counted; the rest goes to the shell."""
        rest: list[Output] = []
        for o in out:
            if isinstance(o, Setting):
                if o.name not in SETTINGS:
                    raise ValueError(f"a role may not set the driver's {o.name!r}")
                setattr(self, o.name, o.value)
                continue
            if isinstance(o, Committed):
                for peer, n in o.contributors:
                    self.done_by[peer] = self.done_by.get(peer, 0) + n
            rest.append(o)
        return rest

    # -- hand-over -------------------------------------------------------------------------

    def _lead(self, old_host: str | None) -> list[Output]:
        """This peer became the room's host: a coordinator from the member's state (it takes
        over the wait for members: the driver's ends)."""
        self.coordinator = Coordinator(self.context, self.member)
        self.wait_peers = 0
        return self.coordinator.begin(old_host)

    def _lead_if_named(self, out: list[Output]) -> list[Output]:
        """The room named this peer host while it was still joining (no replica yet, so it
        could not lead then): it leads once its replica is built. Before, nobody
        coordinated: the old host had stepped down and the room waited for ever."""
        if self.host == self.me and self.coordinator is None and self.trainer is not None \
                and self.member.run and not self.member.refused:
            return out + self._applied(self._lead(self.member.coord))
        return out

    def _step_down(self, host: str | None) -> list[Output]:
        """Another host was named (we were away): drop the coordinator, follow that host."""
        self.member.follow_after(self.coordinator)
        self.coordinator = None
        return [Log(f"{host} is the coordinator now")]

    # -- inputs ----------------------------------------------------------------------------

    def start(self, now: float) -> list[Output]:
        """The host of a new room: start coordinating (call once the signaling id is known)."""
        self.now = now
        if self.host is None:
            self.host = self.me
        out = [] if self.coordinator else self._lead(None)
        return self._applied(out + self.coordinator.start())

    def restore(self, step: int, theta, adam, params_sha256: str | None = None,
                source: str = "a checkpoint", steps: int | None = None) -> list[Output]:
        """The coordinator restores the whole room (:meth:`.Coordinator.restore`)."""
        if self.coordinator is None or self.trainer is None:
            raise RestoreError("only the coordinator (the room's host) restores the room")
        return self._applied(self.coordinator.restore(step, theta, adam, params_sha256, source, steps))

    def tick(self, now: float) -> list[Output]:
        self.now = now
        return self._applied(self.coordinator.tick() if self.coordinator else self.member.tick())

    def room_changed(self, ids, host: str | None, names: dict | None = None) -> list[Output]:
        """The signaling room changed: approved online members ``ids`` (self included);
        ``names``: id -> the name each gave the server (used in logs)."""
        out: list[Output] = []
        self.room = set(ids)
        if names:
            self.names.update({str(k): str(v)[:64] for k, v in names.items()})
        old_host, self.host = self.host, host
        if host != old_host:
            self.prev_host = old_host
        if host == self.me and self.coordinator is None and self.trainer is not None and self.member.run:
            out += self._lead(old_host)
        elif host != self.me and self.coordinator is not None:
            out += self._step_down(host)
        if self.coordinator:
            return self._applied(out + self.coordinator.room_left())
        out = self._applied(out + self.member.host_named())
        return out + self._applied(self.member.aggregation.peers_changed())

    def channel_open(self, peer: str) -> list[Output]:
        self.open.add(peer)
        return self._applied(self.coordinator.channel_open(peer)) if self.coordinator else []

    def channel_closed(self, peer: str) -> list[Output]:
        self.open.discard(peer)
        if self.coordinator:
            return self._applied(self.coordinator.member_left(peer))
        return self._applied(self.member.aggregation.peers_changed())

    def receive(self, sender: str, msg: F.RunMessage, run_id: str = "") -> list[Output]:
        """A decoded message; ``run_id`` is its frame header's. Messages of another run than
        the one this peer follows are dropped (loudly); only a peer whose run ended takes a
        ``run`` announce of a new one. Each message goes to the role that handles it."""
        if run_id and self.run_id and run_id != self.run_id and not (
                isinstance(msg, F.Run) and self.ended and self.coordinator is None):
            return [Log(f"a {message_name(msg)} message of run {run_id} from {self._name(sender)}; "
                        f"this peer follows run {self.run_id}: dropped", loud=True)]
        name = type(msg).__name__.lower()
        if name == "datarequest":  # either role serves the run's dataset
            return self._applied(self.member.on_datarequest(sender, msg))
        role = self.coordinator
        if role is None:
            role = self.member
            if name in MEMBER_RING_MESSAGES:
                return self._applied(role.aggregation.on_message(sender, msg))
            if name not in MEMBER_MESSAGES:
                return []
        elif name in COORDINATOR_RING_MESSAGES:
            return self._applied(role.aggregation.on_message(sender, msg))
        elif name not in COORDINATOR_MESSAGES:
            return []
        out = self._applied(getattr(role, "on_" + name)(sender, msg))
        return self._lead_if_named(out) if name == "data" and self.coordinator is None else out

    def bad_message(self, sender: str, reason: str) -> list[Output]:
        """``sender`` sent bytes that are not a valid message (``reason``). Logged by name;
        the coordinator counts it as a strike against a member of the run. Past
        ``max(REFUSAL_LINES, strikes)`` of one sender the rest are dropped without a line."""
        n = self.refusals[sender] = self.refusals.get(sender, 0) + 1
        limit = max(REFUSAL_LINES, self.strikes)
        if n > limit:
            return []
        if n == limit:
            reason += (f"; its next messages that are not valid are dropped without a line "
                       f"({limit} refused)")
        if self.coordinator:
            return self._applied(self.coordinator.bad_message(sender, reason))
        return [Log(f"refused a message from {self._name(sender)}: {reason}", loud=True)]

    def muted(self, sender: str) -> bool:
        """``sender`` sent more bad messages than :meth:`bad_message` logs and is not the
        coordinator this replica follows: its messages need not even be decoded."""
        return self.refusals.get(sender, 0) > max(REFUSAL_LINES, self.strikes) and sender != self.coord

    def computed(self, step: int, task: int, result: Result, term: int | None = None,
                 seconds: float | None = None) -> list[Output]:
        """A compute finished; ``term``: the :class:`Compute`'s (a result of an older term,
        whose task numbers another coordinator reused, is dropped); ``seconds``: how long
        the compute itself took (the shell's clock; the coordinator's split uses it)."""
        if seconds is not None and self.coordinator is not None and (term is None or term == self.coordinator.term):
            self.coordinator.compute_took(step, task, seconds)
        return self._applied(self.role.computed(step, task, result, term))

    def data(self, blob: bytes | None) -> list[Output]:
        """The dataset fetch finished (``None``: failed)."""
        return self._lead_if_named(self._applied(self.member.data(blob)))

    def summary(self) -> dict:
        return {"run_id": self.run_id, "step": self.step, "done_by": dict(self.done_by),
                "params_sha256": self.member.sha() if self.trainer else None}
