"""The aiortc shell: one ``RTCPeerConnection`` with one data channel per other member of the
room, in WebRTC's own vocabulary. Nothing here knows what the bytes mean.

Who offers: of two members, the one whose signaling id sorts first (plain string comparison)
creates the data channel (label ``daisychain``, ordered, reliable) and the offer; the other
answers and receives the channel in its ``datachannel`` event. aiortc puts every ICE
candidate into the SDP, so it sends no ``candidate`` messages; the ones a browser trickles
are added as they come (held until the remote description is set).

Flow control: a sender waits while the channel's ``bufferedAmount`` is above
:data:`HIGH_WATER` (8 MiB) until ``bufferedamountlow`` fires (threshold :data:`LOW_WATER`);
aiortc raises past 16 MiB buffered, browsers close the channel.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import candidate_from_sdp

from daisychain.peer import sctp_guard

sctp_guard.install()  # a message past the announced maximum drops its peer (sctp_guard.py)

log = logging.getLogger("daisychain.peer")

CHANNEL_LABEL = "daisychain"
HIGH_WATER = 8 * 1024 * 1024
LOW_WATER = 1024 * 1024
#: bytes queued for one link (not yet handed to its channel) before the peer is dropped as one
#: that does not read: two of the largest messages (64 MiB each)
MAX_QUEUED = 128 * 1024 * 1024
#: seconds before the offering side links again to a member that is still in the room after
#: its connection failed or its channel closed (doubling per failed try, up to RELINK_MAX_S)
RELINK_S = 0.5
RELINK_MAX_S = 8.0
#: how long closing one connection may take: aiortc's ``RTCPeerConnection.close()`` can wait
#: for ever (aiortc issue 283), and a peer whose run ended must still exit
CLOSE_S = 5.0


def _why(exc: BaseException) -> str:
    return type(exc).__name__ + (f": {str(exc)[:200]}" if str(exc) else "")


def use_loopback_only() -> None:
    """Gather only 127.0.0.1 host candidates (aioice skips loopback by default): every
    packet of this process's connections stays on the machine. Used by ``daisychain demo``."""
    import aioice.ice

    aioice.ice.get_host_addresses = lambda use_ipv4=True, use_ipv6=False: ["127.0.0.1"]


def rtc_configuration(ice_servers) -> RTCConfiguration:
    """Always explicit: aiortc's default configuration names a public STUN server."""
    servers = []
    for s in ice_servers or ():
        servers.append(RTCIceServer(urls=s["urls"], username=s.get("username"),
                                    credential=s.get("credential")))
    return RTCConfiguration(iceServers=servers)


class Link:
    """The connection to one other member."""

    def __init__(self, mesh: "Mesh", peer: str):
        self.mesh, self.peer = mesh, peer
        self.pc = RTCPeerConnection(rtc_configuration(mesh.ice_servers))
        self.channel = None
        self.remote_set = False
        self.early_candidates: list = []
        self.queue: asyncio.Queue = asyncio.Queue()
        self.queued = 0  # bytes in self.queue
        self.writer: asyncio.Task | None = None
        self.opened = False
        self.closed = False
        self.bytes_out = 0
        self.bytes_in = 0

        @self.pc.on("datachannel")
        def _on_channel(channel):
            self._adopt(channel)

        @self.pc.on("connectionstatechange")
        async def _on_state():
            if self.pc.connectionState in ("failed", "closed") and not self.closed:
                await self.mesh._lost(self.peer)

    def _adopt(self, channel) -> None:
        self.channel = channel
        channel.bufferedAmountLowThreshold = LOW_WATER

        @channel.on("open")
        def _on_open():
            self._opened()

        @channel.on("message")
        def _on_message(data):
            if isinstance(data, (bytes, bytearray)):
                self.bytes_in += len(data)
            self.mesh.on_message(self.peer, data)

        @channel.on("close")
        def _on_close():
            if not self.closed:
                asyncio.ensure_future(self.mesh._lost(self.peer))

        if channel.readyState == "open":
            self._opened()

    def _opened(self) -> None:
        if self.opened:
            return
        self.opened = True
        self.writer = asyncio.ensure_future(self._write())
        self.mesh.opened(self.peer)

    async def offer(self) -> None:
        self._adopt(self.pc.createDataChannel(CHANNEL_LABEL, ordered=True))
        await self.pc.setLocalDescription(await self.pc.createOffer())
        await self.mesh.signal("offer", self.peer, self.pc.localDescription.sdp)

    async def on_offer(self, sdp: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp, "offer"))
        await self._remote_ready()
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        await self.mesh.signal("answer", self.peer, self.pc.localDescription.sdp)

    async def on_answer(self, sdp: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp, "answer"))
        await self._remote_ready()

    async def on_candidate(self, cand: dict | None) -> None:
        if cand is None or not cand.get("candidate"):
            return  # end of candidates
        if not self.remote_set:
            self.early_candidates.append(cand)
            return
        text = cand["candidate"]
        try:
            c = candidate_from_sdp(text.split(":", 1)[1] if text.startswith("candidate:") else text)
        except Exception as exc:  # noqa: BLE001 - aiortc asserts on some malformed lines
            log.warning("refused an ICE candidate from %s: %r is not a valid candidate (%s)",
                        self.peer, text[:120], type(exc).__name__ + (f": {exc}" if str(exc) else ""))
            return
        c.sdpMid = cand.get("sdpMid")
        c.sdpMLineIndex = cand.get("sdpMLineIndex")
        try:
            await self.pc.addIceCandidate(c)
        except Exception as exc:  # noqa: BLE001 - an unusable candidate is not fatal
            log.warning("refused an ICE candidate from %s: %s", self.peer,
                        type(exc).__name__ + (f": {exc}" if str(exc) else ""))

    async def _remote_ready(self) -> None:
        self.remote_set = True
        early, self.early_candidates = self.early_candidates, []
        for c in early:
            await self.on_candidate(c)

    def send(self, frames: list[bytes]) -> bool:
        """Queue the frames of one message; they go out in order, under flow control. False
        (and the link is dropped, with one log line) when the queue would pass MAX_QUEUED:
        the other side does not read."""
        size = sum(len(f) for f in frames)
        if self.queued + size > MAX_QUEUED:
            if not self.closed:
                log.warning("dropping %s: it does not read its data channel (%d MiB queued)",
                            self.peer, (self.queued + size) >> 20)
                self.closed = True
                asyncio.ensure_future(self.mesh._lost(self.peer))
            return False
        self.queued += size
        self.queue.put_nowait(frames)
        return True

    def idle(self) -> bool:
        return self.queue.empty() and (self.channel is None or self.channel.bufferedAmount == 0)

    async def _write(self) -> None:
        low = asyncio.Event()
        self.channel.on("bufferedamountlow", low.set)
        try:
            while not self.closed:
                frames = await self.queue.get()
                self.queued -= sum(len(f) for f in frames)
                for f in frames:
                    while self.channel.bufferedAmount > HIGH_WATER:
                        low.clear()
                        await low.wait()
                    if self.channel.readyState != "open":
                        return
                    self.channel.send(f)
                    self.bytes_out += len(f)
                # let the SCTP transport run between messages
                await asyncio.sleep(0)
        except (asyncio.CancelledError, ConnectionError):
            pass
        except Exception:  # noqa: BLE001
            log.exception("sending to %s failed", self.peer)

    async def close(self) -> None:
        self.closed = True
        if self.writer:
            self.writer.cancel()
        try:
            await asyncio.wait_for(self.pc.close(), CLOSE_S)
        except asyncio.TimeoutError:
            log.warning("closing the connection to %s took over %g s: left open", self.peer, CLOSE_S)
        except Exception:  # noqa: BLE001 - a connection that fails to close is closed enough
            pass


class Mesh:
    """Links to every other approved member of the room."""

    def __init__(self, me: str, signal: Callable[[str, str, object], Awaitable[None]],
                 on_open: Callable[[str], None], on_message: Callable[[str, bytes], None],
                 on_close: Callable[[str], None], ice_servers=()):
        self.me = me
        self.signal = signal
        self.on_open, self.on_message, self.on_close = on_open, on_message, on_close
        self.ice_servers = ice_servers
        self.links: dict[str, Link] = {}
        self.members: set[str] = set()          # the room's approved members, last we heard
        self.tries: dict[str, int] = {}         # peer -> links to it lost since one opened
        self.relinks: dict[str, asyncio.Task] = {}
        self.closing = False

    async def update(self, members: list[str]) -> None:
        """The room's approved members (self included): link new ones, drop gone ones."""
        self.members = set(members)
        for peer in list(self.links):
            if peer not in members:
                await self._drop(peer)
        for peer in members:
            if peer != self.me and peer not in self.links and self.me < peer:
                link = self.links[peer] = Link(self, peer)
                await link.offer()

    def _link(self, peer: str) -> Link:
        if peer not in self.links:
            self.links[peer] = Link(self, peer)
        return self.links[peer]

    async def on_offer(self, peer: str, sdp: str) -> None:
        """An offer from ``peer`` (any room member can send one, with any text): one that
        aiortc cannot take is refused by name and its half-made link dropped."""
        old = self.links.get(peer)
        if old is not None and (old.remote_set or old.opened):  # the other side restarted
            await self._drop(peer)
        try:
            await self._link(peer).on_offer(sdp)
        except Exception as exc:  # noqa: BLE001 - aiortc raises ValueError, AssertionError...
            log.warning("refused an offer from %s: %s", peer, _why(exc))
            await self._drop(peer)

    async def on_answer(self, peer: str, sdp: str) -> None:
        """An answer from ``peer``: one that does not fit our offer is refused by name; the
        link it was for (if it never got an answer) is dropped and offered again."""
        link = self.links.get(peer)
        if link is None:
            return
        try:
            await link.on_answer(sdp)
        except Exception as exc:  # noqa: BLE001 - aiortc raises ValueError, InvalidStateError...
            log.warning("refused an answer from %s: %s", peer, _why(exc))
            if not link.remote_set and self.links.get(peer) is link:
                await self._lost(peer)

    async def on_candidate(self, peer: str, cand) -> None:
        await self._link(peer).on_candidate(cand)

    def send(self, peer: str, frames: list[bytes]) -> bool:
        link = self.links.get(peer)
        if link is None or not link.opened or link.closed:
            return False
        return link.send(frames)

    def bytes(self) -> tuple[int, int]:
        return (sum(l.bytes_out for l in self.links.values()),
                sum(l.bytes_in for l in self.links.values()))

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait until every queued frame is handed to the network (or ``timeout``)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end and not all(l.idle() for l in self.links.values() if l.opened):
            await asyncio.sleep(0.02)

    async def _lost(self, peer: str) -> None:
        """The connection to ``peer`` failed or its channel closed. If it is still in the
        room, the side that offers links again (the other side answers the new offer): a
        link lost while the room stayed the same used to stay lost for the rest of the run."""
        if peer in self.links:
            await self._drop(peer)
            self._relink_later(peer)

    def _relink_later(self, peer: str) -> None:
        if self.closing or peer not in self.members or not self.me < peer or peer in self.relinks:
            return
        n = self.tries[peer] = self.tries.get(peer, 0) + 1
        delay = min(RELINK_MAX_S, RELINK_S * 2 ** (n - 1))
        log.warning("lost the data channel to %s: linking again in %g s", peer, delay)

        async def again() -> None:
            try:
                await asyncio.sleep(delay)
                if self.closing or peer not in self.members or peer in self.links:
                    return
                link = self.links[peer] = Link(self, peer)
                await link.offer()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next loss tries again
                log.warning("linking again to %s failed: %s", peer, exc)
            finally:
                self.relinks.pop(peer, None)
        self.relinks[peer] = asyncio.ensure_future(again())

    def opened(self, peer: str) -> None:
        self.tries.pop(peer, None)
        self.on_open(peer)

    async def _drop(self, peer: str) -> None:
        link = self.links.pop(peer, None)
        if link is None:
            return
        was_open = link.opened
        await link.close()
        if was_open:
            self.on_close(peer)

    async def close(self) -> None:
        self.closing = True
        for t in list(self.relinks.values()):
            t.cancel()
        links, self.links = list(self.links.values()), {}
        await asyncio.gather(*(link.close() for link in links))
