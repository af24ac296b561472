"""Unit tier, in node: the tab's send path (daisychain/webui/shell/mesh.js, ``Mesh._send``).

A receiver drops a message whose frames are interleaved with another message's, so a tab
must send the frames of each message back to back. The network here is a stand-in for
network.js whose ``send`` resolves on a later task (as it does while the channel is above
its high-water mark); everything else is the real Mesh and the real frames.js. What each
peer receives is reassembled and decoded by the real frames.js.
"""

from __future__ import annotations

import pytest

from jsrun import run_js

DRIVER = r"""
const cfg = DATA;

const bus = { handlers: {}, logs: [],
  on(ev, f) { (this.handlers[ev] ||= []).push(f); },
  emit(ev, x) { if (ev === "run:log") this.logs.push(x.text); for (const f of this.handlers[ev] || []) f(x); } };
const wire = [];                       // [to, frame] in the order they were handed to a channel
const stuck = new Set(cfg.stuck || []);
const net = {
  async send(to, f) {
    if (stuck.has(to)) return new Promise(() => {});      // a link that never drains
    wire.push([to, f]);
    await new Promise((r) => setTimeout(r, 0));            // the channel is busy: later
  },
};
const mesh = new Mesh(bus, net, { kind: "cpu", capacity: 1 });
clearInterval(mesh.timer);
if (cfg.limit) mesh.sendQueueBytes = cfg.limit;
mesh.peer = { runId: "5cdcf52855fbe0d4", bounds: null };

const n = cfg.size;
const vec = (k) => Float64Array.from({ length: n }, (_, i) => (i * 7 + k) % 1000 / 1000);
const sha = "ab".repeat(32);
const state = { T: "state", step: 10, params_sha256: sha, theta: vec(1), m: vec(2), v: vec(3), b1t: 0.5, b2t: 0.25 };
const accepted = [];
for (const [to, kind] of cfg.sends) {
  const msg = kind === "state" ? state
    : kind === "restore" ? { T: "restore", term: 2, step: 10, params_sha256: sha }
    : { T: "end", term: 2, step: 10, params_sha256: sha };
  accepted.push(mesh._send(to, msg));
}
const queued = mesh.queuedBytes ? mesh.queuedBytes() : null;
for (let i = 0; i < 200 && wire.length < cfg.expectFrames; i++) await new Promise((r) => setTimeout(r, 1));

const got = {};
const rs = {};
const errors = [];
for (const [to, f] of wire) {
  rs[to] ||= new W.Reassembler();
  got[to] ||= [];
  try {
    const m = rs[to].feed(f);
    if (!m) continue;
    const msg = await W.fromMessage(m, n);
    got[to].push(msg.T === "state" ? `state:${msg.theta.every((x, i) => x === state.theta[i]) && msg.v[n - 1] === state.v[n - 1]}` : msg.T);
  } catch (err) {
    errors.push(`${to}: ${err.message}`);
    rs[to] = new W.Reassembler();
  }
}
console.log(JSON.stringify({ got, errors, frames: wire.length, accepted, queued, logs: bus.logs }));
"""

SIZE = 9610  # the parameters of the default digits model (64-128-10): a STATE of 4 frames


def run_driver(**cfg) -> dict:
    return run_js(DRIVER, imports={"{ Mesh }": "shell/mesh.js", "W": "wire/frames.js"}, data={"size": SIZE, **cfg})


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_each_message_arrives_whole_in_order():
    """A restore (restore, STATE, run-like control) to two members at once, as
    RunPeer.restore sends it: every member gets every message, whole, in order."""
    sends = [[p, k] for p in ("p1", "p2") for k in ("restore", "state", "end")]
    out = run_driver(sends=sends, expectFrames=2 * (1 + 4 + 1))
    assert out["errors"] == []
    assert out["frames"] == 12  # the STATE is 4 frames
    for p in ("p1", "p2"):
        assert out["got"][p] == ["restore", "state:true", "end"], out


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_the_queue_of_a_link_that_never_drains_is_bounded():
    """A member whose channel never drains: the queue stops at its limit with a line in the
    run log; the other member is not held up."""
    limit = 600_000  # about two STATEs of this model
    sends = [["slow", "state"]] * 5 + [["p1", "state"], ["p1", "end"]]
    out = run_driver(sends=sends, stuck=["slow"], limit=limit, expectFrames=5)
    assert out["accepted"] == [True, True, False, False, False, True, True], out
    assert 0 < out["queued"]["slow"] <= limit
    assert sum("the send queue to slow holds" in line and "state not sent" in line
               for line in out["logs"]) == 3, out["logs"]
    assert out["got"]["p1"] == ["state:true", "end"] and out["errors"] == []
