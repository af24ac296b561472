"""The typed run messages (:class:`Run`, :class:`Ready`, ..., :class:`Total`) and their
wire form: :func:`to_message` / :func:`from_message` between them and a
:class:`~daisychain.peer.framing.Message`, every meta field checked. One of the three parts
of the wire format (:mod:`daisychain.peer.frames`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from daisychain.engine.spec import MAX_CAPACITY, MIN_CAPACITY  # a ``ready`` capacity lies in this range
from daisychain.peer.framing import FrameError, FrameType, Message
from daisychain.peer.intcodec import decode_ints, decode_state, encode_ints, encode_state
from daisychain.peer.protocol_table import CONSTANTS

#: most strikes a run may allow before a peer is removed (the protocol table's constants)
MAX_STRIKES = CONSTANTS["MAX_STRIKES"]


# -- run messages: the typed view of a Message ----------------------------------------------
#
# CONTROL meta carries its name in "t". Every field is checked here; nothing else in Python
# reads a meta field name.


@dataclass(frozen=True)
class Task:
    task: int            #: coordinator-local task number within the step
    peer: str            #: signaling id of the peer that computes it
    micro: tuple[int, ...]  #: micro-batch indices of the step (sorted, distinct)


@dataclass(frozen=True)
class Run:
    """Coordinator -> member: the run, its identity and where it stands."""
    T = "run"
    identity: dict
    run_id: str
    steps: int
    term: int
    step: int
    params_sha256: str
    coordinator: str
    verify_rate: float = 0.05   #: share of micro-batches spot-checked by a second peer
    strikes: int = 3            #: mismatches after which a peer is removed from the run
    removed: tuple[str, ...] = ()  #: peers removed from the run (liars): a new coordinator keeps them out


@dataclass(frozen=True)
class Ready:
    """Member -> coordinator: identity and self-test passed; what state this replica holds."""
    T = "ready"
    term: int
    capacity: float
    kind: str
    step: int
    params_sha256: str


@dataclass(frozen=True)
class Refuse:
    """Member -> coordinator: this peer does not take part; ``reasons`` say why."""
    T = "refuse"
    term: int
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Assign:
    """Coordinator -> every member: tasks of a step (the first of a step, then additions:
    a re-assignment or a backup for a slow peer)."""
    T = "assign"
    term: int
    step: int
    tasks: tuple[Task, ...]


@dataclass(frozen=True)
class SyncRequest:
    """Ask the receiver for its STATE (hash mismatch, or a coordinator catching up)."""
    T = "sync"
    term: int
    step: int
    params_sha256: str
    reason: str


@dataclass(frozen=True)
class DataRequest:
    """Member -> coordinator: send the dataset bytes (the server did not have them)."""
    T = "data_request"
    fingerprint: str


@dataclass(frozen=True)
class Restore:
    """Coordinator -> member: the host restored the room from a checked checkpoint. Load the
    STATE that follows (it must be this step and hash) whatever step you hold; a new term."""
    T = "restore"
    term: int
    step: int
    params_sha256: str


@dataclass(frozen=True)
class End:
    T = "end"
    term: int
    step: int
    params_sha256: str


@dataclass(frozen=True)
class Contrib:
    """A task's integer partial sum (body), with display-only loss and correct counts."""
    term: int
    step: int
    task: int
    micro: tuple[int, ...]
    loss: float
    correct: int
    ints: np.ndarray = field(repr=False, compare=False)


@dataclass(frozen=True)
class Total:
    """The committed total of a step: exactly one contribution per task; every replica
    applies it, then compares its parameter hash with ``params_sha256``. ``tasks``: the
    receiver's own tasks of the next step (the step's ``assign``, carried here so that a step
    is one message down and one up per member)."""
    term: int
    step: int
    contributors: tuple[tuple[str, int], ...]  #: (peer, micro-batches) that made the step
    loss: float
    params_sha256: str  #: the coordinator's hash after applying it
    ints: np.ndarray = field(repr=False, compare=False)
    tasks: tuple[Task, ...] = ()
    #: ``ints`` already encoded (codec, body), by the coordinator that sends one total to every
    #: member and keeps it in its rollback window: encoded once, not once per receiver
    encoded: tuple[int, bytes] | None = field(default=None, repr=False, compare=False)
    #: peers with a contribution in it that no spot-check confirmed (every replica's rollback
    #: window keeps them: a new coordinator can still roll a liar's lie back)
    unchecked: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()  #: peers removed from the run so far


@dataclass(frozen=True)
class State:
    step: int
    params_sha256: str
    theta: np.ndarray = field(repr=False, compare=False)
    m: np.ndarray = field(repr=False, compare=False)
    v: np.ndarray = field(repr=False, compare=False)
    b1t: float = 1.0
    b2t: float = 1.0


@dataclass(frozen=True)
class Data:
    fingerprint: str
    data: bytes = field(repr=False, compare=False)


# -- the ring all-reduce (daisychain/peer/run/ring.py) --------------------------------------


@dataclass(frozen=True)
class RingPlan:
    """Coordinator -> each ring member: step ``step`` is summed by a ring: ``peers`` in ring
    order (each sends to the next, the last to the first), ``tasks`` the receiver's own.
    ``ring`` numbers the coordinator's rings; a redone step gets a new one."""
    T = "ring_plan"
    term: int
    step: int
    ring: int
    peers: tuple[str, ...]
    tasks: tuple[Task, ...]


@dataclass(frozen=True)
class RingSum:
    """Member -> coordinator: its share of the ring's step is computed (display-only loss and
    correct count; the integers travel around the ring)."""
    T = "ring_sum"
    term: int
    step: int
    ring: int
    micro: tuple[int, ...]
    loss: float
    correct: int


@dataclass(frozen=True)
class RingCommit:
    """Coordinator -> each ring member: the ring's total of ``step`` is committed; apply the
    total your ring gathered and compare your hash with ``params_sha256``."""
    T = "ring_commit"
    term: int
    step: int
    ring: int
    contributors: tuple[tuple[str, int], ...]
    loss: float
    params_sha256: str


@dataclass(frozen=True)
class RingChunk:
    """Ring member -> the next one: chunk ``chunk`` of the ring's vector in ``phase`` 0
    (reduce-scatter: a partial sum) or 1 (all-gather: the total), round ``round`` of n - 1."""
    T = "ring_chunk"  # (a RING frame, not CONTROL: the name is for logs, as the JS twin's)
    term: int
    step: int
    ring: int
    phase: int
    round: int
    chunk: int
    ints: np.ndarray = field(repr=False, compare=False)


CONTROLS = (Run, Ready, Refuse, Assign, SyncRequest, DataRequest, Restore, End, RingPlan, RingSum,
            RingCommit)
RunMessage = (Run | Ready | Refuse | Assign | SyncRequest | DataRequest | Restore | End | Contrib
              | Total | State | Data | RingPlan | RingSum | RingCommit | RingChunk)
#: most members of a ring (a plan's peers)
MAX_RING = CONSTANTS["MAX_RING"]
_HEX = set("0123456789abcdef")


class _M:
    """Reads meta fields, raising FrameError naming the message and the field."""

    def __init__(self, meta: dict, name: str):
        self.meta, self.name = meta, name

    def fail(self, msg: str) -> FrameError:
        return FrameError(f"{self.name}: {msg}")

    def int(self, key: str, lo: int = 0, hi: int = 2**32 - 1) -> int:
        v = self.meta.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.fail(f"'{key}' must be an integer in [{lo}, {hi}]")
        return v

    def num(self, key: str, lo: float = -1e300, hi: float = 1e300) -> float:
        v = self.meta.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or not lo <= v <= hi:
            raise self.fail(f"'{key}' must be a finite number in [{lo:g}, {hi:g}]")
        return float(v)

    def str(self, key: str, max_chars: int = 256) -> str:
        v = self.meta.get(key)
        if not isinstance(v, str) or len(v) > max_chars:
            raise self.fail(f"'{key}' must be a string of at most {max_chars} characters")
        return v

    def hex(self, key: str, n: int = 64) -> str:
        v = self.str(key, n)
        if len(v) != n or not set(v) <= _HEX:
            raise self.fail(f"'{key}' must be {n} lowercase hex digits")
        return v

    def micro(self, v, where: str) -> tuple[int, ...]:
        if not isinstance(v, list) or not v or len(v) > 1 << 20 or not all(
                isinstance(j, int) and not isinstance(j, bool) and 0 <= j < 2**31 for j in v):
            raise self.fail(f"'{where}' must be a non-empty list of micro-batch indices")
        if list(v) != sorted(set(v)):
            raise self.fail(f"'{where}' must be sorted and without repeats")
        return tuple(v)

    def list(self, key: str, max_len: int = 1 << 16) -> list:
        v = self.meta.get(key)
        if not isinstance(v, list) or len(v) > max_len:
            raise self.fail(f"'{key}' must be a list")
        return v


def _ids(f: "_M", key: str) -> tuple[str, ...]:
    """An optional list of peer ids (absent: none)."""
    if key not in f.meta:
        return ()
    ids = f.list(key, MAX_RING)
    if not all(isinstance(p, str) and 0 < len(p) <= 64 for p in ids):
        raise f.fail(f"'{key}' must be peer ids")
    return tuple(ids)


def _tasks_meta(tasks) -> list:
    return [{"task": t.task, "peer": t.peer, "micro": list(t.micro)} for t in tasks]


def _contributors(f: "_M") -> tuple[tuple[str, int], ...]:
    out = []
    for c in f.list("contributors"):
        if not (isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and len(c[0]) <= 64
                and isinstance(c[1], int) and not isinstance(c[1], bool) and c[1] >= 0):
            raise f.fail("'contributors' must be [peer, micro-batches] pairs")
        out.append((c[0], c[1]))
    return tuple(out)


def _tasks(f: "_M") -> tuple[Task, ...]:
    out = []
    for t in f.list("tasks"):
        if not isinstance(t, dict):
            raise f.fail("'tasks' must be objects")
        g = _M(t, f"{f.name}.tasks")
        out.append(Task(g.int("task"), g.str("peer", 64), g.micro(t.get("micro"), "micro")))
    return tuple(out)


def to_message(msg: RunMessage, run_id: str, bounds: list[int] | None = None) -> Message:
    """The wire form of a run message (integer bodies get their best codec)."""
    if isinstance(msg, Contrib):
        codec, body = encode_ints(msg.ints, bounds)
        return Message(FrameType.CONTRIB, run_id, msg.step,
                       {"term": msg.term, "task": msg.task, "micro": list(msg.micro),
                        "loss": msg.loss, "correct": msg.correct}, body, codec)
    if isinstance(msg, Total):
        codec, body = msg.encoded or encode_ints(msg.ints, bounds)
        meta = {"term": msg.term, "contributors": [list(c) for c in msg.contributors],
                "loss": msg.loss, "params_sha256": msg.params_sha256}
        if msg.tasks:
            meta["tasks"] = _tasks_meta(msg.tasks)
        for k in ("unchecked", "removed"):  # only when there are any
            if getattr(msg, k):
                meta[k] = list(getattr(msg, k))
        return Message(FrameType.TOTAL, run_id, msg.step, meta, body, codec)
    if isinstance(msg, RingChunk):
        codec, body = encode_ints(msg.ints)
        return Message(FrameType.RING, run_id, msg.step,
                       {"term": msg.term, "ring": msg.ring, "phase": msg.phase, "round": msg.round,
                        "chunk": msg.chunk}, body, codec)
    if isinstance(msg, State):
        return Message(FrameType.STATE, run_id, msg.step, {"params_sha256": msg.params_sha256},
                       encode_state(msg.theta, msg.m, msg.v, msg.b1t, msg.b2t))
    if isinstance(msg, Data):
        return Message(FrameType.DATA, run_id, 0, {"fingerprint": msg.fingerprint}, msg.data)
    meta: dict = {"t": msg.T}
    for k, v in msg.__dict__.items():
        if k == "step" or (k == "removed" and not v):
            continue
        if k == "tasks":
            v = _tasks_meta(v)
        elif k == "contributors":
            v = [list(c) for c in v]
        elif isinstance(v, tuple):
            v = list(v)
        meta[k] = v
    return Message(FrameType.CONTROL, run_id, getattr(msg, "step", 0), meta)


def from_message(m: Message, size: int | None = None,
                 state_sizes: tuple[int, int] | None = None) -> RunMessage:
    """The typed run message of a decoded Message; ``size`` is the parameter count (needed
    for CONTRIB, TOTAL and STATE), or a local-steps run's contribution size with
    ``state_sizes`` its STATE's (Trainer.state_sizes). Raises FrameError with a message on
    anything invalid."""
    if m.type == FrameType.CONTRIB:
        f = _M(m.meta, "contrib")
        return Contrib(f.int("term"), m.step, f.int("task"), f.micro(m.meta.get("micro"), "micro"),
                       f.num("loss"), f.int("correct"), decode_ints(m.codec, m.body, size))
    if m.type == FrameType.TOTAL:
        f = _M(m.meta, "total")
        contributors = []
        for c in f.list("contributors"):
            if not (isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and len(c[0]) <= 64
                    and isinstance(c[1], int) and not isinstance(c[1], bool) and c[1] >= 0):
                raise f.fail("'contributors' must be [peer, micro-batches] pairs")
            contributors.append((c[0], c[1]))
        return Total(f.int("term"), m.step, tuple(contributors), f.num("loss"),
                     f.hex("params_sha256"), decode_ints(m.codec, m.body, size),
                     _tasks(f) if "tasks" in m.meta else (), None, _ids(f, "unchecked"), _ids(f, "removed"))
    if m.type == FrameType.RING:  # its length and values are checked against the ring (run/ring.py)
        f = _M(m.meta, "ring chunk")
        return RingChunk(f.int("term"), m.step, f.int("ring"), f.int("phase", 0, 1),
                         f.int("round", 0, MAX_RING), f.int("chunk", 0, MAX_RING),
                         decode_ints(m.codec, m.body, max_size=size))
    if m.type == FrameType.STATE:
        if size is None:
            raise FrameError("state: the receiver has no run to load it into")
        theta, mm, v, b1t, b2t = decode_state(m.body, *(state_sizes or (size, size)))
        return State(m.step, _M(m.meta, "state").hex("params_sha256"), theta, mm, v, b1t, b2t)
    if m.type == FrameType.DATA:
        return Data(_M(m.meta, "data").hex("fingerprint"), m.body)
    if m.type != FrameType.CONTROL:
        raise FrameError(f"frame type {m.type.name} is not handled by this peer")
    name = m.meta.get("t")
    f = _M(m.meta, str(name)[:32])
    if name == "run":
        ident = m.meta.get("identity")
        if not isinstance(ident, dict):
            raise f.fail("'identity' must be an object")
        return Run(ident, f.hex("run_id", 16), f.int("steps"), f.int("term"), m.step,
                   f.hex("params_sha256"), f.str("coordinator", 64),
                   f.num("verify_rate", 0.0, 1.0) if "verify_rate" in m.meta else 0.0,
                   f.int("strikes", 1, MAX_STRIKES) if "strikes" in m.meta else 3, _ids(f, "removed"))
    if name == "ready":
        return Ready(f.int("term"), f.num("capacity", MIN_CAPACITY, MAX_CAPACITY), f.str("kind", 16),
                     m.step, f.hex("params_sha256"))
    if name == "refuse":
        reasons = f.list("reasons", 64)
        if not all(isinstance(r, str) and len(r) <= 1000 for r in reasons):
            raise f.fail("'reasons' must be strings")
        return Refuse(f.int("term"), tuple(reasons))
    if name == "assign":
        return Assign(f.int("term"), m.step, _tasks(f))
    if name == "sync":
        return SyncRequest(f.int("term"), m.step, f.hex("params_sha256"), f.str("reason", 1000))
    if name == "data_request":
        return DataRequest(f.hex("fingerprint"))
    if name == "restore":
        return Restore(f.int("term"), m.step, f.hex("params_sha256"))
    if name == "end":
        return End(f.int("term"), m.step, f.hex("params_sha256"))
    if name == "ring_plan":
        peers = f.list("peers", MAX_RING)
        if len(peers) < 2 or not all(isinstance(p, str) and 0 < len(p) <= 64 for p in peers) \
                or len(set(peers)) != len(peers):
            raise f.fail("'peers' must be 2 or more distinct peer ids")
        return RingPlan(f.int("term"), m.step, f.int("ring"), tuple(peers), _tasks(f))
    if name == "ring_sum":
        return RingSum(f.int("term"), m.step, f.int("ring"), f.micro(m.meta.get("micro"), "micro"),
                       f.num("loss"), f.int("correct"))
    if name == "ring_commit":
        return RingCommit(f.int("term"), m.step, f.int("ring"), _contributors(f), f.num("loss"),
                          f.hex("params_sha256"))
    raise FrameError(f"unknown control message {str(name)[:32]!r}")
