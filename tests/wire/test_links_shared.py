"""links.py and links.js, one shared case file (tests/data/links_cases.json): the link states,
the payload daisy-peer sends and the one a tab sends for the same room, byte for byte as
compact JSON, and that a tab takes every payload daisy-peer sends whole. The Python side runs
``LinkReporter.payload`` on a node described by the case (its members, links and run are plain
data: the reporter reads nothing else); the JS side runs links.js (and network.js's room limit)
in node."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from daisychain.peer import links
from jsrun import run_js

CASES = json.loads((Path(__file__).parents[1] / "data" / "links_cases.json").read_text())


def compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def py_link(connection_state, channel_open: bool, closed: bool):
    """The parts of an rtc.Link that link_state reads; None: no link yet."""
    if connection_state is None:
        return None
    channel = SimpleNamespace(readyState="open" if channel_open else "connecting")
    return SimpleNamespace(closed=closed, opened=channel_open, channel=channel,
                           pc=SimpleNamespace(connectionState=connection_state))


def py_node(case):
    """The parts of a daisy-peer Node that LinkReporter.payload reads."""
    run = None
    rep = case["report"]
    if rep is not None:
        trainer = SimpleNamespace(state=SimpleNamespace(theta=np.broadcast_to(0.0, (rep["params"],))),
                                  params_sha256=lambda: rep["sha"])
        run = SimpleNamespace(trainer=trainer, run_id=rep["runId"], step=rep["step"])
    mesh = SimpleNamespace(links={m: py_link(*s) for m, s in case["links"].items()})
    return SimpleNamespace(me=case["me"], members=case["members"], mesh=mesh, run=run, client=None)


def test_python_constants_are_the_cases():
    c = CASES["constants"]
    assert list(links.STATES) == c["states"]
    assert links.MAX_ROWS == c["max_row"] and links.SHARED_MEMBERS == c["shared_members"]


@pytest.mark.parametrize("cs, channel_open, closed, want", CASES["link_state"])
def test_python_link_state(cs, channel_open, closed, want):
    assert links.link_state(py_link(cs, channel_open, closed)) == want


@pytest.mark.parametrize("case", CASES["payload"], ids=[c["about"] for c in CASES["payload"]])
def test_python_payload_is_the_cases(case):
    got = links.LinkReporter().payload(py_node(case))
    assert compact(got) == compact(case["want"])


JS_SIDE = r"""
const out = { constants: { states: [...L.LINK_STATES], max_row: L.MAX_ROW,
                           shared_members: N.LINKS_SHARED_MEMBERS },
              linkState: [], payload: [], parsed: [] };
// network.js's Link.state: closed, else links.js's linkState
for (const [cs, open, closed] of DATA.link_state)
  out.linkState.push(cs === null ? "new" : closed ? "closed" : L.linkState(cs, open));
for (const c of DATA.payload) {
  // network.js's reportLinks: this tab's rows of the others, shared while the room is small
  const others = c.members.filter((id) => id !== c.me);
  const own = Object.fromEntries(others.map((id) => {
    const l = c.links[id];
    const state = l === undefined ? "new" : l[2] ? "closed" : L.linkState(l[0], l[1]);
    return [id, { state, rttMs: null }];
  }));
  const report = c.report && { runId: c.report.runId, step: c.report.step, sha: c.report.sha };
  const sent = others.length && c.members.length <= N.LINKS_SHARED_MEMBERS ? L.linksPayload(own, report) : null;
  out.payload.push(JSON.stringify(sent));
  out.parsed.push(c.want === null ? null : L.parseLinks(c.want, c.me, c.members));
}
console.log(JSON.stringify(out));
"""


@pytest.fixture(scope="module")
def js():
    """The JS side of every case, in one node run (fails, never skips, without node)."""
    return run_js(JS_SIDE, imports={"L": "wire/links.js", "N": "shell/network.js"}, data=CASES)


def test_js_constants_are_the_cases(js):
    assert js["constants"] == CASES["constants"]


def test_js_link_state(js):
    assert js["linkState"] == [c[3] for c in CASES["link_state"]]


def test_js_payload_is_the_cases_byte_for_byte(js):
    assert js["payload"] == [compact(c.get("tab_want", c["want"])) for c in CASES["payload"]]


def test_a_tab_takes_every_payload_daisy_peer_sends_whole(js):
    want = [None if c["want"] is None else {"rows": c["want"]["rows"], "report": c["want"].get("report")}
            for c in CASES["payload"]]
    assert js["parsed"] == want
