"""The aiohttp shell: files, ``/healthz``, ``/ice-servers`` and the ``/ws`` signaling socket.

All room logic is in :class:`daisychain.server.rooms.Hub`; this module only moves frames
between sockets and the hub, runs its timers, and serves the package's files.

Extending it (the data routes, the run) without touching this file::

    app = create_app(config, extra_routes=[web.get("/run/{name}", handler)])
    # or, before the app starts:
    app.router.add_get("/run/{name}", handler)
    app.cleanup_ctx.append(my_background_task)

    hub = request.app[HUB_KEY]          # the room registry
    who = hub.authenticate(token)       # PeerInfo of the device holding a reconnect token

URL layout: ``/`` (index.html), ``/selftest``, ``/webui/<path>``, ``/shaders/<name>.wgsl``,
``/luts/<file>``, ``/golden/<file>``, ``/healthz``, ``/ice-servers``, ``/ws``,
``/data/<task>.dcds`` (training data), ``/datasets``, ``POST /datasets/upload``,
``POST /checkpoint/export`` and ``/checkpoint/import``, ``/share``, ``/share/qr.svg``.
Every route that takes a file goes through ``uploads.UploadGuard`` (``GUARD_KEY``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import time
from pathlib import Path
from typing import Iterable

from aiohttp import WSMsgType, web

from daisychain import meta
from daisychain import signaling as p
from .config import ServerConfig
from .groups import client_address, network_group
from .guard import COUNTER_KEY, owed_bodies, upload_slots
from .keys import CONFIG_KEY, HUB_KEY  # (routes/checkpoints.py and routes/share.py read it there)
from .rooms import Close, Hub, Send
from .uploads import GUARD_KEY, UploadGuard

log = logging.getLogger("daisychain.server")

SOCKETS_KEY = web.AppKey("daisychain_sockets", dict)
FILES_KEY = web.AppKey("daisychain_files", dict)

MIME = {".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript",
        ".css": "text/css", ".json": "application/json", ".wgsl": "text/wgsl",
        ".bin": "application/octet-stream", ".wasm": "application/wasm", ".svg": "image/svg+xml",
        ".png": "image/png", ".ico": "image/x-icon", ".txt": "text/plain", ".map": "application/json"}
IMMUTABLE = "public, max-age=31536000, immutable"

PLACEHOLDER = """<!doctype html><meta charset="utf-8"><title>DaisyChain</title>
<h1>DaisyChain server is running</h1>
<p>The page <code>daisychain/webui/{name}</code> is not built yet. Signaling is at <code>/ws</code>,
health at <a href="/healthz">/healthz</a>.</p>"""


# -- files ------------------------------------------------------------------------------------


class PackageFiles:
    """Files under one package folder, with content-hash ETags and no way out of the folder."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self._hashes: dict[Path, tuple[int, int, str]] = {}

    def resolve(self, rel: str) -> Path | None:
        parts = rel.split("/")
        if not rel or "\\" in rel or "\x00" in rel or any(x in ("", ".", "..") for x in parts):
            return None
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root) or not path.is_file():
            return None
        return path

    def digest(self, path: Path) -> str:
        """SHA-256 of the content (16 hex), cached while size and mtime stay the same."""
        st = path.stat()
        hit = self._hashes.get(path)
        if hit and hit[:2] == (st.st_mtime_ns, st.st_size):
            return hit[2]
        h = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        self._hashes[path] = (st.st_mtime_ns, st.st_size, h)
        return h

    def response(self, request: web.Request, path: Path) -> web.StreamResponse:
        digest = self.digest(path)
        etag = f'"{digest}"'
        version = request.query.get("v")
        headers = {"ETag": etag, "X-Content-Type-Options": "nosniff",
                   "Cache-Control": IMMUTABLE if version and digest.startswith(version)
                   and len(version) >= 8 else "no-cache"}
        if etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
            return web.Response(status=304, headers=headers)
        ctype = MIME.get(path.suffix.lower(), "application/octet-stream")
        charset = "utf-8" if ctype.startswith("text/") or ctype == "application/json" else None
        return web.Response(body=path.read_bytes(), content_type=ctype, charset=charset,
                            headers=headers)


def _files_handler(folder: str, suffix: str | None = None):
    async def handler(request: web.Request) -> web.StreamResponse:
        files: PackageFiles = request.app[FILES_KEY][folder]
        rel = request.match_info["path"]
        path = files.resolve(rel) if suffix is None or rel.endswith(suffix) else None
        if path is None:
            raise web.HTTPNotFound(text=f"no file {folder}/{rel[:200]}")
        return files.response(request, path)
    return handler


def _page_handler(name: str):
    async def handler(request: web.Request) -> web.StreamResponse:
        files: PackageFiles = request.app[FILES_KEY]["webui"]
        path = files.resolve(name)
        if path is None:
            return web.Response(status=404, text=PLACEHOLDER.format(name=name), content_type="text/html")
        return files.response(request, path)
    return handler


async def _healthz(request: web.Request) -> web.Response:
    app = request.app
    counter = app.get(COUNTER_KEY)
    return web.json_response({"ok": True, "version": meta.__version__,
                              "protocol": p.PROTOCOL_VERSION, **app[HUB_KEY].stats(),
                              "http": counter.stats() if counter is not None else {},
                              "uploads": app[GUARD_KEY].stats(),
                              "slow_readers_dropped": _Socket.dropped_total,
                              "limits": app[CONFIG_KEY].all_limits()})


async def _ice_servers(request: web.Request) -> web.Response:
    return web.json_response({"iceServers": list(request.app[CONFIG_KEY].ice_servers)},
                             headers={"Cache-Control": "no-cache"})


# -- signaling --------------------------------------------------------------------------------


_ROOM = object()  # the place of the (one) room state in a socket's queue


class _Socket:
    """One connection's outgoing side: a queue bounded in frames and bytes, drained by one
    writer task, so a slow client never stalls the others. Room states coalesce: at most one
    waits per connection, the latest (it replaces an older one still waiting). A connection
    over its budget is dropped, with one log line."""

    dropped_total = 0

    def __init__(self, ws: web.WebSocketResponse, frames: int, max_bytes: int, who: str = "",
                 transport: asyncio.Transport | None = None):
        self.ws, self.frames, self.max_bytes, self.who = ws, frames, max_bytes, who
        self.transport = transport
        self.queue: collections.deque = collections.deque()
        self.bytes = 0
        self.room: str | None = None  # the latest room state, while one waits
        self.dropped = False
        self.wake = asyncio.Event()
        self.task = asyncio.create_task(self._write())

    def push(self, item) -> None:
        if self.dropped:
            return
        if isinstance(item, tuple):  # a close: nothing after it
            self.queue.append(item)
        elif len(self.queue) >= self.frames or self.bytes + len(item) > self.max_bytes:
            self._drop()
            return
        else:
            self.queue.append(item)
            self.bytes += len(item)
        self.wake.set()

    def push_room(self, text: str) -> None:
        if self.dropped:
            return
        if self.room is not None:  # one waits already: the latest wins, in its place
            self.bytes += len(text) - len(self.room)
            self.room = text
            return
        if len(self.queue) >= self.frames or self.bytes + len(text) > self.max_bytes:
            self._drop()
            return
        self.room = text
        self.bytes += len(text)
        self.queue.append(_ROOM)
        self.wake.set()

    def _drop(self) -> None:
        self.dropped = True
        _Socket.dropped_total += 1
        log.warning("dropping the connection %s: it does not read its messages (%d frames, "
                    "%d bytes waiting; limits %d frames, %d bytes)", self.who, len(self.queue),
                    self.bytes, self.frames, self.max_bytes)
        self.queue.clear()
        self.room, self.bytes = None, 0
        self.queue.append((1013, "too slow: the client does not read its messages"))
        self.wake.set()
        # a writer blocked on a client that reads nothing never gets to the close: cut it
        asyncio.get_running_loop().call_later(2.0, self._abort)

    def _abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.task.cancel()
            self.transport.abort()

    async def _write(self) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError, asyncio.CancelledError):
            while True:
                while not self.queue:
                    self.wake.clear()
                    await self.wake.wait()
                item = self.queue.popleft()
                if isinstance(item, tuple):
                    await self.ws.close(code=item[0], message=item[1].encode()[:120])
                    return
                if item is _ROOM:
                    item, self.room = self.room, None
                self.bytes -= len(item)
                await self.ws.send_str(item)


def _deliver(app: web.Application, outputs: list) -> None:
    sockets: dict[int, _Socket] = app[SOCKETS_KEY]
    encoded: dict[int, str | None] = {}
    for o in outputs:
        sock = sockets.get(o.conn)
        if sock is None:
            continue
        if isinstance(o, Send):
            key = id(o.message)
            if key not in encoded:
                try:
                    encoded[key] = p.encode(o.message)
                except ValueError as exc:  # never put non-JSON on the wire
                    log.warning("not sending a %s that is not JSON: %s", o.message.TYPE, exc)
                    encoded[key] = None
            text = encoded[key]
            if text is None:
                continue
            if isinstance(o.message, p.RoomState):
                sock.push_room(text)
            else:
                sock.push(text)
        elif isinstance(o, Close):
            sock.push((o.code, o.reason))


def _feed(app: web.Application, step, *args) -> None:
    """Call one Hub entry point and deliver what it answers; a bug in it never takes the
    server down."""
    try:
        _deliver(app, step(*args, time.monotonic()))
    except Exception:  # noqa: BLE001 - logged, and the socket carries on
        log.exception("signaling hub failed on %s", getattr(step, "__name__", step))


async def _ws(request: web.Request) -> web.WebSocketResponse:
    app = request.app
    cfg, hub = app[CONFIG_KEY], app[HUB_KEY]
    ws = web.WebSocketResponse(heartbeat=cfg.ping_interval_s, autoping=True,
                               max_msg_size=4 * cfg.max_message_bytes + 4096)
    await ws.prepare(request)
    address = client_address(request.remote, request.headers.get("X-Forwarded-For"),
                             cfg.trusted_networks)
    refusal = hub.admit(str(address), time.monotonic())
    if refusal is not None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_str(p.encode(refusal))
            await ws.close(code=1008, message=refusal.message.encode()[:120])
        return ws
    conn = hub.open(network_group(address), str(address), time.monotonic())
    sock = app[SOCKETS_KEY][conn] = _Socket(ws, cfg.send_queue, cfg.send_queue_bytes,
                                            f"#{conn} from {address}", request.transport)
    try:
        async for msg in ws:
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                _feed(app, hub.receive, conn, msg.data)
            elif msg.type == WSMsgType.ERROR:
                break
    finally:
        app[SOCKETS_KEY].pop(conn, None)
        _feed(app, hub.closed, conn)
        sock.task.cancel()
    return ws


async def _timers(app: web.Application):
    """cleanup_ctx: runs the hub's timers (grace period, hello timeout)."""
    async def loop():
        while True:
            await asyncio.sleep(app[CONFIG_KEY].tick_s)
            _feed(app, app[HUB_KEY].tick)
            app[GUARD_KEY].sweep()  # the uploads of rooms that closed

    task = asyncio.create_task(loop())
    yield
    task.cancel()
    app[GUARD_KEY].close()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _close_sockets(app: web.Application) -> None:
    """on_shutdown: tell every client and close its socket."""
    sockets = list(app[SOCKETS_KEY].values())
    for sock in sockets:
        sock.task.cancel()
    await asyncio.gather(*(s.ws.close(code=1001, message=b"shutting_down: the server is stopping")
                           for s in sockets), return_exceptions=True)


# -- factory ----------------------------------------------------------------------------------


def create_app(config: ServerConfig | None = None, *,
               extra_routes: Iterable[web.AbstractRouteDef] = (),
               hub: Hub | None = None,
               folders: dict[str, Path] | None = None,
               datasets: dict | None = None) -> web.Application:
    """The server app. ``extra_routes`` (``web.get(...)`` etc.) are added after the built-in
    ones; the returned app is not started yet, so callers may add routes, ``cleanup_ctx`` and
    ``on_shutdown`` entries of their own. ``folders`` replaces package folders (``webui``,
    ``shaders``, ``luts``, ``golden``) by other directories, e.g. in tests. ``datasets``
    ({task: Dataset}) are served at ``/data/<task>.dcds`` as they are; other known tasks are
    prepared with their defaults on first request (``daisychain.server.routes.data``). The
    checkpoint conversions (``daisychain.server.routes.checkpoints``) are always there."""
    from .routes.checkpoints import checkpoint_routes
    from .routes.datasets import dataset_routes  # /data (wraps routes/data.py), /datasets, uploads
    from .routes.share import QR_CACHE_KEY, share_routes

    config = config or ServerConfig()
    app = web.Application(client_max_size=1 << 20, middlewares=[owed_bodies])
    app[CONFIG_KEY] = config
    app[HUB_KEY] = hub or Hub(config)
    app[SOCKETS_KEY] = {}
    upload_slots(app, config)
    app[GUARD_KEY] = UploadGuard(config, app[HUB_KEY])  # every upload route goes through it
    app[QR_CACHE_KEY] = collections.OrderedDict()
    folders = {name: Path(str(meta.package_path(name)))
               for name in ("webui", "shaders", "luts", "golden")} | dict(folders or {})
    app[FILES_KEY] = {name: PackageFiles(path) for name, path in folders.items()}
    app.add_routes([
        web.get("/", _page_handler("index.html")),
        web.get("/selftest", _page_handler("selftest.html")),
        web.get("/webui/{path:.+}", _files_handler("webui")),
        web.get("/shaders/{path:[^/]+}", _files_handler("shaders", ".wgsl")),
        web.get("/luts/{path:[^/]+}", _files_handler("luts")),
        web.get("/golden/{path:[^/]+}", _files_handler("golden")),
        web.get("/healthz", _healthz),
        web.get("/ice-servers", _ice_servers),
        web.get("/ws", _ws),
    ])
    from .routes.hub import hub_routes  # POST /datasets/hub (serve --hub)

    app.add_routes(dataset_routes(datasets) + checkpoint_routes(config) + share_routes()
                   + hub_routes())
    app.add_routes(list(extra_routes))
    app.cleanup_ctx.append(_timers)
    app.on_shutdown.append(_close_sockets)
    return app
