"""Mesh tier: a hostile member of the room (an approved device that speaks the signaling
protocol by hand) sends the peers of a real run what no browser would: offers and answers
whose SDP aiortc cannot take, answers nobody asked for, ICE candidates that are not
candidates. The server relays them (each is well-formed signaling); the peers must refuse
each by name and train on to the reference hash.

    scripts/in-netns.sh .venv/bin/python -m pytest tests/mesh/test_hostile_member.py -q
"""

from __future__ import annotations

import asyncio
import json
import threading

import aiohttp

from .test_mesh import host, peers, reference, server  # noqa: F401 (fixtures)

STEPS = 60
# SDPs that make aiortc raise (ValueError: no ICE credentials; a media section that is not
# WebRTC's; candidate lines that are not candidates) and plain noise
BAD_SDP = [
    "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=application 9 UDP/DTLS/SCTP "
    "webrtc-datachannel\r\n",
    "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=application 9 UDP/DTLS/SCTP "
    "webrtc-datachannel\r\nc=IN IP4 0.0.0.0\r\na=ice-ufrag:abcd\r\na=ice-pwd:"
    "abcdefghijklmnopqrstuvwx\r\na=fingerprint:sha-256 00\r\na=candidate:1 1 udp\r\n",
    "v=0\r\nm=audio 9 RTP/AVP 0\r\n",
    "garbage",
    "",
]
BAD_CANDIDATES = [{"candidate": "candidate:garbage", "sdpMid": "0", "sdpMLineIndex": 0},
                  {"candidate": "candidate:1 1 udp 1 10.77.0.1 notaport typ host"},
                  {"candidate": "x" * 200}]


class Hostile:
    """An approved member on its own thread and loop: joins the room, then on ``attack()``
    sends every bad offer, answer and candidate to each other member."""

    def __init__(self, url: str, code: str):
        self.url, self.code = url, code
        self.loop = asyncio.new_event_loop()
        self.members: list[str] = []
        self.me = None
        self.sent = 0
        self.ready = threading.Event()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._join(), self.loop).result(60)

    async def _join(self):
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(self.url.replace("http", "ws") + "/ws")
        await self.ws.send_str(json.dumps({"type": "hello", "version": 1, "name": "mallory",
                                           "kind": "cpu", "capacity": 1, "room": self.code}))
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self):
        async for m in self.ws:
            msg = json.loads(m.data)
            if msg["type"] == "welcome":
                self.me = msg["id"]
            elif msg["type"] == "room" and msg.get("approved", True):
                self.members = [x["id"] for x in msg["members"] if x["id"] != self.me]
                if self.members:
                    self.ready.set()

    def attack(self) -> int:
        async def go():
            n = 0
            for to in self.members:
                for sdp in BAD_SDP:
                    for kind in ("offer", "answer"):
                        await self.ws.send_str(json.dumps({"type": kind, "to": to, "sdp": sdp}))
                        n += 1
                for c in BAD_CANDIDATES:
                    await self.ws.send_str(json.dumps({"type": "candidate", "to": to, "candidate": c}))
                    n += 1
            return n
        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(60)

    def close(self):
        async def bye():
            self.reader.cancel()
            await self.ws.close()
            await self.session.close()
        asyncio.run_coroutine_threadsafe(bye(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_bad_sdp_and_candidates_from_a_member_are_refused_and_the_run_goes_on(server, peers):
    """Regression: an offer whose SDP aiortc refused (ValueError "ICE username fragment or
    password is missing") or an answer in the wrong state raised out of the signaling
    reader, and the daisy-peer that got it failed (exit 1) mid-run."""
    h, code = host(peers, server, STEPS, 1)
    bad = Hostile(server, code)
    try:
        assert bad.ready.wait(60), "the hostile member was not approved"
        bad.attack()  # before the run: the host alone
        h.wait_for(r"refused an offer from " + bad.me, 60)
        m = peers(server, "--room", code, name="m1")
        h.wait_for(r"train: +\d+%.*?\| *[1-9]\d*/", 120)  # steps are being committed
        bad.attack()  # mid-run: the host and the member
        ref = reference(STEPS)
        assert h.hash() == ref
        assert m.hash() == ref
        for p in (h, m):
            err = p.stderr()
            assert "refused an offer from " + bad.me in err, err[-3000:]
            assert "refused an ICE candidate from " + bad.me in err, err[-3000:]
            assert "internal error" not in err, err[-3000:]
    finally:
        bad.close()
