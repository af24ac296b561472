"""The data-channel wire format: every byte a peer sends another over WebRTC is framed,
parsed and validated here only. ``daisychain/webui/frames.js`` is the one JS mirror and
``docs/MESH.md`` documents each field.

A *message* is (type, run id, step, meta, body): ``meta`` is a small JSON object whose
fields depend on the type (validated in :mod:`daisychain.peer.run`'s message classes,
through :func:`parse_message`), ``body`` raw bytes (an integer vector, or a state snapshot).
A message travels as one or more *frames* of at most :data:`MAX_FRAME` bytes::

    offset size  field
     0     2     magic b"DC"
     2     1     version (1)
     3     1     type (FrameType)
     4     8     run id: the 16 hex digits of the run id as 8 raw bytes (zeros before a run)
    12     4     step (u32)
    16     4     message number (u32, per sender and channel, increasing)
    20     2     tensor (u16; 0xFFFF = the whole flat vector, the only form sent today)
    22     1     codec of the body (Codec; 0 for JSON-only messages)
    23     1     reserved, 0
    24     4     chunk index (u32)
    28     4     chunk count (u32, >= 1)
    32     4     payload length of this frame (u32)
    36     n     payload chunk

All integers little-endian. The payloads of a message's chunks, concatenated in chunk
order, are: ``u32 meta_len | meta (UTF-8 JSON) | body``.

Integer vectors (gradient contributions and totals; |x| < 2**53) are encoded by
:func:`encode_ints`, which tries every codec and keeps the smallest (see :class:`Codec`).
"""

from __future__ import annotations

import enum
import json
import math
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from daisychain.engine.spec import MAX_CAPACITY, MIN_CAPACITY  # a ``ready`` capacity lies in this range

MAGIC = b"DC"
VERSION = 1
HEADER = struct.Struct("<2sBB8sIIHBBIII")
HEADER_SIZE = HEADER.size  # 36
MAX_FRAME = 64 * 1024
MAX_CHUNK = MAX_FRAME - HEADER_SIZE
MAX_MESSAGE = 64 * 1024 * 1024
MAX_META = 1 << 20
WHOLE = 0xFFFF
#: every value of an integer vector must stay below this in magnitude (JS Numbers are exact)
INT_LIMIT = 2**53
MAX_STRIKES = 1000


class FrameError(ValueError):
    """Bytes that break the frame format; ``str(err)`` says what."""


class FrameType(enum.IntEnum):
    CONTROL = 1  # meta only: run, ready, refuse, assign, sync, data_request, restore, end
    CONTRIB = 2  # a peer's integer partial sum for one task of a step (body: int vector)
    TOTAL = 3    # the committed integer total of a step (body: int vector)
    STATE = 4    # a replica's state: theta, Adam m, v as float64 LE, then b1t, b2t (float64)
    DATA = 5     # reserved: dataset bytes over the channel


class Codec(enum.IntEnum):
    """Integer-vector codecs. Body of 1..4: ``u32 segments`` then per segment ``u32 length,
    u8 shift, u8 width``, then the segment payloads in order. Each value of a segment is
    ``v >> shift`` (all values of the segment have at least ``shift`` trailing zero bits, so
    this is exact; multiply back by 2**shift). Width 0: all zero (no payload); 1/2/4/8:
    signed little-endian ints of that width (NARROW); VARINT segments store zig-zag LEB128
    (``z = 2v`` for v >= 0, ``-2v - 1`` otherwise; 7 bits per byte, low first, high bit set
    on every byte but the last) and carry width 255. 3 and 4 are 1 and 2 whose whole segment
    part (everything after the u32 segment count) is zlib-compressed (RFC 1950)."""

    NONE = 0     # no body / not an int vector
    RAW = 5      # int64 little-endian, no header
    NARROW = 1
    VARINT = 2
    NARROW_Z = 3
    VARINT_Z = 4


@dataclass(frozen=True)
class Frame:
    type: FrameType
    run_id: str
    step: int
    msg: int
    tensor: int
    codec: int
    index: int
    count: int
    payload: bytes


@dataclass
class Message:
    type: FrameType
    run_id: str
    step: int
    meta: dict
    body: bytes = b""
    codec: int = Codec.NONE
    tensor: int = WHOLE
    wire_bytes: int = field(default=0, compare=False)  # bytes it took on the wire (set on decode)


def _run_bytes(run_id: str) -> bytes:
    if not run_id:
        return bytes(8)
    try:
        raw = bytes.fromhex(run_id)
    except ValueError:
        raise FrameError(f"run id {run_id[:20]!r} is not 16 hex digits") from None
    if len(raw) != 8:
        raise FrameError(f"run id {run_id[:20]!r} is not 16 hex digits")
    return raw


def encode_frames(m: Message, msg_no: int, max_chunk: int = MAX_CHUNK,
                  _allow_nan: bool = False) -> list[bytes]:
    """Split one message into frames of at most ``max_chunk + HEADER_SIZE`` bytes.
    (``_allow_nan`` is for ``daisy-peer --fault nan-meta`` only: it writes meta that every
    receiver refuses.)"""
    meta = json.dumps(m.meta, separators=(",", ":"), allow_nan=_allow_nan).encode()
    if len(meta) > MAX_META:
        raise FrameError(f"meta of {len(meta)} bytes is over {MAX_META}")
    payload = struct.pack("<I", len(meta)) + meta + bytes(m.body)
    if len(payload) > MAX_MESSAGE:
        raise FrameError(f"message of {len(payload)} bytes is over {MAX_MESSAGE}")
    if not 1 <= max_chunk <= MAX_CHUNK:
        raise FrameError(f"chunk size must be 1..{MAX_CHUNK}")
    count = max(1, -(-len(payload) // max_chunk))
    rid = _run_bytes(m.run_id)
    out = []
    for i in range(count):
        part = payload[i * max_chunk:(i + 1) * max_chunk]
        out.append(HEADER.pack(MAGIC, VERSION, int(m.type), rid, m.step & 0xFFFFFFFF,
                               msg_no & 0xFFFFFFFF, m.tensor, int(m.codec), 0, i, count,
                               len(part)) + part)
    return out


def decode_frame(data: bytes) -> Frame:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FrameError("data-channel messages must be binary frames, not text")
    data = bytes(data)
    if len(data) < HEADER_SIZE:
        raise FrameError(f"frame of {len(data)} bytes is shorter than the {HEADER_SIZE}-byte header")
    if len(data) > MAX_FRAME:
        raise FrameError(f"frame of {len(data)} bytes is over {MAX_FRAME}")
    magic, ver, typ, rid, step, msg, tensor, codec, _res, index, count, length = \
        HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FrameError("not a DaisyChain frame (bad magic)")
    if ver != VERSION:
        raise FrameError(f"frame version {ver}; this peer speaks {VERSION}: update it")
    try:
        typ = FrameType(typ)
    except ValueError:
        raise FrameError(f"unknown frame type {typ}") from None
    if codec not in set(Codec):
        raise FrameError(f"unknown codec {codec}")
    if count < 1 or index >= count or count * MAX_CHUNK > MAX_MESSAGE + MAX_CHUNK:
        raise FrameError(f"bad chunk {index} of {count}")
    if length != len(data) - HEADER_SIZE:
        raise FrameError(f"frame says {length} payload bytes, carries {len(data) - HEADER_SIZE}")
    return Frame(typ, rid.hex() if any(rid) else "", step, msg, tensor, codec, index, count,
                 data[HEADER_SIZE:])


def _no_constant(name: str):
    raise FrameError(f"meta holds {name}: non-finite numbers are refused")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise FrameError(f"meta holds the number {text[:32]}, which is not finite")
    return v


def parse_meta(raw: bytes) -> dict:
    """Meta bytes -> a JSON object; NaN, Infinity and numbers that overflow to infinity are
    refused (FrameError), as the signaling side does, so no non-finite value gets further."""
    try:
        meta = json.loads(raw.decode(), parse_constant=_no_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, FrameError):
            raise
        raise FrameError(f"meta is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise FrameError("meta must be a JSON object")
    return meta


class Reassembler:
    """Collects the frames of one channel (ordered, reliable) into messages."""

    def __init__(self):
        self._parts: list[bytes] = []
        self._head: Frame | None = None
        self._wire = 0

    def feed(self, data: bytes) -> Message | None:
        """One frame in; the completed message when this was its last chunk."""
        f = decode_frame(data)
        if f.index == 0:
            if self._head is not None:
                raise FrameError(f"message {self._head.msg} was cut off by message {f.msg}")
            self._head, self._parts, self._wire = f, [], 0
        elif self._head is None or f.msg != self._head.msg or f.index != len(self._parts) \
                or f.count != self._head.count:
            raise FrameError(f"chunk {f.index} of message {f.msg} out of order")
        self._parts.append(f.payload)
        self._wire += len(data)
        if len(self._parts) < f.count:
            return None
        head, payload, wire = self._head, b"".join(self._parts), self._wire
        self._head, self._parts = None, []
        if len(payload) < 4:
            raise FrameError("message payload lacks its meta length")
        (n,) = struct.unpack_from("<I", payload)
        if n > MAX_META or 4 + n > len(payload):
            raise FrameError(f"meta length {n} does not fit the message")
        meta = parse_meta(payload[4:4 + n])
        return Message(head.type, head.run_id, head.step, meta, payload[4 + n:], head.codec,
                       head.tensor, wire)


# -- integer vectors ----------------------------------------------------------------------


def _ctz_common(v: np.ndarray) -> int:
    """Trailing zero bits shared by every value (0 if all are zero, capped at 62)."""
    acc = int(np.bitwise_or.reduce(v)) if v.size else 0
    if acc == 0:
        return 0
    acc &= (1 << 64) - 1
    return min(62, (acc & -acc).bit_length() - 1)


def _zigzag(v: np.ndarray) -> np.ndarray:
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)


def _unzigzag(z: np.ndarray) -> np.ndarray:
    return (z >> np.uint64(1)).astype(np.int64) ^ -(z & np.uint64(1)).astype(np.int64)


def varint_encode(z: np.ndarray) -> bytes:
    """LEB128 of unsigned values (vectorised)."""
    z = z.astype(np.uint64)
    if z.size == 0:
        return b""
    nbytes = np.ones(z.size, np.int64)
    for k in range(1, 10):
        nbytes += (z >> np.uint64(7 * k)) > 0
    rows = np.zeros((z.size, 10), np.uint8)
    for k in range(10):
        byte = ((z >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        more = nbytes > k + 1
        rows[:, k] = byte | (more.astype(np.uint8) << 7)
    mask = np.arange(10)[None, :] < nbytes[:, None]
    return rows[mask].tobytes()


def varint_decode(data: bytes, count: int) -> tuple[np.ndarray, int]:
    """``count`` LEB128 values from the start of ``data``; returns (values, bytes used)."""
    if count == 0:
        return np.zeros(0, np.uint64), 0
    b = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(b < 0x80)
    if ends.size < count:
        raise FrameError("varint segment is cut short")
    used = int(ends[count - 1]) + 1
    b = b[:used]
    starts = np.concatenate([[0], ends[:count - 1] + 1])
    lens = ends[:count] - starts + 1
    if lens.max() > 8:  # 8 * 7 = 56 bits covers every |v| < 2**53 after zig-zag
        raise FrameError("varint longer than 8 bytes")
    pos = np.arange(used) - np.repeat(starts, lens)
    vals = (b & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    return np.add.reduceat(vals, starts), used


def _segments_encode(v: np.ndarray, bounds: list[int], varint: bool) -> bytes:
    heads, bodies = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = v[a:b]
        shift = _ctz_common(seg)
        s = seg >> shift
        if not seg.any():
            width, body = 0, b""
        elif varint:
            width, body = 255, varint_encode(_zigzag(s))
        else:
            m = int(max(s.max(), -(s.min() + 1)))
            width = next(w for w in (1, 2, 4, 8) if m < 1 << (8 * w - 1))
            body = s.astype(f"<i{width}").tobytes()
        heads.append(struct.pack("<IBB", b - a, shift, width))
        bodies.append(body)
    return b"".join(heads) + b"".join(bodies)


def encode_ints(v: np.ndarray, bounds: list[int] | None = None,
                codecs: tuple[int, ...] | None = None) -> tuple[int, bytes]:
    """The smallest encoding of an int64 vector; ``bounds`` are segment boundaries (e.g. the
    canonical tensors: ``[0, n0, n0 + n1, ..., len(v)]``). Returns (codec, body)."""
    v = np.ascontiguousarray(v, np.int64)
    if v.size and int(np.abs(v).max()) >= INT_LIMIT:
        raise FrameError("an integer vector value is not below 2**53")
    bounds = list(bounds) if bounds else [0, v.size]
    if bounds[0] != 0 or bounds[-1] != v.size or any(a > b for a, b in zip(bounds, bounds[1:])):
        raise FrameError("segment bounds must run from 0 to the vector length")
    count = struct.pack("<I", len(bounds) - 1)
    options = {}
    want = codecs or (Codec.RAW, Codec.NARROW, Codec.VARINT, Codec.NARROW_Z, Codec.VARINT_Z)
    if Codec.RAW in want:
        options[Codec.RAW] = v.astype("<i8").tobytes()
    for plain, zipped, varint in ((Codec.NARROW, Codec.NARROW_Z, False),
                                  (Codec.VARINT, Codec.VARINT_Z, True)):
        if plain not in want and zipped not in want:
            continue
        seg = _segments_encode(v, bounds, varint)
        if plain in want:
            options[plain] = count + seg
        if zipped in want:
            options[zipped] = count + zlib.compress(seg, 6)
    best = min(options, key=lambda c: (len(options[c]), c))
    return int(best), options[best]


def decode_ints(codec: int, body: bytes, size: int | None = None) -> np.ndarray:
    """Inverse of :func:`encode_ints`; ``size`` (if given) is the expected length."""
    if codec == Codec.RAW:
        if len(body) % 8:
            raise FrameError("raw int64 body length is not a multiple of 8")
        out = np.frombuffer(body, "<i8").astype(np.int64)
    elif codec in (Codec.NARROW, Codec.VARINT, Codec.NARROW_Z, Codec.VARINT_Z):
        if len(body) < 4:
            raise FrameError("integer body lacks its segment count")
        (nseg,) = struct.unpack_from("<I", body)
        rest = body[4:]
        if codec in (Codec.NARROW_Z, Codec.VARINT_Z):
            try:
                d = zlib.decompressobj()
                rest = d.decompress(rest, MAX_MESSAGE)
                if d.unconsumed_tail:
                    raise FrameError(f"compressed integer body is too large (inflates past {MAX_MESSAGE} bytes)")
                if not d.eof or d.unused_data:
                    raise FrameError("compressed integer body is cut short or has stray bytes")
            except zlib.error as exc:
                raise FrameError(f"compressed integer body is corrupt: {exc}") from None
        if nseg * 6 > len(rest):
            raise FrameError(f"{nseg} segment headers do not fit the body")
        heads = [struct.unpack_from("<IBB", rest, 6 * i) for i in range(nseg)]
        if sum(h[0] for h in heads) > MAX_MESSAGE:
            raise FrameError("integer vector too long")
        pos, parts = 6 * nseg, []
        for length, shift, width in heads:
            if shift > 62:
                raise FrameError(f"segment shift {shift} is over 62")
            if width == 0:
                seg = np.zeros(length, np.int64)
            elif width == 255:
                z, used = varint_decode(rest[pos:], length)
                seg, pos = _unzigzag(z), pos + used
            elif width in (1, 2, 4, 8):
                n = length * width
                if pos + n > len(rest):
                    raise FrameError("narrow segment is cut short")
                seg = np.frombuffer(rest[pos:pos + n], f"<i{width}").astype(np.int64)
                pos += n
            else:
                raise FrameError(f"segment width {width} is not 0, 1, 2, 4, 8 or 255")
            if shift:
                if seg.size and int(np.abs(seg).max()) >= INT_LIMIT >> shift:
                    raise FrameError("a segment value overflows 2**53 after its shift")
                seg = seg << shift
            parts.append(seg)
        if pos != len(rest):
            raise FrameError(f"{len(rest) - pos} stray bytes after the segments")
        out = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    else:
        raise FrameError(f"codec {codec} is not an integer-vector codec")
    if size is not None and out.size != size:
        raise FrameError(f"integer vector has {out.size} values, expected {size}")
    if out.size and int(np.abs(out).max()) >= INT_LIMIT:
        raise FrameError("an integer vector value is not below 2**53")
    return out


# -- state snapshots ----------------------------------------------------------------------


def encode_state(theta: np.ndarray, m: np.ndarray, v: np.ndarray, b1t: float, b2t: float) -> bytes:
    """STATE body: theta, m, v (float64 LE, n each), then b1t, b2t (float64 LE)."""
    return b"".join(np.ascontiguousarray(a, "<f8").tobytes() for a in (theta, m, v)) + \
        struct.pack("<dd", b1t, b2t)


def decode_state(body: bytes, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
    if len(body) != 24 * size + 16:
        raise FrameError(f"state of {len(body)} bytes does not hold {size} parameters")
    a = np.frombuffer(body, "<f8", 3 * size).astype(np.float64)
    if not np.isfinite(a).all():
        raise FrameError("state holds non-finite values")
    b1t, b2t = struct.unpack_from("<dd", body, 24 * size)
    return a[:size].copy(), a[size:2 * size].copy(), a[2 * size:].copy(), b1t, b2t


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


CONTROLS = (Run, Ready, Refuse, Assign, SyncRequest, DataRequest, Restore, End)
RunMessage = (Run | Ready | Refuse | Assign | SyncRequest | DataRequest | Restore | End | Contrib
              | Total | State | Data)
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


def _tasks_meta(tasks) -> list:
    return [{"task": t.task, "peer": t.peer, "micro": list(t.micro)} for t in tasks]


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
        codec, body = encode_ints(msg.ints, bounds)
        meta = {"term": msg.term, "contributors": [list(c) for c in msg.contributors],
                "loss": msg.loss, "params_sha256": msg.params_sha256}
        if msg.tasks:
            meta["tasks"] = _tasks_meta(msg.tasks)
        return Message(FrameType.TOTAL, run_id, msg.step, meta, body, codec)
    if isinstance(msg, State):
        return Message(FrameType.STATE, run_id, msg.step, {"params_sha256": msg.params_sha256},
                       encode_state(msg.theta, msg.m, msg.v, msg.b1t, msg.b2t))
    if isinstance(msg, Data):
        return Message(FrameType.DATA, run_id, 0, {"fingerprint": msg.fingerprint}, msg.data)
    meta: dict = {"t": msg.T}
    for k, v in msg.__dict__.items():
        if k == "step":
            continue
        if k == "tasks":
            v = _tasks_meta(v)
        elif isinstance(v, tuple):
            v = list(v)
        meta[k] = v
    return Message(FrameType.CONTROL, run_id, getattr(msg, "step", 0), meta)


def from_message(m: Message, size: int | None = None) -> RunMessage:
    """The typed run message of a decoded Message; ``size`` is the parameter count (needed
    for CONTRIB, TOTAL and STATE). Raises FrameError with a message on anything invalid."""
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
                     _tasks(f) if "tasks" in m.meta else ())
    if m.type == FrameType.STATE:
        if size is None:
            raise FrameError("state: the receiver has no run to load it into")
        theta, mm, v, b1t, b2t = decode_state(m.body, size)
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
                   f.int("strikes", 1, MAX_STRIKES) if "strikes" in m.meta else 3)
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
    raise FrameError(f"unknown control message {str(name)[:32]!r}")
