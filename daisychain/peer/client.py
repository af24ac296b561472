"""The signaling client: one WebSocket to the server's ``/ws``, every message built and read by
``daisychain.signaling`` (the one Python wire module of that channel)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from daisychain import signaling as p


log = logging.getLogger("daisychain.peer")


class SignalingError(Exception):
    """The server refused us, or the connection ended; ``str(err)`` says why."""


def ws_url(server: str) -> str:
    base = server.rstrip("/")
    if base.startswith("http://"):
        base = "ws://" + base[len("http://"):]
    elif base.startswith("https://"):
        base = "wss://" + base[len("https://"):]
    elif not base.startswith(("ws://", "wss://")):
        base = "ws://" + base
    return base + "/ws"


def http_url(server: str) -> str:
    base = server.rstrip("/")
    if base.startswith("ws://"):
        return "http://" + base[len("ws://"):]
    if base.startswith("wss://"):
        return "https://" + base[len("wss://"):]
    return base if base.startswith(("http://", "https://")) else "http://" + base


class SignalingClient:
    def __init__(self, server: str, session: aiohttp.ClientSession):
        self.server = server
        self.session = session
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.welcome: p.Welcome | None = None
        self.refused = 0  # unreadable frames skipped

    async def connect(self, name: str, kind: str, capacity: float, room: str,
                      token: str | None = None) -> p.Welcome:
        """``token``: resume the identity of an earlier connection (``welcome.resumed``)."""
        try:
            self.ws = await self.session.ws_connect(ws_url(self.server), heartbeat=15)
        except (aiohttp.ClientError, OSError) as exc:
            raise SignalingError(f"cannot reach the server at {self.server}: {exc}") from None
        await self.send(p.Hello(name=name[:p.MAX_NAME_CHARS], kind=kind,
                                capacity=min(float(capacity), p.MAX_CAPACITY), room=room,
                                token=token))
        msg = await self.recv()
        if isinstance(msg, p.Error):
            raise SignalingError(f"the server refused us: {msg.message}")
        if not isinstance(msg, p.Welcome):
            raise SignalingError(f"expected welcome, got {msg.TYPE}")
        self.welcome = msg
        return msg

    async def send(self, msg) -> None:
        if self.ws is not None and not self.ws.closed:
            await self.ws.send_str(p.encode(msg))

    async def recv(self):
        """The next server message; raises SignalingError when the socket ends. A frame that
        is not a valid message (e.g. a relayed ``Infinity``, which is not JSON) is refused
        with a log line and skipped: one bad frame never ends the connection."""
        while True:
            m = await self.ws.receive()
            if m.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                try:
                    return p.parse_server(m.data)
                except p.ProtocolError as exc:
                    self.refused += 1
                    log.warning("refused an unreadable signaling frame (%s): %s; skipped it",
                                exc.code.value, exc.message[:200])
                    continue
            if m.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                          aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):
                extra = f": {m.extra}" if m.extra else ""
                raise SignalingError(f"the signaling connection closed{extra}")

    async def leave(self) -> None:
        if self.ws is not None and not self.ws.closed:
            try:
                await asyncio.wait_for(self.send(p.Leave()), 1.0)
                await asyncio.wait_for(self.ws.close(), 1.0)
            except (asyncio.TimeoutError, aiohttp.ClientError, ConnectionError, RuntimeError):
                pass
