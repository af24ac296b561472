"""The signaling wire format: every message of ``/ws``, typed, parsed and validated here only.

Nothing else in Python knows a JSON field name; ``daisychain/webui/wire/protocol.js`` is the one
JS mirror and ``docs/PROTOCOL.md`` documents each message with an example.

Every frame is one JSON object with a ``"type"``. ``parse_client`` reads what a device sends
(the server uses it), ``parse_server`` reads what the server sends (a headless peer uses it),
``encode`` writes either. Invalid input raises :class:`ProtocolError` with a code and a
human message; nothing here asserts.

The relayed types (``offer``, ``answer``, ``candidate``, ``broadcast``) are one dataclass per
type for both directions: a device addresses them ``to`` a member id; the server delivers
them with ``sender`` (wire field ``"from"``) stamped from the connection, and any ``"from"``
a device claims is dropped by ``parse_client``.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Union

#: Bumped on any incompatible change of this module; a ``hello`` of another version is refused.
PROTOCOL_VERSION = 1

MAX_NAME_CHARS = 64
MAX_SDP_CHARS = 32 * 1024
MAX_CANDIDATE_CHARS = 1024
MAX_BROADCAST_BYTES = 16 * 1024
MAX_BROADCAST_DEPTH = 16
MAX_TOKEN_CHARS = 128
MAX_CAPACITY = 1e9

#: Device kinds a hello may name.
DEVICE_KINDS = ("webgpu", "cpu", "python")

#: ``hello.room`` / ``join.room`` values besides a private room code.
ROOM_NETWORK = "network"
ROOM_NEW = "new"

#: Crockford base32: no I, L, O, U; read aloud without ambiguity.
CODE_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
CODE_CHARS = 10  # 50 bits, shown as XXXX-XXXX-XX
_CODE_FIX = str.maketrans({"I": "1", "L": "1", "O": "0"})
_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


class ErrorCode(str, enum.Enum):
    """The ``code`` of an ``error`` message (and the reason of a close, where one is sent)."""

    BAD_JSON = "bad_json"              # not a JSON object
    BAD_MESSAGE = "bad_message"        # a field is missing, of the wrong type or out of range
    UNKNOWN_TYPE = "unknown_type"      # "type" names no message
    TOO_LARGE = "too_large"            # frame over the size limit
    VERSION = "version"                # hello of another protocol version
    HELLO_FIRST = "hello_first"        # a message before hello, or a second hello
    RATE_LIMITED = "rate_limited"      # too many messages per second: the connection is closed
    NOT_IN_ROOM = "not_in_room"        # the device is in no room
    NOT_APPROVED = "not_approved"      # the device waits for the host's approval
    NOT_HOST = "not_host"              # approve/deny by someone else than the host
    NO_SUCH_PEER = "no_such_peer"      # "to"/"peer" is no approved member of your room
    NO_SUCH_ROOM = "no_such_room"      # a join names a room code that does not exist
    ROOM_FULL = "room_full"            # devices per room limit
    TOO_MANY_ROOMS = "too_many_rooms"  # private rooms per address limit
    TOO_MANY_PENDING = "too_many_pending"  # pending requests per room limit
    DENIED = "denied"                  # the host declined the join request
    REPLACED = "replaced"              # a newer connection resumed this identity
    IDLE = "idle"                      # no hello in time / no pong
    SHUTTING_DOWN = "shutting_down"    # server stops
    INTERNAL = "internal"              # a server bug; the message was dropped, nothing else changed


class ProtocolError(Exception):
    """Input that breaks the protocol. ``code`` is an :class:`ErrorCode`, ``str(err)`` is for humans."""

    def __init__(self, code: ErrorCode, message: str, ref: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.ref = ref  # the type of the offending message, when known


# ---------------------------------------------------------------------------------------------
# Messages. Parts shared by both directions.


@dataclass(frozen=True)
class Device:
    """What a device says about itself; the host sees it in a join request."""

    id: str
    name: str
    kind: str
    capacity: float


@dataclass(frozen=True)
class Member:
    id: str
    name: str
    kind: str
    capacity: float
    host: bool


# Client -> server --------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """First message of a connection. ``room``: ``"network"``, ``"new"`` or a private code."""

    TYPE = "hello"
    name: str
    kind: str
    capacity: float
    room: str = ROOM_NETWORK
    token: str | None = None
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class Join:
    """Move to another room (leaving the current one, if any)."""

    TYPE = "join"
    room: str


@dataclass(frozen=True)
class Leave:
    TYPE = "leave"


@dataclass(frozen=True)
class Approve:
    TYPE = "approve"
    peer: str


@dataclass(frozen=True)
class Deny:
    TYPE = "deny"
    peer: str


@dataclass(frozen=True)
class Ping:
    TYPE = "ping"
    t: float | None = None


# Relayed (both directions) -----------------------------------------------------------------


@dataclass(frozen=True)
class Offer:
    TYPE = "offer"
    sdp: str
    to: str | None = None      # set by the device
    sender: str | None = None  # set by the server (wire "from")


@dataclass(frozen=True)
class Answer:
    TYPE = "answer"
    sdp: str
    to: str | None = None
    sender: str | None = None


@dataclass(frozen=True)
class Candidate:
    """An RTCIceCandidateInit dict, or ``None`` for end-of-candidates."""

    TYPE = "candidate"
    candidate: dict | None
    to: str | None = None
    sender: str | None = None


@dataclass(frozen=True)
class Broadcast:
    """An application message to every approved member of the room, or to one ``to``."""

    TYPE = "broadcast"
    data: Any
    to: str | None = None
    sender: str | None = None


# Server -> client --------------------------------------------------------------------------


@dataclass(frozen=True)
class Welcome:
    """Reply to hello: the identity the server assigned."""

    TYPE = "welcome"
    id: str
    token: str
    resumed: bool = False
    version: int = PROTOCOL_VERSION
    ice_servers: tuple = ()
    limits: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RoomState:
    """Sent to every approved member whenever the room changes. ``pending`` only to the host."""

    TYPE = "room"
    room: str  # "network" or "private"
    code: str | None
    you: str
    host: str | None
    members: tuple[Member, ...]
    pending: tuple[Device, ...] = ()
    approved: bool = True


@dataclass(frozen=True)
class Pending:
    """To a device waiting for the host's approval: it gets nothing else from the room."""

    TYPE = "pending"
    code: str


@dataclass(frozen=True)
class JoinRequest:
    TYPE = "join_request"
    peer: Device


@dataclass(frozen=True)
class Pong:
    TYPE = "pong"
    t: float | None = None


@dataclass(frozen=True)
class Error:
    """A refusal. For a limit, ``limit`` and ``current`` are its value and where the client
    stands, and ``retry_after_s`` how long to wait before asking again (also in ``message``)."""

    TYPE = "error"
    code: str
    message: str
    ref: str | None = None
    limit: float | None = None
    current: float | None = None
    retry_after_s: float | None = None


ClientMessage = Union[Hello, Join, Leave, Approve, Deny, Ping, Offer, Answer, Candidate, Broadcast]
ServerMessage = Union[Welcome, RoomState, Pending, JoinRequest, Pong, Error,
                      Offer, Answer, Candidate, Broadcast]
RELAYED = (Offer, Answer, Candidate, Broadcast)


class LimitError(ProtocolError):
    """A refusal by a limit: carries the limit, where the client stands, and how long to wait."""

    def __init__(self, code: ErrorCode, message: str, *, limit: float, current: float,
                 retry_after_s: float | None = None, ref: str | None = None):
        super().__init__(code, message, ref)
        self.limit, self.current = limit, current
        self.retry_after_s = None if retry_after_s is None else round(max(0.0, retry_after_s), 3)


def error_from(exc: ProtocolError) -> Error:
    if isinstance(exc, LimitError):
        return Error(code=exc.code.value, message=exc.message, ref=exc.ref, limit=exc.limit,
                     current=exc.current, retry_after_s=exc.retry_after_s)
    return Error(code=exc.code.value, message=exc.message, ref=exc.ref)


# ---------------------------------------------------------------------------------------------
# Room codes.


def normalize_room(value: str) -> str:
    """``"network"``, ``"new"`` or a canonical code ``XXXX-XXXX-XX``; raises on anything else.

    Codes are read aloud, so case, dashes, spaces and the look-alikes I/L (1) and O (0) are
    forgiven.
    """
    low = value.strip().lower()
    if low in (ROOM_NETWORK, ROOM_NEW):
        return low
    raw = re.sub(r"[\s-]", "", value).upper().translate(_CODE_FIX)
    if len(raw) != CODE_CHARS or any(c not in CODE_ALPHABET for c in raw):
        raise ProtocolError(ErrorCode.BAD_MESSAGE,
                            f"room must be 'network', 'new' or a {CODE_CHARS}-character code "
                            f"like K7QM-4XZP-9R, not {value[:40]!r}")
    return format_code(raw)


def format_code(raw: str) -> str:
    return f"{raw[:4]}-{raw[4:8]}-{raw[8:]}"


def new_code(randbits: Callable[[int], int]) -> str:
    """A fresh code with 50 random bits; ``randbits`` is e.g. ``secrets.randbits``."""
    n = randbits(5 * CODE_CHARS)
    return format_code("".join(CODE_ALPHABET[(n >> (5 * i)) & 31] for i in range(CODE_CHARS)))


# ---------------------------------------------------------------------------------------------
# Field checks.


class _Fields:
    """Reads the fields of one decoded object, raising ProtocolError naming the field."""

    def __init__(self, obj: dict, type_: str):
        self.obj, self.type = obj, type_

    def fail(self, msg: str) -> ProtocolError:
        return ProtocolError(ErrorCode.BAD_MESSAGE, f"{self.type}: {msg}", ref=self.type)

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def str(self, key: str, max_chars: int, *, optional: bool = False, pattern=None) -> str | None:
        v = self.obj.get(key)
        if v is None and optional:
            return None
        if not isinstance(v, str):
            raise self.fail(f"'{key}' must be a string")
        if len(v) > max_chars:
            raise self.fail(f"'{key}' is longer than {max_chars} characters")
        if pattern is not None and not pattern.match(v):
            raise self.fail(f"'{key}' is not a valid id")
        return v

    def id(self, key: str) -> str:
        return self.str(key, 32, pattern=_ID_RE)

    def number(self, key: str, lo: float, hi: float, *, optional: bool = False) -> float | None:
        v = self.obj.get(key)
        if v is None and optional:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.fail(f"'{key}' must be a finite number")
        if not lo <= v <= hi:
            raise self.fail(f"'{key}' must be between {lo:g} and {hi:g}")
        return v

    def int(self, key: str, lo: int, hi: int) -> int:
        v = self.obj.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.fail(f"'{key}' must be an integer between {lo} and {hi}")
        return v

    def bool(self, key: str) -> bool:
        v = self.obj.get(key, False)
        if not isinstance(v, bool):
            raise self.fail(f"'{key}' must be true or false")
        return v

    def list(self, key: str, max_len: int) -> list:
        v = self.obj.get(key, [])
        if not isinstance(v, list) or len(v) > max_len:
            raise self.fail(f"'{key}' must be a list of at most {max_len} items")
        return v

    def dict(self, key: str) -> dict:
        v = self.obj.get(key, {})
        if not isinstance(v, dict):
            raise self.fail(f"'{key}' must be an object")
        return v

    def room(self, key: str) -> str:
        v = self.str(key, 40, optional=True)
        return ROOM_NETWORK if v is None else normalize_room(v)


def _depth(v: Any, limit: int) -> int:
    """Nesting depth of a JSON value, stopping early past ``limit``."""
    if limit < 0:
        return 1
    if isinstance(v, dict):
        return 1 + max((_depth(x, limit - 1) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x, limit - 1) for x in v), default=0)
    return 0


def _candidate(f: _Fields) -> dict | None:
    c = f.obj.get("candidate")
    if c is None:
        return None
    if not isinstance(c, dict):
        raise f.fail("'candidate' must be an RTCIceCandidateInit object or null")
    g = _Fields(c, f.type + ".candidate")
    out = {"candidate": g.str("candidate", MAX_CANDIDATE_CHARS)}
    mid = g.str("sdpMid", 64, optional=True)
    if mid is not None:
        out["sdpMid"] = mid
    if c.get("sdpMLineIndex") is not None:
        out["sdpMLineIndex"] = g.int("sdpMLineIndex", 0, 65535)
    frag = g.str("usernameFragment", 256, optional=True)
    if frag is not None:
        out["usernameFragment"] = frag
    return out


def _broadcast_data(f: _Fields) -> Any:
    if "data" not in f.obj:
        raise f.fail("'data' is missing")
    data = f.obj["data"]
    if _depth(data, MAX_BROADCAST_DEPTH) > MAX_BROADCAST_DEPTH:
        raise f.fail(f"'data' is nested deeper than {MAX_BROADCAST_DEPTH} levels")
    if len(json.dumps(data, separators=(",", ":"))) > MAX_BROADCAST_BYTES:
        raise ProtocolError(ErrorCode.TOO_LARGE,
                            f"broadcast: 'data' is over {MAX_BROADCAST_BYTES} bytes", ref=f.type)
    return data


def _device(f: _Fields) -> dict:
    kind = f.str("kind", 16)
    if kind not in DEVICE_KINDS:
        raise f.fail(f"'kind' must be one of {', '.join(DEVICE_KINDS)}")
    name = f.str("name", MAX_NAME_CHARS).strip()
    if not name or any(ord(c) < 32 for c in name):
        raise f.fail("'name' must be a non-empty line of text")
    return {"name": name, "kind": kind, "capacity": f.number("capacity", 0, MAX_CAPACITY)}


# Client -> server parsers (what the server accepts). -----------------------------------------

def _p_hello(f: _Fields) -> Hello:
    version = f.obj.get("version")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.VERSION,
                            f"this server speaks signaling protocol version {PROTOCOL_VERSION}, "
                            f"the client sent {version!r}: reload the page or update the peer",
                            ref="hello")
    return Hello(**_device(f), room=f.room("room"),
                 token=f.str("token", MAX_TOKEN_CHARS, optional=True))


def _p_relay_sdp(cls):
    def parse(f: _Fields):
        return cls(sdp=f.str("sdp", MAX_SDP_CHARS), to=f.id("to"))
    return parse


_CLIENT: dict[str, Callable[[_Fields], ClientMessage]] = {
    "hello": _p_hello,
    "join": lambda f: Join(room=f.room("room")),
    "leave": lambda f: Leave(),
    "approve": lambda f: Approve(peer=f.id("peer")),
    "deny": lambda f: Deny(peer=f.id("peer")),
    "ping": lambda f: Ping(t=f.number("t", -1e300, 1e300, optional=True)),
    "offer": _p_relay_sdp(Offer),
    "answer": _p_relay_sdp(Answer),
    "candidate": lambda f: Candidate(candidate=_candidate(f), to=f.id("to")),
    "broadcast": lambda f: Broadcast(data=_broadcast_data(f),
                                     to=f.id("to") if f.has("to") else None),
}


# Server -> client parsers (what a device accepts). -------------------------------------------

def _p_device(obj: Any, where: str) -> Device:
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"{where}: a device must be an object")
    f = _Fields(obj, where)
    return Device(id=f.id("id"), **_device(f))


def _p_member(obj: Any) -> Member:
    d = _p_device(obj, "room.members")
    return Member(d.id, d.name, d.kind, d.capacity, host=_Fields(obj, "room.members").bool("host"))


def _p_room(f: _Fields) -> RoomState:
    kind = f.str("room", 16)
    if kind not in ("network", "private"):
        raise f.fail("'room' must be 'network' or 'private'")
    return RoomState(room=kind, code=f.str("code", 16, optional=True), you=f.id("you"),
                     host=f.id("host") if f.has("host") else None,
                     members=tuple(_p_member(m) for m in f.list("members", 10_000)),
                     pending=tuple(_p_device(d, "room.pending") for d in f.list("pending", 10_000)),
                     approved=f.bool("approved"))


def _p_welcome(f: _Fields) -> Welcome:
    return Welcome(id=f.id("id"), token=f.str("token", MAX_TOKEN_CHARS), resumed=f.bool("resumed"),
                   version=f.int("version", 0, 1 << 30),
                   ice_servers=tuple(f.list("ice_servers", 64)), limits=f.dict("limits"))


def _p_relay_in(cls, body: Callable[[_Fields], dict]):
    def parse(f: _Fields):
        return cls(**body(f), sender=f.id("from"))
    return parse


_SERVER: dict[str, Callable[[_Fields], ServerMessage]] = {
    "welcome": _p_welcome,
    "room": _p_room,
    "pending": lambda f: Pending(code=f.str("code", 16)),
    "join_request": lambda f: JoinRequest(peer=_p_device(f.obj.get("peer"), "join_request.peer")),
    "pong": lambda f: Pong(t=f.number("t", -1e300, 1e300, optional=True)),
    "error": lambda f: Error(code=f.str("code", 64), message=f.str("message", 4096),
                             ref=f.str("ref", 64, optional=True),
                             limit=f.number("limit", 0, 1e18, optional=True),
                             current=f.number("current", 0, 1e18, optional=True),
                             retry_after_s=f.number("retry_after_s", 0, 1e9, optional=True)),
    "offer": _p_relay_in(Offer, lambda f: {"sdp": f.str("sdp", MAX_SDP_CHARS)}),
    "answer": _p_relay_in(Answer, lambda f: {"sdp": f.str("sdp", MAX_SDP_CHARS)}),
    "candidate": _p_relay_in(Candidate, lambda f: {"candidate": _candidate(f)}),
    "broadcast": _p_relay_in(Broadcast, lambda f: {"data": _broadcast_data(f)}),
}


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    """JSON numbers that overflow a double (``1e999``) are refused: Python would read them as
    infinity, which no JSON encoder can write back."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"the number {text[:40]} is out of range")
    return v


def _decode(text: str | bytes, max_bytes: int) -> tuple[dict, str]:
    if isinstance(text, (bytes, bytearray)):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "binary frames are not part of the signaling "
                                                   "protocol: send JSON text")
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"message is over {max_bytes} bytes")
    try:
        obj = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(ErrorCode.BAD_JSON, f"message is not valid JSON ({exc})"[:300]) from None
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.BAD_JSON, "message must be a JSON object with a 'type'")
    type_ = obj.get("type")
    if not isinstance(type_, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "message has no string 'type'")
    return obj, type_


def _parse(table, text, max_bytes, side):
    obj, type_ = _decode(text, max_bytes)
    parser = table.get(type_)
    if parser is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE,
                            f"unknown message type {type_[:40]!r}; a {side} sends: "
                            + ", ".join(sorted(table)), ref=None)
    return parser(_Fields(obj, type_))


def parse_client(text: str | bytes, max_bytes: int = 64 * 1024) -> ClientMessage:
    """A message a device sent to the server. A claimed ``"from"`` is ignored."""
    return _parse(_CLIENT, text, max_bytes, "device")


def parse_server(text: str | bytes, max_bytes: int = 1 << 24) -> ServerMessage:
    """A message the server sent to a device."""
    return _parse(_SERVER, text, max_bytes, "server")


# ---------------------------------------------------------------------------------------------
# Encoding.


def to_wire(msg: ClientMessage | ServerMessage) -> dict:
    """The JSON object of a message. ``None`` fields are left out, ``sender`` is ``"from"``."""
    out: dict[str, Any] = {"type": msg.TYPE}
    for name, value in msg.__dict__.items():
        if name == "sender":
            name = "from"
        if value is None and name not in ("candidate", "data"):
            continue
        if isinstance(value, tuple):
            value = [v.__dict__ if hasattr(v, "__dict__") else v for v in value]
        elif isinstance(value, Device):
            value = value.__dict__
        out[name] = value
    return out


def encode(msg: ClientMessage | ServerMessage) -> str:
    """JSON text; raises ValueError rather than write a non-finite number (not JSON)."""
    return json.dumps(to_wire(msg), separators=(",", ":"), allow_nan=False)
