"""Integer bodies whose segment headers claim far more values than their bytes hold: a few
bytes from a room member must be refused before anything of the claimed size is allocated,
in both decoders (intcodec.py, intcodec.js). Old decoders allocated the claim first: ~550
MiB for a 20-byte varint body (the compiled decoder of this stop), 512 MiB for a 10-byte
all-zero segment (both languages)."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from daisychain.peer import frames as F
from jsrun import run_js

pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node

SIZE = 9610  # the digits model's parameter count: what a replica expects


def _body(width: int, claim: int, payload: bytes = b"") -> bytes:
    return struct.pack("<I", 1) + struct.pack("<IBB", claim, 0, width) + payload


CASES = {  # name: (codec, body, expected size or None, words of the refusal)
    "varint claims 64 Mi values": (F.Codec.VARINT, _body(255, F.MAX_MESSAGE, b"\x01" * 10), None,
                                   "cut short"),
    "varint claims 64 Mi, the replica expects 9610": (F.Codec.VARINT, _body(255, F.MAX_MESSAGE, b"\x01" * 10),
                                                      SIZE, f"has {F.MAX_MESSAGE} values, expected {SIZE}"),
    "zero segment of 64 Mi": (F.Codec.NARROW, _body(0, F.MAX_MESSAGE), SIZE,
                              f"has {F.MAX_MESSAGE} values, expected {SIZE}"),
}


@pytest.mark.parametrize("name", CASES)
def test_python_refuses_a_claim_before_allocating_it(name):
    codec, body, size, words = CASES[name]
    tracemalloc.start()
    try:
        with pytest.raises(F.FrameError, match=words):
            F.decode_ints(codec, body, size)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"{peak / 2**20:.0f} MiB allocated for a {len(body)}-byte body"


DRIVER = r"""
const out = {};
for (const [name, c] of Object.entries(DATA)) {
  const before = process.memoryUsage().arrayBuffers;
  let words = "accepted";
  try {
    await W.decodeInts(c.codec, new Uint8Array(Buffer.from(c.b64, "base64")), c.size);
  } catch (err) {
    words = (err instanceof W.FrameError ? "FrameError: " : `${err.name}: `) + err.message;
  }
  out[name] = { words, grew: process.memoryUsage().arrayBuffers - before };
}
console.log(JSON.stringify(out));
"""


def test_js_refuses_the_same_claims_before_allocating_them():
    import base64
    cases = {n: {"codec": int(c), "b64": base64.b64encode(b).decode(), "size": s}
             for n, (c, b, s, _) in CASES.items() if s is not None}  # JS decodes with the size
    got = run_js(DRIVER, imports={"W": "wire/frames.js"}, data=cases)
    for name in cases:
        assert got[name]["words"] == f"FrameError: integer vector has {F.MAX_MESSAGE} values, expected {SIZE}"
        assert got[name]["grew"] < 2**20, f"{name}: {got[name]['grew'] / 2**20:.0f} MiB of array buffers"
