"""links.js, the checks on what other members report about their links (it arrives through
the signaling server from anyone in the room): only members' ids, only known states, finite
sane round-trip times, well-formed hash reports; anything else is dropped, never thrown.
Run in Node against hostile payloads; LinkMatrix keeps rows to the room's members."""

from __future__ import annotations

import pytest

from jsrun import run_js

pytestmark = pytest.mark.usefixtures("node")  # fails, never skips, without node
A, B, C = "aaaaaaaa", "bbbbbbbb", "cccccccc"
SHA = "ab" * 32

CASES = [
    # (payload, sender, expected parse result)
    ({"type": "links", "v": 1, "rows": {B: {"state": "open", "rttMs": 1.5}}}, A,
     {"rows": {B: {"state": "open", "rttMs": 1.5}}, "report": None}),
    # a stranger's id, the sender's own id, an unknown state, a non-object row: dropped
    ({"type": "links", "rows": {"zzzzzzzz": {"state": "open"}, A: {"state": "open"},
                                B: {"state": "hacked"}, C: 5}}, A, {"rows": {}, "report": None}),
    # round-trip times that are no finite, sane number become null
    ({"type": "links", "rows": {B: {"state": "failed", "rttMs": "12"}, C: {"state": "new", "rttMs": -1}}}, A,
     {"rows": {B: {"state": "failed", "rttMs": None}, C: {"state": "new", "rttMs": None}}, "report": None}),
    ({"type": "links", "rows": {B: {"state": "open", "rttMs": 0}}}, A,  # rttMs: Infinity, set in JS
     {"rows": {B: {"state": "open", "rttMs": None}}, "report": None}),
    # reports: only whole, well-formed ones
    ({"type": "links", "rows": {}, "report": {"runId": "0123456789abcdef", "step": 7, "sha": SHA}}, A,
     {"rows": {}, "report": {"runId": "0123456789abcdef", "step": 7, "sha": SHA}}),
    ({"type": "links", "rows": {}, "report": {"runId": "0123456789abcdef", "step": 7.5, "sha": SHA}}, A,
     {"rows": {}, "report": None}),
    ({"type": "links", "rows": {}, "report": {"runId": "x", "step": 7, "sha": "<script>"}}, A,
     {"rows": {}, "report": None}),
    # not a links payload at all, or from someone not in the room
    ({"type": "other"}, A, None), ([1, 2], A, None), (None, A, None), ("links", A, None),
    ({"type": "links", "rows": {B: {"state": "open"}}}, "dddddddd", None),
    ({"type": "links", "rows": [{"state": "open"}]}, A, {"rows": {}, "report": None}),
    ({"type": "links", "rows": {"__proto__": {"state": "open"}}}, A, {"rows": {}, "report": None}),
]


def _node(body: str):
    return run_js(body, imports={"L": "wire/links.js"}, data=[[c[0], c[1]] for c in CASES])


def test_hostile_link_reports_are_dropped():
    got = _node(f"""
const cases = DATA;
cases[3][0].rows.{B}.rttMs = Infinity;   // JSON cannot say it; a parsed 1e999 would be
console.log(JSON.stringify(cases.map(([d, s]) => L.parseLinks(d, s, ["{A}", "{B}", "{C}"]))));
""")
    assert got == [c[2] for c in CASES]


def test_matrix_keeps_members_and_drops_stale_rows():
    got = _node(f"""
const m = new L.LinkMatrix();
m.setMembers(["{A}", "{B}", "{C}"]);
m.setOwn("{A}", {{ "{B}": {{ state: "open", rttMs: 2 }} }}, 0);
const took = [m.receive("{B}", {{ type: "links", rows: {{ "{A}": {{ state: "open", rttMs: 3 }} }} }}, 0),
              m.receive("{C}", {{ type: "links", rows: {{ "{A}": {{ state: "connecting" }} }},
                                 report: {{ runId: "0123456789abcdef", step: 2, sha: "{SHA}" }} }}, 5),
              m.receive("eeeeeeee", {{ type: "links", rows: {{}} }}, 5)];
const v1 = m.view(6);
m.setMembers(["{A}", "{C}"]);          // B left the room
const v2 = m.view(12);                 // A's own row and B's are older than STALE_S
console.log(JSON.stringify({{ took, v1, v2, payload: L.linksPayload({{ "{B}": {{ state: "open", rttMs: 1.234 }} }}) }}));
""")
    assert got["took"] == [True, True, False]
    assert got["v1"]["matrix"] == {A: {B: {"state": "open", "rttMs": 2}}, B: {A: {"state": "open", "rttMs": 3}},
                                   C: {A: {"state": "connecting", "rttMs": None}}}
    assert got["v1"]["reports"] == {C: {"runId": "0123456789abcdef", "step": 2, "sha": SHA}}
    assert got["v2"]["members"] == [A, C] and list(got["v2"]["matrix"]) == [C]
    assert got["payload"] == {"type": "links", "v": 1, "rows": {B: {"state": "open", "rttMs": 1.2}}}
