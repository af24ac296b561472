"""frames.py and frames.js, one shared case file (tests/scenarios/frames.json): every frame
type decodes to the same message in both languages, and every hostile variant of one is a
FrameError in both. The bytes are made here from the file's cases (frames.py's encoder, then
the case's patch), and the same bytes go to node."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import numpy as np
import pytest

from daisychain.peer import frames as F
from daisychain.peer.run import message_name
from jsrun import run_js

CASES = json.loads((Path(__file__).parents[1] / "scenarios" / "frames.json").read_text())
pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node

DRIVER = r"""
const input = DATA;
const norm = (v) => {
  if (v instanceof Float64Array) return Array.from(v);
  if (v instanceof Uint8Array) return Buffer.from(v).toString("hex");
  return v;
};
const out = {};
for (const c of input) {
  try {
    const r = new W.Reassembler();
    let m = null;
    for (const b64 of c.frames) m = r.feed(new Uint8Array(Buffer.from(b64, "base64")));
    if (!m) throw new Error("no message");
    const msg = await W.fromMessage(m, c.size);
    const o = {};
    for (const [k, v] of Object.entries(msg)) o[k] = k === "ints" ? Array.from(v, String) : norm(v);
    out[c.name] = o;
  } catch (err) {
    out[c.name] = (err instanceof W.FrameError ? "FrameError: " : `${err.name}: `) + err.message;
  }
}
console.log(JSON.stringify(out));
"""


def _floats(xs):
    return np.array([float(x) for x in xs], np.float64)


def build(case: dict) -> tuple[list[bytes], int | None]:
    """The frames of a case, and the parameter count to decode it with."""
    if "base" in case:
        base = copy.deepcopy(next(c for c in CASES["accept"] if c["name"] == case["base"]))
        for k in ("state", "body_hex", "size"):
            if k in case:
                base[k] = case[k]
        for k, v in case.get("meta_patch", {}).items():
            if v is None:
                base["meta"].pop(k, None)
            else:
                base["meta"][k] = v
    else:
        base = copy.deepcopy(case)
    typ = F.FrameType[base["type"].upper()]
    body, codec = b"", F.Codec.NONE
    if "ints" in base and "body_hex" not in base:
        codec, body = F.encode_ints(np.array(base["ints"], np.int64), CASES["bounds"],
                                    (F.Codec[base["codec"]],))
    elif "ints" in base:
        codec, body = F.Codec[base["codec"]], bytes.fromhex(base["body_hex"])
    elif "state" in base:
        s = dict(base["state"])
        for k in ("theta", "m", "v"):
            s[k] = s[k] * s.get("repeat", 1)
        body = F.encode_state(_floats(s["theta"]), _floats(s["m"]), _floats(s["v"]), s["b1t"], s["b2t"])
    elif "body_hex" in base:
        body = bytes.fromhex(base["body_hex"])
    if "truncate_body" in case:
        body = body[:-case["truncate_body"]]
    m = F.Message(typ, CASES["run_id"], base["step"], base["meta"], body, codec)
    frames = F.encode_frames(m, 1)
    if "meta_raw" in case or "meta_raw_hex" in case:
        meta = case["meta_raw"].encode() if "meta_raw" in case else bytes.fromhex(case["meta_raw_hex"])
        payload = len(meta).to_bytes(4, "little") + meta + body
        head = bytearray(frames[0][:F.HEADER_SIZE])
        head[32:36] = len(payload).to_bytes(4, "little")
        frames = [bytes(head) + payload]
    if "frames" in case:
        frames = [frames[i] for i in case["frames"]]
    for off, byte in case.get("header", {}).items():
        f = bytearray(frames[0])
        f[int(off)] = byte
        frames[0] = bytes(f)
    return frames, base.get("size", CASES["size"])


def _plain(v):
    if isinstance(v, np.ndarray):
        return [str(int(x)) for x in v] if v.dtype.kind in "iu" else [float(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).hex()
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, F.Task):
        return {"task": v.task, "peer": v.peer, "micro": list(v.micro)}
    return v


def python(frames: list[bytes], size) -> dict | str:
    try:
        r, m = F.Reassembler(), None
        for fr in frames:
            m = r.feed(fr)
        msg = F.from_message(m, size)
    except F.FrameError as exc:
        return f"FrameError: {exc}"
    return {"T": message_name(msg), **{k: _plain(v) for k, v in msg.__dict__.items()}}


def test_every_frame_type_and_every_refusal_agree():
    cases = CASES["accept"] + CASES["refuse"]
    built = {c["name"]: build(c) for c in cases}
    payload = [{"name": n, "size": s, "frames": [base64.b64encode(f).decode() for f in fr]}
               for n, (fr, s) in built.items()]
    js = run_js(DRIVER, imports={"W": "wire/frames.js"}, data=payload, timeout=120)
    assert {c["type"] for c in CASES["accept"]} == {"control", "contrib", "total", "state", "data", "ring"}
    assert {c["meta"]["t"] for c in CASES["accept"] if c["type"] == "control"} == {
        "run", "ready", "refuse", "assign", "sync", "data_request", "restore", "end", "ring_plan",
        "ring_sum", "ring_commit"}
    wrong = []
    for c in CASES["accept"]:
        py, j = python(*built[c["name"]]), js[c["name"]]
        assert isinstance(py, dict), (c["name"], py)
        if not isinstance(j, dict) or any(j.get(k) != v for k, v in py.items()):
            wrong.append((c["name"], py, j))
    for c in CASES["refuse"]:
        py, j = python(*built[c["name"]]), js[c["name"]]
        if not (isinstance(py, str) and py.startswith("FrameError")
                and isinstance(j, str) and j.startswith("FrameError")):
            wrong.append((c["name"], py, j))
    assert not wrong, "\n".join(f"{n}:\n  python: {str(p)[:300]}\n  js:     {str(j)[:300]}"
                                for n, p, j in wrong)
