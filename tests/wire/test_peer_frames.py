"""Unit tier: the data-channel frame format and the integer codecs (daisychain.peer.frames)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from daisychain.peer import frames as F

RUN = "5cdcf52855fbe0d4"


def roundtrip(msg: F.Message, chunk=F.MAX_CHUNK) -> F.Message:
    r = F.Reassembler()
    frames = F.encode_frames(msg, 7, chunk)
    assert all(len(f) <= F.MAX_FRAME for f in frames)
    out = [r.feed(f) for f in frames]
    assert all(o is None for o in out[:-1])
    return out[-1]


def test_header_layout_is_the_documented_one():
    fr = F.encode_frames(F.Message(F.FrameType.CONTROL, RUN, 12, {"t": "end"}), 3)[0]
    magic, ver, typ, rid, step, msg, tensor, codec, res, idx, count, length = \
        struct.unpack_from("<2sBB8sIIHBBIII", fr)
    assert (magic, ver, typ, rid.hex(), step, msg, tensor, codec, res, idx, count) == \
        (b"DC", 1, 1, RUN, 12, 3, 0xFFFF, 0, 0, 0, 1)
    assert length == len(fr) - 36 and fr[36:40] == struct.pack("<I", len(b'{"t":"end"}'))


def test_large_message_is_chunked_and_reassembled():
    body = np.random.default_rng(1).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    m = roundtrip(F.Message(F.FrameType.DATA, RUN, 0, {"fingerprint": "0" * 64}, body))
    assert m.body == body and m.run_id == RUN and m.meta == {"fingerprint": "0" * 64}
    assert len(F.encode_frames(F.Message(F.FrameType.DATA, RUN, 0, {}, body), 0)) == 5


@pytest.mark.parametrize("codec", [c for c in F.Codec if c != F.Codec.NONE])
def test_every_codec_is_lossless(codec):
    rng = np.random.default_rng(int(codec))
    v = np.concatenate([rng.integers(-2**50, 2**50, 500) << 3, np.zeros(300, np.int64),
                        rng.integers(-100, 100, 200), [2**53 - 1, -(2**53 - 1), 0, 1, -1]])
    bounds = [0, 500, 800, 1000, v.size]
    c, body = F.encode_ints(v, bounds, (codec,))
    assert c == codec
    assert (F.decode_ints(c, body, v.size) == v).all()


def test_best_codec_is_smaller_than_float32():
    rng = np.random.default_rng(2)
    v = (rng.integers(-2**20, 2**20, 10_000) << 18).astype(np.int64)
    codec, body = F.encode_ints(v)
    assert codec != F.Codec.RAW and len(body) < 4 * v.size


def test_values_past_2_53_are_refused():
    with pytest.raises(F.FrameError, match="2\\*\\*53"):
        F.encode_ints(np.array([2**53], np.int64))


@pytest.mark.parametrize("data, message", [
    (b"XX" + bytes(40), "bad magic"),
    (b"DC\x02\x01" + bytes(40), "version 2"),
    (b"DC\x01\x09" + bytes(40), "unknown frame type 9"),
    (b"DC", "shorter than"),
    ("text", "binary frames"),
    (bytes(F.MAX_FRAME + 1), "over 65536"),
])
def test_bad_frames_raise_with_a_message(data, message):
    with pytest.raises(F.FrameError, match=message):
        F.decode_frame(data)


def test_out_of_order_chunk_is_refused():
    frames = F.encode_frames(F.Message(F.FrameType.DATA, RUN, 0, {}, bytes(200)), 1, 64)
    r = F.Reassembler()
    r.feed(frames[0])
    with pytest.raises(F.FrameError, match="out of order"):
        r.feed(frames[2])


def test_corrupt_integer_bodies_raise():
    v = np.arange(100, dtype=np.int64)
    for codec in (F.Codec.NARROW, F.Codec.VARINT, F.Codec.VARINT_Z):
        c, body = F.encode_ints(v, None, (codec,))
        with pytest.raises(F.FrameError):
            F.decode_ints(c, body[:-3], 100)
    with pytest.raises(F.FrameError, match="expected 99"):
        F.decode_ints(*F.encode_ints(v), 99)


def test_run_messages_roundtrip():
    ints = np.array([5, -3, 0, 2**40], np.int64)
    msgs = [
        F.Run({"engine": "1"}, RUN, 20, 1, 0, "a" * 64, "p0"),
        F.Ready(1, 12.5, "python", 3, "b" * 64),
        F.Refuse(1, ("LUT manifest: x here, y in the run",)),
        F.Assign(2, 4, (F.Task(0, "p1", (0, 1)), F.Task(1, "p0", (2, 3)))),
        F.SyncRequest(1, 3, "c" * 64, "hash mismatch"),
        F.End(1, 20, "d" * 64),
        F.Contrib(1, 4, 0, (0, 1), 3.5, 7, ints),
        F.Total(1, 4, (("p0", 2), ("p1", 2)), 0.25, "e" * 64, ints),
        F.State(4, "f" * 64, np.ones(4), np.zeros(4), np.full(4, 0.5), 0.9, 0.999),
    ]
    for msg in msgs:
        back = F.from_message(roundtrip(F.to_message(msg, RUN)), 4)
        assert back == msg
        if hasattr(msg, "ints"):
            assert (back.ints == ints).all()


@pytest.mark.parametrize("meta, message", [
    ({"t": "nope"}, "unknown control message"),
    ({"t": "ready", "term": 1, "capacity": "fast", "kind": "cpu", "params_sha256": "a" * 64},
     "'capacity' must be a finite number"),
    ({"t": "assign", "term": 1, "tasks": [{"task": 0, "peer": "p", "micro": [3, 1]}]},
     "sorted"),
    ({"t": "end", "term": 1, "params_sha256": "xyz"}, "hex digits"),
])
def test_invalid_meta_raises_with_a_message(meta, message):
    with pytest.raises(F.FrameError, match=message):
        F.from_message(roundtrip(F.Message(F.FrameType.CONTROL, RUN, 0, meta)))


@pytest.mark.parametrize("bits", [0, 7, 14, 30, 46, 54])
def test_compiled_varint_loops_give_the_numpy_bytes_and_refusals(bits):
    """Long vectors take numba loops (intcodec.COMPILED_MIN_SIZE); they must write the same
    bytes and refuse the same corrupt bodies, with the same words, as the numpy passes."""
    from daisychain.peer import intcodec as C
    assert C._kernels() is not None
    rng = np.random.default_rng(bits)
    n = C.COMPILED_MIN_SIZE + 1000
    z = rng.integers(0, 2**bits, n, dtype=np.uint64) if bits else np.zeros(n, np.uint64)
    z[::97] = 2**54 + 3  # the longest value an int vector can hold after zig-zag (8 bytes)
    body = C.varint_encode(z)
    assert body == C._varint_encode_np(z)
    values, used = C.varint_decode(body + b"\x05", n)
    assert used == len(body) and (values == z).all()
    for bad in (body[:-1], b"\xff" * 9 + body, b"\x80" * 3):
        with pytest.raises(F.FrameError) as compiled:
            C.varint_decode(bad, n)
        with pytest.raises(F.FrameError) as reference:
            C._varint_decode_np(np.frombuffer(bad, np.uint8), n)
        assert str(compiled.value) == str(reference.value)


def test_the_default_codec_is_the_smaller_of_narrow_and_varint():
    """As frames.js: the zlib codecs cost more time than their bytes save on the wire here
    (intcodec's docstring); they are still decoded."""
    rng = np.random.default_rng(3)
    for v in (rng.integers(-2**45, 2**45, 9000), rng.integers(-100, 100, 9000),
              np.zeros(9000, np.int64), (rng.integers(-2**20, 2**20, 9000) << 18)):
        v = v.astype(np.int64)
        codec, body = F.encode_ints(v, [0, 4000, 9000])
        sizes = {c: len(F.encode_ints(v, [0, 4000, 9000], (c,))[1]) for c in (F.Codec.NARROW, F.Codec.VARINT)}
        assert codec in sizes and len(body) == min(sizes.values())
        assert (F.decode_ints(codec, body, v.size) == v).all()
