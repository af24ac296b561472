"""The run protocol as data (daisychain/peer/run_protocol.json): both languages' message
classes and encoders, the drivers' dispatch, the outputs and the shared constants are what
the table says. A message, output or constant added in one language only fails here."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import numpy as np
import pytest

from daisychain.engine import spec as engine_spec
from daisychain.peer import frames as F
from daisychain.peer import protocol_table as P
from daisychain.peer.run import driver, outputs
from daisychain.peer.run.coordinator import Coordinator
from daisychain.peer.run.member import Member
from daisychain.peer.run.ring_roles import RingCoordinator, RingMember
from tests.jsrun import run_js

WEBUI = Path(__file__).resolve().parents[2] / "daisychain" / "webui"
RUN_ID = "0123456789abcdef"
SIZE = 3  #: the parameter count of the samples' integer and float vectors

#: one valid value of each field type of the table (field_types), as Python holds it
SAMPLES = {
    "object": {"task": "digits"}, "hex16": "fedcba9876543210", "uint": 3, "hex64": "ab" * 32,
    "peer": "p1", "rate": 0.25, "strikes": 4, "peers": ("p2",), "capacity": 2.5, "kind": "cpu",
    "texts": ("one reason",), "tasks": (F.Task(0, "p1", (0, 2)),), "text": "a reason",
    "micro": (0, 1), "number": 0.5, "ints": np.array([1, -2, 3], np.int64),
    "contributors": (("p1", 2),), "floats": np.array([0.5, -1.0, 2.0]), "bytes": b"abc",
    "ring_peers": ("p1", "p2"), "phase": 1,
}
#: the role objects that hold each role's handlers (Python on_<key>, JS the table's name)
PY_ROLES = {"member": [Member], "coordinator": [Coordinator], "member_ring": [RingMember],
            "coordinator_ring": [RingCoordinator], "any": [Member]}
JS_ROLES = {"member": "Member", "coordinator": "Coordinator", "member_ring": "RingMember",
            "coordinator_ring": "RingCoordinator", "any": "Member"}


def _sample(msg: dict):
    types = P.TABLE["field_types"]
    return getattr(F, msg["class"])(**{f: SAMPLES[types[f]] for f in msg["fields"]})


def test_the_table_is_well_formed():
    types = P.TABLE["field_types"]
    assert len({m["wire"] for m in P.MESSAGES}) == len({m["class"] for m in P.MESSAGES}) == len(P.MESSAGES)
    for m in P.MESSAGES:
        assert set(m["roles"]) <= set(P.ROLES), m
        assert all(f in types for f in m["fields"]), m
        assert m["frame"] in F.FrameType.__members__, m
    assert set(types.values()) == set(SAMPLES)
    assert len({o["kind"] for o in P.OUTPUTS}) == len(P.OUTPUTS)


@pytest.mark.parametrize("wire", [m["wire"] for m in P.MESSAGES])
def test_each_python_message_class_and_encoder_is_the_tables(wire):
    m = next(x for x in P.MESSAGES if x["wire"] == wire)
    cls = getattr(F, m["class"])
    names = [f.name for f in dataclasses.fields(cls)]
    assert [n for n in names if n not in m.get("py_only", ())] == m["fields"]
    if m["frame"] == "CONTROL" or m["frame"] == "RING":
        assert cls.T == wire
    msg = _sample(m)
    wire_msg = F.to_message(msg, RUN_ID)
    assert wire_msg.type == F.FrameType[m["frame"]]
    if m["frame"] == "CONTROL":
        assert wire_msg.meta["t"] == wire
    back = F.from_message(wire_msg, SIZE)
    assert type(back) is cls and back == msg


def test_python_controls_and_message_union_are_the_tables():
    assert F.CONTROLS == tuple(getattr(F, m["class"]) for m in P.MESSAGES if m["frame"] == "CONTROL")
    assert set(typing.get_args(F.RunMessage)) == {getattr(F, m["class"]) for m in P.MESSAGES}


def test_the_python_driver_dispatches_by_the_table():
    assert driver.MEMBER_MESSAGES == P.handled_by("member") and "assign" in driver.MEMBER_MESSAGES
    assert driver.COORDINATOR_MESSAGES == P.handled_by("coordinator")
    assert driver.MEMBER_RING_MESSAGES == P.handled_by("member_ring")
    assert driver.COORDINATOR_RING_MESSAGES == P.handled_by("coordinator_ring")
    for role, classes in PY_ROLES.items():
        for key in P.handled_by(role):
            assert any(callable(getattr(c, "on_" + key, None)) for c in classes), (role, key)
    with pytest.raises(ValueError, match="unknown role"):
        P.handled_by("referee")


def test_python_outputs_are_the_tables():
    classes = [o for o in P.OUTPUTS if o["class"]]
    assert set(typing.get_args(outputs.Output)) == {getattr(outputs, o["class"]) for o in classes}
    for o in classes:
        fields = dataclasses.fields(getattr(outputs, o["class"]))
        assert [f.name for f in fields] == o["fields"], o
        dflt = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
        assert dflt == o.get("defaults", {}), o


def test_python_constants_are_the_tables():
    c = P.CONSTANTS
    assert (F.MAX_STRIKES, F.MAX_RING) == (c["MAX_STRIKES"], c["MAX_RING"])
    assert (driver.VERIFY_RATE, driver.STRIKES, driver.REFUSAL_LINES) == (
        c["VERIFY_RATE"], c["STRIKES"], c["REFUSAL_LINES"])
    assert (engine_spec.MIN_CAPACITY, engine_spec.MAX_CAPACITY) == (c["MIN_CAPACITY"], c["MAX_CAPACITY"])
    for capacity, ok in ((c["MIN_CAPACITY"], True), (c["MAX_CAPACITY"], True),
                         (c["MIN_CAPACITY"] / 2, False), (c["MAX_CAPACITY"] * 2, False)):
        m = F.to_message(F.Ready(1, capacity, "cpu", 0, "ab" * 32), RUN_ID)
        if ok:
            assert F.from_message(m).capacity == capacity
        else:
            with pytest.raises(F.FrameError, match="capacity"):
                F.from_message(m)


def _js(name: str) -> Path:
    """A page module by its file name, wherever its folder (webui/ or a subfolder)."""
    (path,) = (p for p in WEBUI.rglob(name) if "node_modules" not in p.parts)
    return path


def _js_sample(msg: dict) -> dict:
    types = P.TABLE["field_types"]
    out = {"T": msg["wire"]}
    for f in msg["fields"]:
        v = SAMPLES[types[f]]
        if isinstance(v, np.ndarray):
            v = v.tolist()
        elif isinstance(v, bytes):
            v = list(v)
        elif types[f] == "tasks":
            v = [{"task": t.task, "peer": t.peer, "micro": list(t.micro)} for t in v]
        elif isinstance(v, tuple):
            v = [list(x) if isinstance(x, tuple) else x for x in v]
        out[f] = v
    return out


def test_the_js_encoders_drivers_outputs_and_constants_are_the_tables():
    """messages.js encodes and decodes each message of the table under its wire name with
    the table's fields; driver.js dispatches each to a handler its role has; outputs.js
    builds each output kind with its fields; the shared constants are the table's."""
    data = {"messages": [{**m, "sample": _js_sample(m), "types": P.TABLE["field_types"]} for m in P.MESSAGES],
            "outputs": P.OUTPUTS, "roles": JS_ROLES, "run_id": RUN_ID, "size": SIZE}
    got = run_js(r"""
const out = { messages: {}, handlers: [], outputs: {}, constants: {} };
for (const m of DATA.messages) {
  const msg = { ...m.sample };
  for (const f of m.fields) {
    if (m.types[f] === "ints" || m.types[f] === "floats") msg[f] = Float64Array.from(msg[f]);
    if (m.types[f] === "bytes") msg[f] = Uint8Array.from(msg[f]);
  }
  const frames = W.encode(msg, DATA.run_id, null, () => 7);
  const R = new W.Reassembler();
  let whole = null;
  for (const f of frames) whole = R.feed(f) ?? whole;
  const back = await W.fromMessage(whole, DATA.size);
  out.messages[m.wire] = { T: back.T, keys: Object.keys(back).filter((k) => k !== "T").sort(),
    type: Object.keys(W.FrameType).find((k) => W.FrameType[k] === whole.type), t: whole.meta.t ?? null };
}
const roles = { Member: Member.prototype, Coordinator: Coordinator.prototype,
  RingMember: RM.RingMember.prototype, RingCoordinator: RM.RingCoordinator.prototype };
for (const [role, cls] of Object.entries(DATA.roles)) {
  for (const [wire, handler] of Object.entries(T.dispatch(role))) {
    out.handlers.push([role, wire, handler, typeof roles[cls][handler] === "function"]);
  }
}
for (const o of DATA.outputs) {
  const name = (o.class || o.kind)[0].toLowerCase() + (o.class || o.kind).slice(1);
  out.outputs[o.kind] = typeof O[name] === "function" ? O[name](...o.fields.map((f) => `<${f}>`)) : null;
}
// a ready's capacity: the table's range is what messages.js takes
const ready = (capacity) => ({ T: "ready", term: 1, capacity, kind: "cpu", step: 0, params_sha256: "ab".repeat(32) });
const takes = async (capacity, msg = ready(capacity)) => {
  const R = new W.Reassembler();
  let whole = null;
  for (const f of W.encode(msg, DATA.run_id, null, () => 7)) whole = R.feed(f) ?? whole;
  try { await W.fromMessage(whole, DATA.size); return true; } catch (err) { return false; }
};
const { MIN_CAPACITY: lo, MAX_CAPACITY: hi } = T.CONSTANTS;
out.capacity = [await takes(lo), await takes(hi), await takes(lo / 2), await takes(hi * 2)];
// a run's strikes: 1 to MAX_STRIKES
const run = DATA.messages.find((m) => m.wire === "run").sample;
const strikes = (n) => takes(0, { ...run, strikes: n });
out.strikes = [await strikes(T.CONSTANTS.MAX_STRIKES), await strikes(T.CONSTANTS.MAX_STRIKES + 1)];
out.constants = { table: T.CONSTANTS, VERIFY_RATE: D.VERIFY_RATE, STRIKES: D.STRIKES, MAX_STRIKES: D.MAX_STRIKES,
  REFUSAL_LINES: D.REFUSAL_LINES, MAX_RING: W.MAX_RING };
console.log(JSON.stringify(out));
""", imports={"W": _js("frames.js"), "T": "run/protocol_table.js", "O": "run/outputs.js", "D": "run/driver.js",
              "{ Member }": "run/member.js", "{ Coordinator }": "run/coordinator.js", "RM": "run/ring_roles.js"},
        data=data)
    for m in P.MESSAGES:
        g = got["messages"][m["wire"]]
        assert g["T"] == m["wire"] and g["type"] == m["frame"], (m["wire"], g)
        assert g["t"] == (m["wire"] if m["frame"] == "CONTROL" else None)
        # a JS control message also carries its frame header's step (0 where it has none)
        want = set(m["fields"]) | ({"step"} if m["frame"] == "CONTROL" else set())
        assert g["keys"] == sorted(want), (m["wire"], g["keys"])
    assert got["handlers"] and all(ok for *_, ok in got["handlers"]), [h for h in got["handlers"] if not h[3]]
    assert {(r, w) for r, w, *_ in got["handlers"]} == {(r, m["wire"]) for m in P.MESSAGES for r in m["roles"]}
    for o in P.OUTPUTS:
        ren = o.get("js_fields", {})
        assert got["outputs"][o["kind"]] == {"kind": o["kind"], **{ren.get(f, f): f"<{f}>" for f in o["fields"]}}
    assert got["capacity"] == [True, True, False, False]
    assert got["strikes"] == [True, False]
    c = got["constants"]
    assert c.pop("table") == P.CONSTANTS
    assert c == {k: P.CONSTANTS[k] for k in c}


#: an object literal that names its kind: ``{ kind: "compute", ... }``, ``"kind": 'alarm'``
_LITERAL = re.compile(r"""(\{\s*)?["']?\bkind["']?\s*:\s*["'`](\w+)["'`]""")


def _output_literals(text: str) -> list[str]:
    """The outputs that `text` builds as object literals: each ``kind: "..."`` that opens a
    literal or names an output kind of the table."""
    kinds = {o["kind"] for o in P.OUTPUTS}
    return [m.group(2) for m in _LITERAL.finditer(text) if m.group(1) or m.group(2) in kinds]


def _role_files() -> list[Path]:
    return [p for p in sorted((WEBUI / "run").glob("*.js")) if p.name not in ("outputs.js", "protocol_table.js")]


def test_the_js_roles_build_outputs_with_the_tables_constructors():
    """A run role under webui/run/ builds each output with its constructor from outputs.js
    (generated from the table), never as an object literal that could drop or misname a field
    the Python twin has."""
    found = [f"{p.name}: {k}" for p in _role_files() for k in _output_literals(p.read_text())]
    assert not found, f"outputs built as literals (use outputs.js): {found}"
    imported = set()
    for p in _role_files():
        for names in re.findall(r'import\s*\{([^}]*)\}\s*from\s*"\./outputs\.js"', p.read_text()):
            imported |= {n.split(" as ")[0].strip() for n in names.split(",")}
    # the scan reads the roles: they take the constructors from outputs.js
    assert {"compute", "committed", "alarm", "ended", "restored", "refused", "removed"} <= imported, imported


def test_the_output_literal_scan_catches_a_planted_literal():
    member = (WEBUI / "run" / "member.js").read_text()
    assert "joined()" in member and _output_literals(member) == []
    assert _output_literals(member.replace("joined()", '{ kind: "joined" }', 1)) == ["joined"]
    assert _output_literals('out.push({ "kind": \'alarm\', alarm, peer });') == ["alarm"]
    assert _output_literals('return [{kind:"handover", host}];') == ["handover"]  # not a table kind
    assert _output_literals("return { T: \"ready\", kind: this.peer.kind };") == []
    assert _output_literals('[compute(step, t.task, t.micro, theta, term), send(p, msg)]') == []
