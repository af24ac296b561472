"""Integer-vector codecs (CONTRIB and TOTAL bodies; |x| < 2**53) and the STATE body: one
of the three parts of the wire format (:mod:`daisychain.peer.frames`). :func:`encode_ints`
sends NARROW or VARINT, whichever is smaller, as frames.js does; every codec of
:class:`~daisychain.peer.framing.Codec` is decoded.

Why not the zlib codecs by default: on a step's contribution they save ~11-19% of the bytes
(default run: 15.4 -> 12.5 kB; 85,002 values: 199 -> 177 kB) for 0.2 ms and 4-17 ms of
compression, where the data channel here moves ~20 MB/s (45 ns/B): the compression costs
more than the bytes it saves, on the critical path of every step (bench/scaling.py)."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from daisychain.compiled import numba_jit
from daisychain.peer.framing import MAX_MESSAGE, Codec, FrameError

#: every value of an integer vector must stay below this in magnitude (JS Numbers are exact)
INT_LIMIT = 2**53
#: the most segments an integer body may declare: one per tensor of a model, and in a
#: local-steps contribution one more per replica's moment block (at most 4 x 1024 replicas,
#: engine/spec.py MAX_REPLICAS). Checked on the body's first four bytes, before anything is
#: inflated or allocated (webui/wire/intcodec.js the same).
MAX_SEGMENTS = 8192
#: bytes a segment header takes, and the most bytes one value's payload can take (NARROW
#: width 8; a VARINT of a value below 2**53 takes at most 8)
HEAD_BYTES, VALUE_BYTES = 6, 8


def out_of_range(v: np.ndarray, limit: int) -> bool:
    """True if some value of int64 ``v`` is at or past ``limit`` in magnitude: both ends
    compared, never ``abs`` (``abs(-2**63)`` is negative in int64; DETERMINISM rule 14)."""
    return bool(v.size) and (int(v.max()) >= limit or int(v.min()) <= -limit)


def past_bound(v: np.ndarray, bound: int) -> int | None:
    """A value of int64 ``v`` whose magnitude is over ``bound`` (as a Python int), or None.
    ``bound`` is a clamp bound of a sum: a value outside [-bound, bound] is refused."""
    if not v.size:
        return None
    hi, lo = int(v.max()), int(v.min())
    if hi > bound:
        return hi
    if lo < -bound:
        return -lo
    return None


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


#: vectors at least this long take the compiled varint loops (numba); below it numpy's
#: passes cost ~0.1 ms, and a process that never sends more need not import numba
COMPILED_MIN_SIZE = 2048
_compiled = None


_U7, _U127, _U128 = np.uint64(7), np.uint64(127), np.uint64(128)


def _varint_len_loop(z):
    n = 0
    for i in range(z.size):
        x = z[i]
        n += 1
        while x >= _U128:
            x >>= _U7
            n += 1
    return n


def _varint_write_loop(z, out):
    p = 0
    for i in range(z.size):
        x = z[i]
        while x >= _U128:
            out[p] = np.uint8((x & _U127) | _U128)
            x >>= _U7
            p += 1
        out[p] = np.uint8(x)
        p += 1
    return p


def _varint_read_loop(b, count, out):
    """Fills out[:count]; returns the bytes used, -1 if cut short, -2 if a value runs past 8
    bytes (the same refusals as the numpy decoder)."""
    p = 0
    n = b.size
    for i in range(count):
        x = np.uint64(0)
        k = 0
        while True:
            if p >= n:
                return -1
            c = b[p]
            p += 1
            if k == 8:
                return -2
            x |= (np.uint64(c) & _U127) << np.uint64(7 * k)
            k += 1
            if c < 128:
                break
        out[i] = x
    return p


def _kernels():
    """(length, write, read) compiled with numba on first use (cached on disk); None without
    numba or with DAISYCHAIN_NO_NUMBA set. They give the same bytes and values as the numpy
    passes (tests/wire/test_peer_frames.py)."""
    global _compiled
    if _compiled is None:
        jit = numba_jit()
        if jit is None:
            return None
        _compiled = (jit(_varint_len_loop), jit(_varint_write_loop), jit(_varint_read_loop))
    return _compiled


def varint_encode(z: np.ndarray) -> bytes:
    """LEB128 of unsigned values: compiled loops for long vectors, else vectorised numpy
    (only as many byte columns as the largest value needs)."""
    z = np.ascontiguousarray(z, np.uint64)
    if z.size == 0:
        return b""
    k = _kernels() if z.size >= COMPILED_MIN_SIZE else None
    if k is not None:
        out = np.empty(k[0](z), np.uint8)
        k[1](z, out)
        return out.tobytes()
    return _varint_encode_np(z)


def _varint_encode_np(z: np.ndarray) -> bytes:
    z = z.astype(np.uint64)
    if z.size == 0:
        return b""
    width = max(1, (int(z.max()).bit_length() + 6) // 7)
    nbytes = np.ones(z.size, np.int64)
    for k in range(1, width):
        nbytes += (z >> np.uint64(7 * k)) > 0
    rows = np.empty((z.size, width), np.uint8)
    for k in range(width):
        byte = ((z >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        more = nbytes > k + 1
        rows[:, k] = byte | (more.astype(np.uint8) << 7)
    mask = np.arange(width)[None, :] < nbytes[:, None]
    return rows[mask].tobytes()


def varint_decode(data: bytes, count: int) -> tuple[np.ndarray, int]:
    """``count`` LEB128 values from the start of ``data``; returns (values, bytes used)."""
    if count == 0:
        return np.zeros(0, np.uint64), 0
    b = np.frombuffer(data, np.uint8)
    if count > b.size:  # every value takes a byte at least: refused before any allocation
        raise FrameError("varint segment is cut short")
    k = _kernels() if count >= COMPILED_MIN_SIZE else None
    if k is not None:
        out = np.empty(count, np.uint64)
        used = int(k[2](b, count, out))
        if used == -1:
            raise FrameError("varint segment is cut short")
        if used == -2:  # the numpy decoder checks for too few terminators first
            if np.count_nonzero(b < 0x80) < count:
                raise FrameError("varint segment is cut short")
            raise FrameError("varint longer than 8 bytes")
        return out, used
    return _varint_decode_np(b, count)


def _varint_decode_np(b: np.ndarray, count: int) -> tuple[np.ndarray, int]:
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
    """The smaller of NARROW and VARINT for an int64 vector (or the smallest of ``codecs``);
    ``bounds`` are segment boundaries (e.g. the canonical tensors: ``[0, n0, n0 + n1, ...,
    len(v)]``). Returns (codec, body)."""
    v = np.ascontiguousarray(v, np.int64)
    if out_of_range(v, INT_LIMIT):
        raise FrameError("an integer vector value is not below 2**53")
    bounds = list(bounds) if bounds else [0, v.size]
    if bounds[0] != 0 or bounds[-1] != v.size or any(a > b for a, b in zip(bounds, bounds[1:])):
        raise FrameError("segment bounds must run from 0 to the vector length")
    count = struct.pack("<I", len(bounds) - 1)
    options = {}
    want = codecs or (Codec.NARROW, Codec.VARINT)
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


def _segment_part(codec: int, rest: bytes, nseg: int, size: int | None, max_size: int | None) -> bytes:
    """The segment part of a NARROW / VARINT body (inflated for the _Z codecs), bounded by
    what its declared shape can need: ``nseg`` headers and at most 8 bytes a value."""
    if nseg > MAX_SEGMENTS:
        raise FrameError(f"integer body declares {nseg} segments (at most {MAX_SEGMENTS})")
    values = size if size is not None else max_size
    cap = MAX_MESSAGE if values is None else min(MAX_MESSAGE, HEAD_BYTES * nseg + VALUE_BYTES * values)
    if codec not in (Codec.NARROW_Z, Codec.VARINT_Z):
        return rest
    try:
        d = zlib.decompressobj()
        out = d.decompress(rest, cap)
        if d.unconsumed_tail or (cap < MAX_MESSAGE and d.decompress(b"", 1)):
            raise FrameError(f"compressed integer body is too large (inflates past {cap} bytes, "
                             f"more than its {nseg} segments can hold)")
        if not d.eof or d.unused_data:
            raise FrameError("compressed integer body is cut short or has stray bytes")
    except zlib.error as exc:
        raise FrameError(f"compressed integer body is corrupt: {exc}") from None
    return out


_HEAD = np.dtype([("length", "<u4"), ("shift", "u1"), ("width", "u1")])


def decode_ints(codec: int, body: bytes, size: int | None = None, max_size: int | None = None) -> np.ndarray:
    """Inverse of :func:`encode_ints`; ``size`` (if given) is the expected length, else
    ``max_size`` (if given) the most values the receiver takes (a ring chunk's). Every bound
    is checked from the body's declared shape before anything it claims is allocated."""
    if codec == Codec.RAW:
        if len(body) % 8:
            raise FrameError("raw int64 body length is not a multiple of 8")
        out = np.frombuffer(body, "<i8").astype(np.int64)
    elif codec in (Codec.NARROW, Codec.VARINT, Codec.NARROW_Z, Codec.VARINT_Z):
        if len(body) < 4:
            raise FrameError("integer body lacks its segment count")
        (nseg,) = struct.unpack_from("<I", body)
        rest = _segment_part(codec, body[4:], nseg, size, max_size)
        if nseg * HEAD_BYTES > len(rest):
            raise FrameError(f"{nseg} segment headers do not fit the body")
        heads = np.frombuffer(rest, _HEAD, nseg)
        total = int(heads["length"].sum(dtype=np.int64))
        if total > MAX_MESSAGE:
            raise FrameError("integer vector too long")
        if size is not None and total != size:  # before anything the headers claim is made
            raise FrameError(f"integer vector has {total} values, expected {size}")
        if size is None and max_size is not None and total > max_size:
            raise FrameError(f"integer vector has {total} values, more than {max_size}")
        pos, parts = HEAD_BYTES * nseg, []
        for length, shift, width in heads.tolist():
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
                if out_of_range(seg, INT_LIMIT >> shift):
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
    if size is None and max_size is not None and out.size > max_size:
        raise FrameError(f"integer vector has {out.size} values, more than {max_size}")
    if out_of_range(out, INT_LIMIT):
        raise FrameError("an integer vector value is not below 2**53")
    return out


# -- state snapshots ----------------------------------------------------------------------


def encode_state(theta: np.ndarray, m: np.ndarray, v: np.ndarray, b1t: float, b2t: float) -> bytes:
    """STATE body: theta, m, v (float64 LE, n each), then b1t, b2t (float64 LE)."""
    return b"".join(np.ascontiguousarray(a, "<f8").tobytes() for a in (theta, m, v)) + \
        struct.pack("<dd", b1t, b2t)


def decode_state(body: bytes, size: int, moments: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
    """The inverse of :func:`encode_state`: theta has ``size`` values, m and v ``moments``
    each (default ``size``; a local-steps run's differ, engine/local.py)."""
    k = size if moments is None else moments
    if len(body) != 8 * (size + 2 * k) + 16:
        raise FrameError(f"state of {len(body)} bytes does not hold {size} parameters")
    a = np.frombuffer(body, "<f8", size + 2 * k).astype(np.float64)
    if not np.isfinite(a).all():
        raise FrameError("state holds non-finite values")
    b1t, b2t = struct.unpack_from("<dd", body, 8 * (size + 2 * k))
    return a[:size].copy(), a[size:size + k].copy(), a[size + k:].copy(), b1t, b2t
