"""Unit tier: daisychain/webui/wire/frames.js against daisychain/peer/frames.py, byte for byte, in
node (a run without node fails). Python-encoded messages of every codec decode in JS to the same
integers; JS-encoded contributions decode in Python; both choose the same NARROW/VARINT body."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from daisychain.peer import frames as F
from jsrun import run_js

pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node


DRIVER = r"""
const input = DATA;
const out = { decoded: [], encoded: [] };
for (const b64 of input.messages) {
  const r = new W.Reassembler();
  const bytes = Buffer.from(b64, "base64");
  let m = null;
  for (let o = 0; o < bytes.length;) {
    const len = 36 + bytes.readUInt32LE(o + 32);
    m = r.feed(new Uint8Array(bytes.subarray(o, o + len)));
    o += len;
  }
  const msg = await W.fromMessage(m, input.size);
  out.decoded.push({ T: msg.T, step: msg.step, task: msg.task, ints: Array.from(msg.ints).map(String) });
}
const v = Float64Array.from(input.vector.map(Number));
let no = 0;
for (const codec of [W.Codec.NARROW, W.Codec.VARINT]) {
  const { body } = W.encodeInts(v, input.bounds, [codec]);
  out.encoded.push([codec, Buffer.from(body).toString("base64")]);
}
const frames = W.encode({ T: "contrib", term: 1, step: 3, task: 2, micro: [0, 1], loss: 0.5, correct: 9, ints: v },
                        "5cdcf52855fbe0d4", input.bounds, () => no++);
out.contrib = Buffer.concat(frames.map((f) => Buffer.from(f))).toString("base64");
console.log(JSON.stringify(out));
"""


def test_js_and_python_frames_agree():
    rng = np.random.default_rng(5)
    v = np.concatenate([rng.integers(-2**30, 2**30, 3000) << 12, np.zeros(500, np.int64),
                        rng.integers(-2**45, 2**45, 100), [2**52, -(2**52)]]).astype(np.int64)
    bounds = [0, 3000, 3500, v.size]
    messages = []
    for codec in (F.Codec.RAW, F.Codec.NARROW, F.Codec.VARINT, F.Codec.NARROW_Z, F.Codec.VARINT_Z):
        c, body = F.encode_ints(v, bounds, (codec,))
        m = F.Message(F.FrameType.TOTAL, "5cdcf52855fbe0d4", 4,
                      {"term": 1, "contributors": [["p0", 4]], "loss": 0.1, "params_sha256": "a" * 64},
                      body, c)
        messages.append(base64.b64encode(b"".join(F.encode_frames(m, 1))).decode())
    out = run_js(DRIVER, imports={"W": "wire/frames.js"}, data={"messages": messages, "size": int(v.size),
                                                            "vector": [str(x) for x in v], "bounds": bounds})
    want = [str(x) for x in v]
    for d in out["decoded"]:
        assert d["T"] == "total" and d["step"] == 4 and d["ints"] == want
    for codec, b64 in out["encoded"]:
        body = base64.b64decode(b64)
        assert body == F.encode_ints(v, bounds, (codec,))[1]  # the same bytes as Python
        assert (F.decode_ints(codec, body, v.size) == v).all()
    r = F.Reassembler()
    raw = base64.b64decode(out["contrib"])
    msg, o = None, 0
    while o < len(raw):
        n = F.HEADER_SIZE + int.from_bytes(raw[o + 32:o + 36], "little")
        msg = r.feed(raw[o:o + n])
        o += n
    c = F.from_message(msg, v.size)
    assert (c.step, c.task, c.micro, c.correct) == (3, 2, (0, 1), 9) and (c.ints == v).all()


def test_js_encodes_every_shift_and_width_as_python_does():
    """The JS encoder's common trailing zeros (an OR of the magnitudes, as two 32-bit words) and
    its varint writer (shifts below 2**32, divisions above): on segments whose values share 0
    to 50 zero bits, at magnitudes up to 2**53, with zeros, the bytes are Python's; and the
    JS decoder (varints of 1 to 8 bytes without BigInt, NARROW by width) reads Python's bodies
    back to the same values."""
    rng = np.random.default_rng(11)
    vectors = []
    for k in range(60):
        shift = int(rng.integers(0, 51))
        top = int(rng.integers(1, 53 - shift + 1))
        v = rng.integers(-(2 ** (top - 1)), 2 ** (top - 1), int(rng.integers(1, 200)), dtype=np.int64) << shift
        if k % 7 == 0:
            v[rng.random(v.size) < 0.6] = 0
        if k % 11 == 0:
            v[:] = 0
        vectors.append(v)
    v = np.concatenate(vectors)
    bounds = [0, *np.cumsum([x.size for x in vectors]).tolist()]
    bodies = {int(c): base64.b64encode(F.encode_ints(v, bounds, (c,))[1]).decode()
              for c in (F.Codec.NARROW, F.Codec.VARINT)}
    out = run_js("""
      const v = Float64Array.from(DATA.vector.map(Number));
      const enc = [W.Codec.NARROW, W.Codec.VARINT].map((c) =>
        [c, Buffer.from(W.encodeInts(v, DATA.bounds, [c]).body).toString("base64")]);
      const dec = [];
      for (const [c, b64] of Object.entries(DATA.bodies)) {
        const got = await W.decodeInts(Number(c), Uint8Array.from(Buffer.from(b64, "base64")), v.length);
        dec.push([Number(c), Array.from(got).map((x) => BigInt(x).toString())]);
      }
      console.log(JSON.stringify({ enc, dec }));
    """, imports={"W": "wire/frames.js"}, data={"vector": [str(x) for x in v], "bounds": bounds, "bodies": bodies})
    for codec, b64 in out["enc"]:
        assert base64.b64decode(b64) == F.encode_ints(v, bounds, (codec,))[1], codec
    for codec, values in out["dec"]:  # and Python's bodies decode to the same values (every varint length)
        assert values == [str(x) for x in v], codec


def test_js_picks_the_codec_python_picks_and_writes_only_that_one():
    """encodeInts sizes RAW, NARROW and VARINT from one pass over the values and writes only
    the smallest: on vectors where each codec wins (RAW against width-8 NARROW segments), and
    with empty segments, its (codec, body) is Python's choice among the same codecs."""
    rng = np.random.default_rng(23)
    cases = [
        (rng.integers(-100, 100, 4000) << 9, [0, 1000, 4000]),                 # narrow, width 1
        (rng.geometric(0.3, 4000) * rng.choice([-1, 1], 4000), [0, 4000]),    # varint: mostly small
        (np.concatenate([np.zeros(3000, np.int64), rng.integers(-2**40, 2**40, 30)]), [0, 3000, 3030]),
        (rng.integers(-2**52, 2**52, 500), [0, 500]),                            # width 8: RAW ties/wins
        (rng.integers(-2**52, 2**52, 500) | 1, [0, 100, 200, 300, 400, 500]),   # RAW smaller than 5 heads
        (np.zeros(10, np.int64), [0, 5, 10]),
    ]
    out = run_js("""
      console.log(JSON.stringify(DATA.cases.map(([vec, bounds]) => {
        const { codec, body } = W.encodeInts(Float64Array.from(vec.map(Number)), bounds);
        return [codec, Buffer.from(body).toString("base64")];
      })));
    """, imports={"W": "wire/frames.js"},
        data={"cases": [[[str(x) for x in v], b] for v, b in cases]})
    picked = set()
    for (v, bounds), (codec, b64) in zip(cases, out):
        want = F.encode_ints(np.asarray(v, np.int64), bounds, (F.Codec.RAW, F.Codec.NARROW, F.Codec.VARINT))
        assert (codec, base64.b64decode(b64)) == (int(want[0]), want[1])
        picked.add(codec)
    assert picked == {F.Codec.RAW, F.Codec.NARROW, F.Codec.VARINT}  # every branch of the choice ran


def test_a_total_is_encoded_once_and_its_received_body_kept():
    """The coordinator's commit encodes a total once for its rollback window and every
    member's TOTAL (messages.py Total.encoded): encode() sends a total's `encoded` body as it
    is, not a second encoding; fromMessage keeps the received body as `encoded` (for the
    member's window), not listed among the message's fields."""
    v = (np.arange(-500, 500, dtype=np.int64) * 3) << 7
    varint = F.encode_ints(v, [0, 1000], (F.Codec.NARROW,))  # not the codec encodeInts would pick
    assert F.encode_ints(v, [0, 1000])[0] != F.Codec.NARROW
    out = run_js("""
      const v = Float64Array.from(DATA.v.map(Number));
      const enc = { codec: DATA.codec, body: Uint8Array.from(Buffer.from(DATA.body, "base64")) };
      const msg = W.withEncoded({ T: "total", term: 1, step: 2, contributors: [["p0", 1]], loss: 0.5,
        params_sha256: "a".repeat(64), ints: v, tasks: [] }, enc);
      const frames = W.encode(msg, "5cdcf52855fbe0d4", [0, 1000], () => 1);
      const R = new W.Reassembler();
      let whole = null;
      for (const f of frames) whole = R.feed(f) ?? whole;
      const back = await W.fromMessage(whole, 1000);
      console.log(JSON.stringify({ codec: whole.codec, body: Buffer.from(whole.body).toString("base64"),
        keptCodec: back.encoded.codec, kept: Buffer.from(back.encoded.body).toString("base64"),
        keys: Object.keys(back), same: Array.from(back.ints).every((x, i) => x === v[i]) }));
    """, imports={"W": "wire/frames.js"},
        data={"v": [str(x) for x in v], "codec": int(varint[0]), "body": base64.b64encode(varint[1]).decode()})
    assert (out["codec"], base64.b64decode(out["body"])) == (int(varint[0]), varint[1])
    assert (out["keptCodec"], base64.b64decode(out["kept"])) == (int(varint[0]), varint[1])
    assert "encoded" not in out["keys"] and out["same"]
