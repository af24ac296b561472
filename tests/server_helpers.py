"""Helpers for the server tests: a sans-IO driver for the Hub, a real loopback server, and a
real WebSocket client that speaks the protocol through ``daisychain.signaling``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections import defaultdict
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from daisychain import signaling as p
from daisychain.server.app import create_app
from daisychain.server.config import ServerConfig
from daisychain.server.rooms import Close, Hub, Send

#: Fast timers so functional tests do not wait.
FAST = dict(grace_s=0.6, ping_interval_s=5.0, hello_timeout_s=2.0, tick_s=0.05)


def hello(name="dev", room="network", token=None, kind="cpu", capacity=1.0) -> p.Hello:
    return p.Hello(name=name, kind=kind, capacity=capacity, room=room, token=token)


def run_async(coro):
    """asyncio.run(coro) in a fresh thread: immune to an event loop that another fixture
    (e.g. a sync Playwright) keeps running in the main thread."""
    import threading

    box: dict = {}

    def main():
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=main, name="test-asyncio")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def aio(fn):
    """Run an async test function in a fresh event loop (no pytest plugin needed)."""
    @functools.wraps(fn)
    def run(*args, **kw):
        return run_async(fn(*args, **kw))
    return run


# -- sans-IO driver ---------------------------------------------------------------------------


@dataclass
class Driver:
    """Feeds a Hub and files what it sends under each connection."""

    hub: Hub = field(default_factory=lambda: Hub(ServerConfig(grace_s=10), random.Random(7)))
    now: float = 0.0
    inbox: dict = field(default_factory=lambda: defaultdict(list))
    closed: dict = field(default_factory=dict)

    def apply(self, outputs):
        for o in outputs:
            if isinstance(o, Send):
                self.inbox[o.conn].append(o.message)
            elif isinstance(o, Close):
                self.closed[o.conn] = (o.code, o.reason)
        return outputs

    def open(self, group="local", address="127.0.0.1") -> int:
        return self.hub.open(group, address, self.now)

    def send(self, conn, msg) -> list:
        if isinstance(msg, (str, bytes)):
            return self.apply(self.hub.receive(conn, msg, self.now))
        return self.apply(self.hub.receive_message(conn, msg, self.now))

    def drop(self, conn):
        return self.apply(self.hub.closed(conn, self.now))

    def tick(self, dt=0.0):
        self.now += dt
        return self.apply(self.hub.tick(self.now))

    def take(self, conn) -> list:
        msgs, self.inbox[conn] = self.inbox[conn], []
        return msgs

    def last(self, conn, cls):
        found = [m for m in self.inbox[conn] if isinstance(m, cls)]
        return found[-1] if found else None

    def device(self, room="network", name="dev", group="local", address="127.0.0.1"):
        """Open + hello; returns (conn, peer id)."""
        c = self.open(group, address)
        self.send(c, hello(name=name, room=room))
        return c, self.last(c, p.Welcome).id


# -- real server ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running_server(folders=None, **overrides):
    """A real aiohttp server on 127.0.0.1, random port; yields (base_url, app)."""
    cfg = ServerConfig(**{**FAST, **overrides, "host": "127.0.0.1", "port": 0})
    app = create_app(cfg, folders=folders)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


class Client:
    """One real WebSocket connection to ``/ws``."""

    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse):
        self.session, self.ws = session, ws
        self.id: str | None = None
        self.token: str | None = None
        self.seen: list = []

    @classmethod
    async def connect(cls, base: str, headers=None, **kw) -> "Client":
        session = aiohttp.ClientSession()
        ws = await session.ws_connect(base + "/ws", headers=headers, **kw)
        return cls(session, ws)

    async def send(self, msg) -> None:
        await self.ws.send_str(msg if isinstance(msg, str) else p.encode(msg))

    async def recv(self, timeout=5.0):
        m = await self.ws.receive(timeout=timeout)
        if m.type != aiohttp.WSMsgType.TEXT:
            return m
        msg = p.parse_server(m.data)
        self.seen.append(msg)
        return msg

    async def expect(self, cls, timeout=5.0):
        """Read until a message of ``cls`` (skipping room updates etc.)."""
        while True:
            m = await self.recv(timeout)
            if isinstance(m, cls):
                return m
            if not isinstance(m, (p.RoomState, p.JoinRequest, p.Pending, p.Pong, p.Welcome,
                                  p.Error, p.Offer, p.Answer, p.Candidate, p.Broadcast)):
                raise AssertionError(f"connection ended while waiting for {cls.__name__}: {m}")

    async def hello(self, room="network", name="dev", token=None, kind="cpu"):
        await self.send(hello(name=name, room=room, token=token, kind=kind))
        w = await self.expect(p.Welcome)
        self.id, self.token = w.id, w.token
        return w

    async def quiet(self, timeout=0.2) -> list:
        """Everything that arrives within ``timeout`` (used to show that nothing arrives)."""
        got = []
        with contextlib.suppress(asyncio.TimeoutError):
            while True:
                m = await self.recv(timeout)
                got.append(m)
                if not hasattr(m, "TYPE"):  # the socket closed
                    break
        return got

    async def close(self):
        await self.ws.close()
        await self.session.close()


async def room_state(client: Client, members: int, timeout=5.0) -> p.RoomState:
    """The first room state with ``members`` members."""
    while True:
        st = await client.expect(p.RoomState, timeout)
        if len(st.members) == members:
            return st


#: a text the page's data routes are tried with (its own upload, `serve --data`)
BOOK = ("It was the best of times, it was the worst of times,\nit was the age of wisdom, "
        "it was the age of foolishness,\n") * 6


@contextlib.asynccontextmanager
async def server(host="127.0.0.1", datasets=None):
    cfg = ServerConfig(**{**FAST, "host": host, "port": 0})
    runner = web.AppRunner(create_app(cfg, datasets=datasets))
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as s:
            yield s, f"http://127.0.0.1:{port}", port
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def room_host(s: aiohttp.ClientSession, base: str):
    """A device that opened a private room (it is its host): the upload headers with its
    room credential (issue 21: uploads belong to a room)."""
    async with s.ws_connect(base.replace("http", "ws") + "/ws") as ws:
        await ws.send_json({"type": "hello", "version": 1, "name": "host", "kind": "cpu",
                            "capacity": 1, "room": "new"})
        welcome = await ws.receive_json(timeout=10)
        assert welcome["type"] == "welcome", welcome
        room = await ws.receive_json(timeout=10)
        assert room["type"] == "room", room
        yield {"X-Daisy-Token": welcome["token"]}
