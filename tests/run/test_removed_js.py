"""Unit tier, in node: a tab member that its coordinator removes from the run (a `refuse`
from the coordinator, webui/run/member.js) stops following it and the tab's shell
(webui/shell/mesh.js) reports why as a run error, which the page shows (app.js `run:error`:
the run-error box and the status line). The real RunPeer and Mesh; the network is a stub."""

from __future__ import annotations

import pytest

from jsrun import run_js

DRIVER = r"""
const errors = [];
const bus = { on() {}, emit(ev, x) { if (ev === "run:error") errors.push(x.message); } };
const mesh = new Mesh(bus, { async send() {} }, { kind: "cpu", capacity: 1 });
clearInterval(mesh.timer);
const peer = new RunPeer("p1", {});
Object.assign(peer.member, { coord: "p0", term: 1, run: { run_id: "0".repeat(16) } });
mesh.peer = peer;
const why = ["3 strikes (the last: spot-check mismatch: p1 sent a wrong contribution)"];
const stranger = await peer.receive("p9", { T: "refuse", term: 1, reasons: why });
const outs = await peer.receive("p0", { T: "refuse", term: 1, reasons: why });
await mesh._perform(outs);
const after = await peer.receive("p0", { T: "assign", term: 1, step: 0, tasks: [{ task: 0, peer: "p1", micro: [0] }] });
console.log(JSON.stringify({ stranger, kinds: outs.map((o) => o.kind), errors, refused: peer.refused, after }));
"""


@pytest.mark.usefixtures("node")  # fails, never skips, without node
def test_a_removed_tab_stops_and_says_why():
    out = run_js(DRIVER, imports={"{ Mesh }": "shell/mesh.js", "{ RunPeer }": "run/index.js"})
    assert out["stranger"] == []  # only the coordinator it follows can remove it
    assert out["kinds"] == ["log", "removed"] and out["refused"] is True
    assert out["errors"] == ["removed from the run by p0: 3 strikes (the last: spot-check mismatch: "
                             "p1 sent a wrong contribution)"]
    assert out["after"] == []  # no more work once removed
