"""The run protocol as data (``run_protocol.json``, beside this module): every run message
(wire name, Python class, frame type, fields, the roles that handle it, the JS handler),
every output a role returns, and the constants both languages share. Python reads it here;
JS reads the modules generated from it (``webui/run/protocol_table.js``,
``webui/run/outputs.js``: ``python -m daisychain.engine.js_tables``), so the twins name one
protocol. tests/wire/test_protocol_table.py holds both languages' message classes,
encoders, outputs and dispatch to it.
"""

from __future__ import annotations

import json
from pathlib import Path

PATH = Path(__file__).with_name("run_protocol.json")
TABLE: dict = json.loads(PATH.read_text(encoding="utf-8"))
CONSTANTS: dict = TABLE["constants"]
MESSAGES: list[dict] = TABLE["messages"]
OUTPUTS: list[dict] = TABLE["outputs"]
#: member, coordinator: the driver's role objects; member_ring, coordinator_ring: their ring
#: side (``role.ring``); any: whichever role speaks for the replica (the member serves it)
ROLES = ("member", "coordinator", "member_ring", "coordinator_ring", "any")


def handled_by(role: str) -> frozenset[str]:
    """The messages ``role`` handles, by the Python driver's key (the class name in lower
    case: its handler is ``on_<key>``)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    return frozenset(m["class"].lower() for m in MESSAGES if role in m["roles"])


def wire_name(cls_name: str) -> str:
    """A message class's wire name (``SyncRequest`` -> ``sync``)."""
    return next(m["wire"] for m in MESSAGES if m["class"] == cls_name)
