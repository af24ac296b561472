"""daisy-peer's part in the room's connectivity matrix (the page's ``room:links``): about once
a second it tells the room the state of its own direct links, through the signaling server's
``broadcast``, in the payload the page's ``webui/wire/links.js`` reads::

    {"type": "links", "v": 1, "rows": {peer: {"state": s, "rttMs": null}},
     "report": {"runId": ..., "step": n, "sha": hex}}

``state`` is ``new`` | ``connecting`` | ``open`` | ``failed`` | ``closed``; aiortc measures no
candidate-pair round-trip time, so ``rttMs`` is null. ``report`` is this replica's params hash
at its step (the page's "hash agrees" column); it is left out for models over
``REPORT_MAX_PARAMS`` parameters (hashing them every second would cost too much).

The node calls :meth:`LinkReporter.tick` from its tick loop; nothing here raises into it.
"""

from __future__ import annotations

import logging
import time

from daisychain import signaling as p

log = logging.getLogger("daisychain.peer.links")

EVERY_S = 1.0
MAX_ROWS = 128
SHARED_MEMBERS = 32  #: larger rooms share no links (n members cost the server n^2 relays a second)
REPORT_MAX_PARAMS = 4_000_000
STATES = ("new", "connecting", "open", "failed", "closed")


def link_state(link) -> str:
    """The contract state of one rtc.Link (or of no link: ``new``)."""
    if link is None:
        return "new"
    if link.closed:
        return "closed"
    ch = link.channel
    if link.opened and ch is not None and ch.readyState == "open":
        return "open"
    state = link.pc.connectionState
    return state if state in ("new", "failed", "closed") else "connecting"


class LinkReporter:
    def __init__(self, every_s: float = EVERY_S):
        self.every_s = every_s
        self.last = 0.0
        self._hashed: tuple[str, int, str] | None = None  # (run id, step, sha)

    def payload(self, node) -> dict | None:
        """The links payload of ``node`` now, or None outside a room with others."""
        others = [m for m in node.members if m != node.me][:MAX_ROWS]
        if not others or node.mesh is None or len(node.members) > SHARED_MEMBERS:
            return None
        rows = {m: {"state": link_state(node.mesh.links.get(m)), "rttMs": None} for m in others}
        out = {"type": "links", "v": 1, "rows": rows}
        report = self._report(node.run)
        if report:
            out["report"] = report
        return out

    def _report(self, run) -> dict | None:
        tr = getattr(run, "trainer", None) if run is not None else None
        if tr is None or not run.run_id or tr.state.theta.size > REPORT_MAX_PARAMS:
            return None
        key = (run.run_id, run.step)
        if self._hashed is None or self._hashed[:2] != key:
            self._hashed = (*key, tr.params_sha256())
        return {"runId": self._hashed[0], "step": self._hashed[1], "sha": self._hashed[2]}

    async def tick(self, node, now: float | None = None) -> None:
        """Send the payload if a second has passed since the last one."""
        now = time.monotonic() if now is None else now
        if now - self.last < self.every_s or node.client is None:
            return
        self.last = now
        try:
            data = self.payload(node)
            if data is not None:
                await node.client.send(p.Broadcast(data=data))
        except Exception as exc:  # noqa: BLE001 - a report is never worth the run
            log.debug("links report not sent: %s", exc)
