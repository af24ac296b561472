"""Hostile tier (issue 35, item 5): a peer that lifts its own send limit and sends one
data-channel message far past the maximum this side announced (``a=max-message-size``) is
dropped, and its chunks are not reassembled (aiortc's reassembly costs the square of a
message's size: one 64 MiB frame stalled a room for ~65 s). Two real ``Mesh`` objects in one
process, real ``RTCPeerConnection``s; run in the private network namespace:

    scripts/in-netns.sh .venv/bin/python -m pytest tests/hostile/test_sctp_bound.py -q
"""

from __future__ import annotations

import asyncio

import sys
from pathlib import Path

from daisychain.peer import rtc, sctp_guard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mesh"))
from test_relink import _until, linked_pair  # noqa: E402


def test_a_message_past_the_announced_maximum_drops_its_sender_unassembled():
    rtc.use_loopback_only()

    async def go():
        a, b = await linked_pair()
        try:
            # an honest message at the announced maximum goes through
            at_max = bytes(range(256)) * (sctp_guard.MAX_MESSAGE_SIZE // 256)
            b.mesh.links["a"].channel.send(at_max)
            await _until(lambda: at_max in a.got)
            # the attacker lifts its own limit and sends 4 MiB in one message
            ch = b.mesh.links["a"].channel
            ch.transport._remote_max_message_size = 64 << 20
            ch.send(b"\x07" * (4 << 20))
            await _until(lambda: a.closes == ["b"], timeout=60)
            assert all(len(m) <= sctp_guard.MAX_MESSAGE_SIZE for m in a.got), \
                [len(m) for m in a.got]
        finally:
            await a.mesh.close()
            await b.mesh.close()
    asyncio.run(go())
