"""HTTP-level limits: sockets per address and in all, header and body timeouts, uploads.

- :class:`GuardedRunner` is the ``web.AppRunner`` that ``daisychain serve`` uses. Its
  connections count against ``max_sockets`` (in all) and ``max_sockets_per_address`` (per
  ``groups.address_key``; trusted proxies are exempt, their clients are counted at ``/ws``).
  One over a cap gets a short ``503`` with the limit and its current value, and is closed
  before aiohttp reads anything from it.
- Header timeout: a connection that has not completed its first request's headers within
  ``header_timeout_s`` (a slowloris) is closed; after a request, aiohttp's keep-alive
  timeout (set to the same) closes one that idles or trickles its next request.
- :func:`read_body` reads an upload: its ``Content-Length`` checked against the limit before
  reading, the whole body within ``body_timeout_s``, at most ``max_uploads`` at once (more
  get ``503`` with ``Retry-After``); a client that resets or closes mid-body is counted
  (``/healthz`` ``uploads.cut_mid_body``) and logged once per 10 s, without a traceback.
- A request answered before its body was read (a refused upload) is closed ``LINGER_S``
  after the answer, if the rest of its body has not come by then; until its body is read to
  the end such a connection may be closed at the socket cap to make room (``owed_bodies``).
- :func:`raise_file_limit` raises ``RLIMIT_NOFILE`` to its hard limit and returns the socket
  cap that leaves room below it for the files the server itself opens.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from .config import ServerConfig
from .groups import address_key, parse_ip

log = logging.getLogger("daisychain.server")

#: File descriptors kept free below the file limit: the server's own files (packages,
#: torch, logs), 128, and the connections the event loop accepts before any is looked at
#: (up to the listen backlog, 128, per round; a few rounds may overlap), 3 x 128.
FD_RESERVE = 512

#: Seconds a new connection is given before it may be judged a slowloris at the socket cap:
#: on a busy event loop a real client's request can sit unread that long, and closing it
#: would turn away the very request the eviction makes room for.
FRESH_GRACE_S = 0.5

#: Seconds a connection whose request body was refused unread may still send it before it
#: is closed (the client reads the answer meanwhile).
LINGER_S = 2.0

UPLOADS_KEY = web.AppKey("daisychain_uploads", asyncio.Semaphore)
_FALLBACK_SLOTS: dict[int, asyncio.Semaphore] = {}  # apps not made by create_app


def raise_file_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; returns the new soft limit."""
    try:
        import resource
    except ImportError:  # not on this platform
        return 1 << 16
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %s to %s: %s", soft, want, exc)
    return soft


def socket_cap(config: ServerConfig, file_limit: int) -> int:
    """The socket cap: the configured one, but always ``FD_RESERVE`` below the file limit."""
    return max(16, min(config.max_sockets, file_limit - FD_RESERVE))


class SocketCounter:
    """Open TCP connections, in all and per address."""

    def __init__(self, config: ServerConfig, cap: int):
        self.config, self.cap = config, cap
        self.total = 0
        self.per: dict[str, int] = {}
        self.refused = 0
        self.slow = 0  # closed for not finishing their headers in time
        self.evicted = 0  # closed at the cap to make room for a new connection
        #: handlers that have not sent a complete request yet -> when they opened, oldest first
        self.fresh: dict = {}
        #: handlers whose request (a POST) still owes body bytes the server waits for or will
        #: drop (an upload being read, or refused and lingering), oldest first
        self.uploading: dict = {}
        self.bad_requests = 0  # malformed requests (aiohttp answered 400)
        self._bad_logged_at = float("-inf")

    def bad_request(self, peer, exc: HttpProcessingError) -> None:
        """A malformed request: one log line per 10 s at most, without a traceback (aiohttp
        would log a traceback for each, which a hostile client could repeat at will)."""
        self.bad_requests += 1
        now = time.monotonic()
        if now - self._bad_logged_at >= 10:
            self._bad_logged_at = now
            log.warning("refused a malformed HTTP request from %s (%s; %d so far)", peer,
                        str(exc.message or exc).splitlines()[0][:120], self.bad_requests)

    def evict_one(self) -> bool:
        """At the cap: close the oldest connection that has not completed a request's headers
        for ``FRESH_GRACE_S`` (a slowloris holds its socket that way), else the oldest that
        still owes an upload's body (a stalled or refused upload), else the oldest newer
        one without a request, so that a real request still gets in. A new connection's
        request may sit unread on a busy loop: it is judged last."""
        now = time.monotonic()
        young = None
        for handler, opened in list(self.fresh.items()):
            if handler._request_count or handler.transport is None or handler._messages:
                del self.fresh[handler]  # its headers are in: not a slowloris
            elif now - opened >= FRESH_GRACE_S:
                del self.fresh[handler]
                return self._evict(handler)
            elif young is None:
                young = handler
        for handler in list(self.uploading):
            del self.uploading[handler]
            if handler.transport is not None:
                return self._evict(handler)
        if young is not None:
            del self.fresh[young]
            return self._evict(young)
        return False

    def _evict(self, handler) -> bool:
        self.evicted += 1
        handler.transport.abort()  # before force_close, which forgets the transport
        handler.force_close()
        return True

    def is_proxy(self, ip) -> bool:
        return ip is not None and any(ip.version == n.version and ip in n
                                      for n in self.config.trusted_networks)

    def open(self, peer) -> tuple[str | None, bytes | None]:
        """Count a new connection from ``peer``: (its key, None) or (None, a 503 to send)."""
        host = peer[0] if isinstance(peer, tuple) and peer else None
        ip = parse_ip(host)
        key = None if self.is_proxy(ip) else address_key(str(ip) if ip else host)
        cfg = self.config
        if self.total >= self.cap and self.evict_one():
            pass  # its close is counted when it is lost; this one takes its place
        elif self.total >= self.cap:
            return None, self._refusal(f"the server has {self.total} connections open, its "
                                       f"limit is {self.cap}", self.cap, self.total)
        if key is not None and self.per.get(key, 0) >= cfg.max_sockets_per_address:
            n = self.per[key]
            return None, self._refusal(f"too many connections from your address: {n} open, "
                                       f"the limit is {cfg.max_sockets_per_address}",
                                       cfg.max_sockets_per_address, n)
        self.total += 1
        if key is not None:
            self.per[key] = self.per.get(key, 0) + 1
        return key or "", None

    def close(self, key: str) -> None:
        self.total -= 1
        if key:
            n = self.per.get(key, 1) - 1
            if n > 0:
                self.per[key] = n
            else:
                self.per.pop(key, None)

    def _refusal(self, message: str, limit: int, current: int) -> bytes:
        self.refused += 1
        body = json.dumps({"error": message + "; try again later", "limit": limit,
                           "current": current, "retry_after_s": 5}).encode()
        return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                b"Retry-After: 5\r\nConnection: close\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)

    def stats(self) -> dict:
        return {"sockets": {"limit": self.cap, "current": self.total},
                "sockets_per_address": {"limit": self.config.max_sockets_per_address,
                                        "current": max(self.per.values(), default=0)},
                "sockets_refused": self.refused, "slow_headers_closed": self.slow,
                "evicted_at_cap": self.evicted, "bad_requests": self.bad_requests}


class _GuardedHandler(RequestHandler):
    """aiohttp's handler, counted; over a cap it answers 503 and closes before parsing."""

    def connection_made(self, transport) -> None:
        counter: SocketCounter = self._manager.daisy_counter
        key, refusal = counter.open(transport.get_extra_info("peername"))
        self._daisy_key = key
        if refusal is not None:
            transport.write(refusal)
            transport.close()
            return
        super().connection_made(transport)
        counter.fresh[self] = time.monotonic()
        # the first request's headers must be complete in time (later ones: keep-alive timeout)
        self._daisy_timer = self._loop.call_later(counter.config.header_timeout_s,
                                                  self._daisy_headers_late)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # a POST whose headers are in owes its body from now, though its handler (and with it
        # owed_bodies) may run only later on a busy loop: evictable at the cap meanwhile, so
        # that a stalled upload never holds a socket that a real request needs
        counter = self._manager.daisy_counter if self._manager is not None else None
        if counter is not None and self.transport is not None and self not in counter.uploading \
                and any(getattr(m, "method", None) == "POST" for m, _ in self._messages):
            counter.uploading[self] = None

    def _daisy_headers_late(self) -> None:
        self._manager.daisy_counter.fresh.pop(self, None)
        transport = self.transport
        if self._request_count == 0 and transport is not None:
            self._manager.daisy_counter.slow += 1
            transport.abort()
            self.force_close()

    def connection_lost(self, exc) -> None:
        key = getattr(self, "_daisy_key", None)
        if key is None:  # refused: aiohttp never saw it
            return
        self._daisy_key = None
        timer = getattr(self, "_daisy_timer", None)
        if timer is not None:
            timer.cancel()
        counter = self._manager.daisy_counter
        counter.close(key)
        counter.fresh.pop(self, None)
        counter.uploading.pop(self, None)
        super().connection_lost(exc)


    def log_exception(self, *args, **kw) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 400) < 500:
            peer = self.transport.get_extra_info("peername") if self.transport else None
            self._manager.daisy_counter.bad_request(peer[0] if peer else "?", exc)
            return
        super().log_exception(*args, **kw)


class _GuardedServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _GuardedHandler(self, loop=self._loop, **self._kwargs)


COUNTER_KEY = web.AppKey("daisychain_sockets_counter", SocketCounter)


class GuardedRunner(web.AppRunner):
    """``web.AppRunner`` with the socket caps and the header timeout of ``config``."""

    def __init__(self, app: web.Application, config: ServerConfig, cap: int | None = None,
                 **kwargs):
        kwargs.setdefault("keepalive_timeout", config.header_timeout_s)
        # after an answer to a request whose body was not read (an upload refused: 401, 408,
        # 503...), aiohttp reads and drops the rest for this long before it closes; its 10 s
        # default let a refused, stalled upload hold its socket 10 s longer (issue 25)
        kwargs.setdefault("lingering_time", LINGER_S)
        kwargs.setdefault("handle_signals", False)
        super().__init__(app, **kwargs)
        self.counter = SocketCounter(config, cap if cap is not None else config.max_sockets)
        app[COUNTER_KEY] = self.counter

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer  # the same object, handing out counted handlers
        server.daisy_counter = self.counter
        return server


# -- uploads ----------------------------------------------------------------------------------


@web.middleware
async def owed_bodies(request: web.Request, handler):
    """A POST's connection counts as "uploading" (evictable at the socket cap) until its body
    has been read to the end: while it is read, and after a refusal while aiohttp lingers."""
    counter = request.app.get(COUNTER_KEY)
    if counter is None:
        return await handler(request)
    if request.method != "POST" or not request.body_exists:
        counter.uploading.pop(request.protocol, None)  # counted as its headers came (data_received)
        return await handler(request)
    counter.uploading[request.protocol] = None
    try:
        return await handler(request)
    finally:
        if request.content.is_eof():
            counter.uploading.pop(request.protocol, None)



def refusal(message: str, status: int = 400, **extra) -> web.HTTPException:
    """An HTTP error with ``{"error": message, ...}`` as its body."""
    cls = {400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden,
           408: web.HTTPRequestTimeout, 413: web.HTTPRequestEntityTooLarge,
           429: web.HTTPTooManyRequests, 503: web.HTTPServiceUnavailable}[status]
    kw = {"max_size": extra.get("limit", 0), "actual_size": extra.get("current", 0)} \
        if status == 413 else {}
    headers = {"Retry-After": str(int(extra["retry_after_s"]))} if "retry_after_s" in extra else None
    return cls(text=json.dumps({"error": message, **extra}), content_type="application/json",
               headers=headers, **kw)


def upload_slots(app: web.Application, config: ServerConfig) -> None:
    """Give ``app`` the semaphore that :func:`read_body` counts uploads with."""
    app[UPLOADS_KEY] = asyncio.Semaphore(config.max_uploads)


async def read_body(request: web.Request, config: ServerConfig, limit: int | None = None) -> bytes:
    """The whole request body, within the limits; raises an HTTP 4xx/503 with words."""
    limit = min(limit or config.max_upload_bytes, config.max_upload_bytes)
    length = request.content_length
    if length is not None and length > limit:
        raise refusal(f"body of {length} bytes is larger than the limit of {limit}", 413,
                      limit=limit, current=length)
    slots: asyncio.Semaphore = request.app.get(UPLOADS_KEY) or _FALLBACK_SLOTS.setdefault(
        id(request.app), asyncio.Semaphore(config.max_uploads))
    if slots.locked():
        raise refusal(f"the server is reading {config.max_uploads} uploads already, its limit; "
                      f"try again in a few seconds", 503, limit=config.max_uploads,
                      current=config.max_uploads, retry_after_s=5)
    async with slots:
        try:
            async with asyncio.timeout(config.body_timeout_s):
                return await _read_all(request, limit)
        except TimeoutError:
            raise refusal(f"the body did not arrive within {config.body_timeout_s:g} s",
                          408, limit=config.body_timeout_s) from None
        except (ConnectionError, ClientPayloadError, HttpProcessingError) as exc:
            # the client reset or closed the connection mid-body: nobody to answer, and a
            # traceback per cut upload would let a client flood the log (issue 25)
            CUT.record(request.remote, exc)
            raise refusal("the upload was cut off before its end", 400) from None
        except RuntimeError:
            # aiohttp's "Connection closed.": the server closed this connection itself, at
            # the socket cap (evict_one) or for its timeouts; its close was counted there
            if request.protocol is not None and request.protocol.transport is not None:
                raise
            raise refusal("the upload was closed by the server before its end", 400) from None


class _CutUploads:
    """Uploads whose client went away mid-body: counted, one log line per 10 s at most."""

    def __init__(self):
        self.count = 0
        self._logged_at = float("-inf")

    def record(self, peer, exc: BaseException) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self._logged_at >= 10:
            self._logged_at = now
            log.warning("an upload from %s was cut off mid-body (%s; %d so far)", peer,
                        type(exc).__name__, self.count)


CUT = _CutUploads()


async def _read_all(request: web.Request, limit: int) -> bytes:
    # StreamReader.read(n) returns what has arrived so far, not n bytes: read to the end
    chunks, size = [], 0
    while True:
        chunk = await request.content.read(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise refusal(f"body is larger than the limit of {limit} bytes", 413,
                          limit=limit, current=size)
        chunks.append(chunk)
