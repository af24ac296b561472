"""``daisy-peer`` with two chaos handles, for bench/chaos.py. Otherwise the real daisy-peer,
unchanged (same arguments, same output):

* ``SIGUSR1``: close the data channel to the coordinator (or, for the coordinator, to one
  member), as a network that drops one connection would;
* ``SIGUSR2``: send a burst of malformed frames (bad magic, version, type, chunk counts,
  lengths, meta that is not JSON or not a message, a body that does not decode, a message
  never completed, an oversized frame) to every open link.

Each prints one ``chaos:`` line on stderr saying what it did.

    python bench/chaos_peer.py --server URL --room CODE ...
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import struct
import sys

from daisychain.peer import cli, node as N, rtc
from daisychain.peer import frames as F

LINKS: list = []
NODES: list = []


def _track():
    link_init, node_init, node_main = rtc.Link.__init__, N.Node.__init__, N.Node.main

    def link(self, *a, **k):
        link_init(self, *a, **k)
        LINKS.append(self)

    def node(self, *a, **k):
        node_init(self, *a, **k)
        NODES.append(self)

    async def main(self):
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, close_one)
        loop.add_signal_handler(signal.SIGUSR2, garbage)
        return await node_main(self)

    rtc.Link.__init__, N.Node.__init__, N.Node.main = link, node, main


def say(text: str) -> None:
    print(f"chaos: {text}", file=sys.stderr, flush=True)


def open_links() -> list:
    return [l for l in LINKS if l.opened and not l.closed and l.channel is not None
            and l.channel.readyState == "open"]


def close_one() -> None:
    links = open_links()
    if not links:
        say("no open data channel to close")
        return
    run = NODES[0].run if NODES else None
    coord = getattr(run, "coord", None) or getattr(run, "host", None)
    pick = next((l for l in links if l.peer == coord), None) or random.choice(links)
    say(f"closing the data channel to {pick.peer}")
    pick.channel.close()


def _frame(type_: int, run_id: str, payload: bytes, *, magic=F.MAGIC, version=F.VERSION,
           index=0, count=1, length=None, codec=0, step=0) -> bytes:
    rid = bytes.fromhex(run_id) if run_id else bytes(8)
    return F.HEADER.pack(magic, version, type_, rid, step, random.getrandbits(32), F.WHOLE,
                         codec, 0, index, count, len(payload) if length is None else length) + payload


def _meta(obj_or_bytes) -> bytes:
    raw = obj_or_bytes if isinstance(obj_or_bytes, bytes) else json.dumps(obj_or_bytes).encode()
    return struct.pack("<I", len(raw)) + raw


def garbage_frames(run_id: str, step: int) -> list[bytes]:
    ctl, contrib = int(F.FrameType.CONTROL), int(F.FrameType.CONTRIB)
    return [
        os.urandom(50),                                             # noise
        os.urandom(20),                                             # shorter than a header
        _frame(ctl, run_id, _meta({"t": "end"}), magic=b"XX"),      # bad magic
        _frame(ctl, run_id, _meta({"t": "end"}), version=99),       # another version
        _frame(9, run_id, _meta({"t": "end"})),                     # unknown type
        _frame(ctl, run_id, _meta({"t": "end"}), count=0xFFFFFFFF),  # a 4-billion-chunk message
        _frame(ctl, run_id, _meta({"t": "end"}), index=5, count=2),  # chunk past the count
        _frame(ctl, run_id, _meta({"t": "end"}), length=60000),     # length past the payload
        _frame(ctl, run_id, _meta(b"{not json")),                   # meta that is not JSON
        _frame(ctl, run_id, struct.pack("<I", 1 << 30) + b"{}"),    # meta length past the end
        _frame(ctl, run_id, _meta({"t": "nonsense"})),              # an unknown message
        _frame(ctl, run_id, _meta({"t": "assign", "term": "x", "tasks": 5}), step=step),
        _frame(ctl, run_id, _meta({"t": "total", "term": 1}), step=step),
        _frame(contrib, run_id, _meta({"term": 1, "task": 0, "micro": [0], "loss": 0.1,
                                       "correct": 1}) + os.urandom(64), codec=7, step=step),
        _frame(ctl, run_id, _meta({"t": "end"}), index=0, count=3),  # never completed
        _frame(ctl, run_id, os.urandom(F.MAX_FRAME + 1000)),       # over the frame limit
        _frame(ctl, run_id, _meta([1, 2, 3])),                      # meta not an object
    ]


def garbage() -> None:
    node = NODES[0] if NODES else None
    run = node.run if node else None
    run_id = getattr(run, "run_id", "") or ""
    frames = garbage_frames(run_id, int(getattr(run, "step", 0) or 0))
    sent = 0
    for link in open_links():
        for f in frames:
            try:
                link.channel.send(f)
                sent += 1
            except Exception as exc:  # noqa: BLE001 - a channel that refuses is fine
                say(f"{link.peer} refused a frame: {exc}")
    say(f"sent {sent} malformed frames to {len(open_links())} peers")


if __name__ == "__main__":
    _track()
    sys.exit(cli.main(sys.argv[1:]))
