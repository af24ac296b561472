"""Framing: a message (type, run id, step, meta, body) <-> frames of at most
:data:`MAX_FRAME` bytes, and the reassembly of a channel's frames into messages (meta JSON
parsed here, NaN / Infinity refused). One of the three parts of the wire format that
:mod:`daisychain.peer.frames` puts together (with :mod:`~daisychain.peer.intcodec` and
:mod:`~daisychain.peer.messages`); ``daisychain/webui/wire/frames.js`` is the JS mirror and
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
"""

from __future__ import annotations

import enum
import json
import math
import struct
from dataclasses import dataclass, field

MAGIC = b"DC"
VERSION = 1
HEADER = struct.Struct("<2sBB8sIIHBBIII")
HEADER_SIZE = HEADER.size  # 36
MAX_FRAME = 64 * 1024
MAX_CHUNK = MAX_FRAME - HEADER_SIZE
MAX_MESSAGE = 64 * 1024 * 1024
MAX_META = 1 << 20
WHOLE = 0xFFFF


class FrameError(ValueError):
    """Bytes that break the frame format; ``str(err)`` says what."""


class FrameType(enum.IntEnum):
    CONTROL = 1  # meta only: run, ready, refuse, assign, sync, data_request, restore, end
    CONTRIB = 2  # a peer's integer partial sum for one task of a step (body: int vector)
    TOTAL = 3    # the committed integer total of a step (body: int vector)
    STATE = 4    # a replica's state: theta, Adam m, v as float64 LE, then b1t, b2t (float64)
    DATA = 5     # reserved: dataset bytes over the channel
    RING = 6     # one chunk of a ring all-reduce (peer/run/ring.py; body: int vector)


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
