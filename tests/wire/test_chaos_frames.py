"""Unit tier: the malformed frames of ``bench/chaos.py``'s garbage trial (``chaos_peer``'s
own list: noise, bad header fields, impossible chunking, bad meta, unknown codec, ...) fed
through the peer's real receive path (``Node._on_message``: reassembler, decoder, run state
machine) of a coordinator, from a member of its run. Each gets a named refusal, none raises,
the sender is removed after the run's strikes, and another member's messages still work."""

from __future__ import annotations

import logging

import pytest

from daisychain.engine.trainer import Trainer
from daisychain.peer import frames as F
from daisychain.peer import run as R
from daisychain.peer.node import Node, NodeOptions
from daisychain.peer.rtc import Mesh
from daisychain.units import load_luts

from bench.chaos_peer import garbage_frames
from run_net import settings


@pytest.fixture
def coordinator():
    rs = settings()
    events = []
    node = Node(NodeOptions(server="http://127.0.0.1:9", on_event=lambda e, n: events.append(e)))
    node.me = "host"

    async def signal(*a):
        pass
    node.mesh = Mesh("host", signal, node._on_open, node._on_message, node._on_close)
    node.run = R.RunPeer("host", trainer=Trainer(rs.spec, rs.hp, rs.ds, load_luts()),
                         steps=rs.steps, capacity=1.0, wait_peers=5, verify_rate=0.0)
    node._feed(node.run.room_changed(["host", "m1", "m2"], "host"))
    node._feed(node.run.start(0.0))
    for m in ("m1", "m2"):
        node._on_open(m)
    return node, events


def _ready_frames(node, term=None):
    run = node.run
    msg = F.to_message(F.Ready(term or run.term, 5.0, "python", run.step, run.member.sha()),
                       run.run_id, run.bounds)
    return F.encode_frames(msg, 1)


def test_garbage_frames_are_refused_by_name_and_the_sender_removed(coordinator, caplog):
    node, events = coordinator
    for f in _ready_frames(node):
        node._on_message("m1", f)
    assert node.run.coordinator.members["m1"].ready
    frames = garbage_frames(node.run.run_id, node.run.step)
    with caplog.at_level(logging.INFO, "daisychain.peer"):
        for f in frames:
            node._on_message("m1", f)
        for f in _ready_frames(node):  # another member's messages are untouched
            node._on_message("m2", f)
    texts = [e.text for e in events if isinstance(e, R.Log)]
    refusals = [t for t in texts if t.startswith("refused a message from m1: ")]
    # every frame but the first chunk of the message never completed (refused when the
    # next frame cuts it off) gets its own refusal
    assert len(refusals) >= len(frames) - 1, texts
    assert not any("internal error" in r.getMessage() for r in caplog.records)
    alarms = [e for e in events if isinstance(e, R.Alarm)]
    assert [a.kind for a in alarms] == ["refused"] * node.run.strikes + ["removed"]
    assert all(a.peer == "m1" for a in alarms)
    assert "m1" in node.run.coordinator.banned and "m1" not in node.run.coordinator.members
    assert node.run.coordinator.members["m2"].ready and node.run.step == 0


def test_a_flood_of_bad_frames_costs_a_bounded_number_of_lines(coordinator):
    """Issue 35: 20,000 small frames froze a tab for 3-5 s (a refusal line each). A sender's
    first max(REFUSAL_LINES, strikes) bad messages are refused by name (the last says the rest
    go unlogged), the rest are dropped without a line; other members are untouched."""
    node, events = coordinator
    for f in _ready_frames(node):
        node._on_message("m1", f)
    bad = F.encode_frames(F.Message(F.FrameType.CONTROL, node.run.run_id, 0, {"t": "nonsense"}), 1)
    for _ in range(20_000):
        node._on_message("m1", bad[0])
    texts = [e.text for e in events if isinstance(e, R.Log) and "from m1" in e.text]
    limit = max(R.driver.REFUSAL_LINES, node.run.strikes)
    refusals = [t for t in texts if t.startswith("refused a message from m1")]
    assert len(refusals) == limit, texts[-5:]
    assert f"dropped without a line ({limit} refused)" in refusals[-1]
    assert "m1" in node.run.coordinator.banned
    for f in _ready_frames(node):
        node._on_message("m2", f)
    assert node.run.coordinator.members["m2"].ready
