"""frames.py and frames.js refuse the same hostile inputs, from shared bytes made here: meta
holding a non-finite number (`1e999000` parses to Infinity in both languages, NaN), a zlib
integer body that inflates past MAX_MESSAGE (a ~65 KB "zip bomb"), and a corrupt one. Each
must be a FrameError in both (never an allocation of the whole output, never another error)."""

from __future__ import annotations

import base64
import zlib

import pytest

from daisychain.peer import frames as F
from jsrun import run_js

pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node

DRIVER = r"""
const input = DATA;
const out = {};
for (const [name, c] of Object.entries(input)) {
  const bytes = new Uint8Array(Buffer.from(c.b64, "base64"));
  try {
    if (c.kind === "meta") {
      const r = new W.Reassembler();
      for (let o = 0; o < bytes.length;) {
        const len = 36 + Buffer.from(bytes.buffer, bytes.byteOffset + o + 32, 4).readUInt32LE(0);
        r.feed(bytes.subarray(o, o + len));
        o += len;
      }
    } else {
      await W.decodeInts(c.codec, bytes);
    }
    out[name] = "accepted";
  } catch (err) {
    out[name] = (err instanceof W.FrameError ? "FrameError: " : `${err.name}: `) + err.message;
  }
}
console.log(JSON.stringify(out));
"""


def _meta_frames(number: str) -> bytes:
    m = F.Message(F.FrameType.CONTROL, "5cdcf52855fbe0d4", 1, {"T": "ready", "capacity": 12345678})
    frames = F.encode_frames(m, 0)
    raw = b"".join(frames)
    assert raw.count(b"12345678") == 1
    return raw.replace(b"12345678", number.encode())


def _cases() -> dict:
    bomb = b"\x01\x00\x00\x00" + zlib.compress(b"\x00" * (F.MAX_MESSAGE + 4096), 9)
    corrupt = b"\x01\x00\x00\x00" + b"\x78\x9c" + b"\xff" * 64
    return {
        "infinite_number": {"kind": "meta", "raw": _meta_frames("1e999000")},
        "nan": {"kind": "meta", "raw": _meta_frames("NaN12345")},
        "zip_bomb": {"kind": "ints", "codec": int(F.Codec.NARROW_Z), "raw": bomb},
        "corrupt_zlib": {"kind": "ints", "codec": int(F.Codec.VARINT_Z), "raw": corrupt},
    }


def _python(case) -> str:
    try:
        if case["kind"] == "meta":
            r, raw, o = F.Reassembler(), case["raw"], 0
            while o < len(raw):
                n = F.HEADER_SIZE + int.from_bytes(raw[o + 32:o + 36], "little")
                r.feed(raw[o:o + n])
                o += n
        else:
            F.decode_ints(case["codec"], case["raw"])
        return "accepted"
    except F.FrameError as exc:
        return f"FrameError: {exc}"


def test_python_and_js_refuse_the_same_hostile_frames():
    cases = _cases()
    assert len(cases["zip_bomb"]["raw"]) < 100_000  # small on the wire, 64 MiB inflated
    payload = {k: {**{x: y for x, y in c.items() if x != "raw"},
                   "b64": base64.b64encode(c["raw"]).decode()} for k, c in cases.items()}
    js = run_js(DRIVER, imports={"W": "wire/frames.js"}, data=payload, timeout=120)
    for name, case in cases.items():
        py = _python(case)
        assert py.startswith("FrameError"), (name, py)
        assert js[name].startswith("FrameError"), (name, js[name])
    for name, word in (("infinite_number", "finite"), ("zip_bomb", "too large"),
                       ("corrupt_zlib", "corrupt")):
        assert word in _python(cases[name]) and word in js[name], (name, js[name])
