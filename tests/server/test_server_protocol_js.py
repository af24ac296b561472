"""Unit tier: ``webui/wire/protocol.js`` agrees with ``daisychain/signaling.py`` (run in Node).

The same frames go through both parsers: each accepts the same ones, with the same fields,
and rejects the others with the same error code; what the JS builders produce is what the
Python parser accepts."""

from __future__ import annotations

import json
import random

import pytest

from daisychain import signaling as p
from jsrun import run_js

pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node

RUNNER = """
const input = DATA;
const run = (fn) => { try { return { ok: true, msg: fn() }; } catch (e) {
  if (!(e instanceof P.ProtocolError)) throw e; return { ok: false, code: e.code }; } };
const out = {
  server: input.server.map((t) => run(() => P.parseServer(t))),
  client: input.client.map((t) => run(() => P.parseClient(t))),
  built: [P.hello({ name: "tab", kind: "webgpu", capacity: 3, room: "k7qm 4xzp 9r" }),
          P.hello({ name: "tab", kind: "cpu", capacity: 1, token: "tok" }),
          P.join("new"), P.leave(), P.approve("ab12"), P.deny("ab12"), P.ping(7),
          P.offer("ab12", { type: "offer", sdp: "v=0" }), P.answer("ab12", "v=0 a"),
          P.candidate("ab12", { candidate: "candidate:1", sdpMid: "0", sdpMLineIndex: 0 }),
          P.candidate("ab12", null), P.broadcast({ run: 1 }), P.broadcast([1], "ab12")].map(P.encode),
  rooms: ["network", "NEW", "k7qm-4xzp-9r", "K7QM4XZP9R", "i0lo-abcd-ef"].map(P.normalizeRoom),
  fromUrl: [P.roomFromLocation("?room=k7qm4xzp9r"), P.roomFromLocation("")],
  badBuild: run(() => P.offer("not an id!", "v=0")),
};
process.stdout.write(JSON.stringify(out));
"""


def server_frames() -> list[str]:
    dev = p.Device("ab12", "tab", "webgpu", 2.5)
    good = [p.Welcome(id="ab12", token="t0k", resumed=True, ice_servers=({"urls": "stun:x"},),
                      limits={"rate_per_s": 50}),
            p.RoomState(room="private", code="K7QM-4XZP-9R", you="ab12", host="ab12",
                        members=(p.Member("ab12", "tab", "webgpu", 2.5, True),), pending=(dev,)),
            p.RoomState(room="network", code=None, you="cd34", host=None, members=()),
            p.Pending(code="K7QM-4XZP-9R"), p.JoinRequest(peer=dev), p.Pong(t=1.5), p.Pong(),
            p.Error(code="denied", message="no", ref="join"),
            p.Offer(sdp="v=0", sender="ab12"), p.Answer(sdp="v=0", sender="ab12"),
            p.Candidate(candidate={"candidate": "c", "sdpMid": "0", "sdpMLineIndex": 1}, sender="ab12"),
            p.Candidate(candidate=None, sender="ab12"), p.Broadcast(data={"a": [1, None]}, sender="x")]
    frames = [p.encode(m) for m in good]
    bad = ['{"type":"offer","sdp":"v=0"}', '{"type":"offer","sdp":1,"from":"a"}', "[]", "nope",
           '{"type":"welcome","id":"a b","token":"t","version":1}', '{"type":"room","room":"x"}',
           '{"type":"join_request","peer":{"id":"a","name":"","kind":"cpu","capacity":1}}',
           '{"type":"join_request","peer":{"id":"a","name":"n","kind":"gpu","capacity":1}}',
           '{"type":"pong","t":"1"}', '{"type":"broadcast","from":"a"}', '{"type":5}',
           '{"type":"candidate","from":"a","candidate":{"candidate":"c","sdpMLineIndex":-1}}',
           '{"type":"teleport"}', json.dumps({"type": "offer", "from": "a", "sdp": "x" * 40000})]
    return frames + bad + mutations(frames, 150)


def client_frames() -> list[str]:
    good = [p.Hello(name=" tab ", kind="cpu", capacity=1, room="network"),
            p.Hello(name="tab", kind="python", capacity=0, room="K7QM-4XZP-9R", token="tok"),
            p.Join(room="new"), p.Leave(), p.Approve(peer="ab"), p.Deny(peer="ab"), p.Ping(t=3),
            p.Offer(sdp="v=0", to="ab"), p.Answer(sdp="v=0", to="ab"), p.Candidate(candidate=None, to="ab"),
            p.Broadcast(data=[1, {"x": "y"}]), p.Broadcast(data=None, to="ab")]
    frames = [p.encode(m) for m in good]
    bad = ['{"type":"hello","version":2,"name":"a","kind":"cpu","capacity":1}',
           '{"type":"hello","version":1,"name":"a","kind":"cpu","capacity":-1}',
           '{"type":"hello","version":1,"name":"a","kind":"cpu","capacity":true}',
           '{"type":"join","room":"ABCD"}', '{"type":"broadcast"}', '{"type":"approve","peer":""}',
           json.dumps({"type": "broadcast", "data": "x" * 17000}),
           json.dumps({"type": "broadcast", "data": [[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]})]
    return frames + bad + mutations(frames, 150)


def mutations(frames: list[str], n: int) -> list[str]:
    """Frames with one field dropped, retyped or replaced."""
    rng = random.Random(5)
    values = [None, 0, -1, 1.5, "", "x", "a b", True, [], {}, "K7QM-4XZP-9R", "network", 1e9, 2**40]
    out = []
    for _ in range(n):
        obj = json.loads(rng.choice(frames))
        keys = [k for k in obj if k != "type"]
        if keys:
            k = rng.choice(keys)
            if rng.random() < 0.3:
                del obj[k]
            else:
                obj[k] = rng.choice(values)
        out.append(json.dumps(obj))
    return out


def py_result(parse, text):
    try:
        m = parse(text)
    except p.ProtocolError as exc:
        return {"ok": False, "code": exc.code.value}
    wire = p.to_wire(m)
    wire.pop("version", None) if wire["type"] != "welcome" else None
    return {"ok": True, "msg": wire}


def js_normal(res):
    """The JS object in wire spelling, for comparison."""
    if not res["ok"]:
        return res
    m = dict(res["msg"])
    if "sender" in m:
        m["from"] = m.pop("sender")
    if "iceServers" in m:
        m["ice_servers"] = m.pop("iceServers")
    m.pop("version", None) if m["type"] != "welcome" else None
    return {"ok": True, "msg": {k: v for k, v in m.items()
                                if v is not None or k in ("candidate", "data")}}


def test_js_mirror_agrees_with_python():
    server, client = server_frames(), client_frames()
    js = run_js(RUNNER, imports={"P": "wire/protocol.js"}, data={"server": server, "client": client})
    for side, frames, parse in (("server", server, p.parse_server), ("client", client, p.parse_client)):
        for text, res in zip(frames, js[side]):
            assert js_normal(res) == py_result(parse, text), (side, text)
    built = [p.parse_client(t) for t in js["built"]]
    assert built[0] == p.Hello(name="tab", kind="webgpu", capacity=3, room="K7QM-4XZP-9R")
    assert built[1].token == "tok" and built[1].room == "network"
    assert built[7] == p.Offer(sdp="v=0", to="ab12")
    assert built[9].candidate == {"candidate": "candidate:1", "sdpMid": "0", "sdpMLineIndex": 0}
    assert built[11] == p.Broadcast(data={"run": 1}) and built[12] == p.Broadcast(data=[1], to="ab12")
    assert js["rooms"] == ["network", "new", "K7QM-4XZP-9R", "K7QM-4XZP-9R", "1010-ABCD-EF"]
    assert js["rooms"] == [p.normalize_room(x) for x in
                           ("network", "NEW", "k7qm-4xzp-9r", "K7QM4XZP9R", "i0lo-abcd-ef")]
    assert js["fromUrl"] == ["K7QM-4XZP-9R", "network"]
    assert js["badBuild"] == {"ok": False, "code": "bad_message"}
