"""Sharing a private room: the join links other devices can reach, and their QR codes.

``GET /share?room=CODE`` answers ``{"links": [{"url", "label", "lan"}], "note": str}``: the
page's own address first unless it is a loopback one (a phone cannot open
``http://127.0.0.1``), then this machine's LAN addresses (IPv4, from ``psutil``) on the
server's port, when the server listens on them. ``note`` says what a plain-http LAN page
gets (the JS units: WebGPU needs a secure context) or why no LAN link is offered.

``GET /share/qr.svg?room=CODE&origin=http://HOST:PORT`` is the QR code (SVG, by ``segno``)
of ``ORIGIN/?room=CODE``. Both check the code's form and the origin's (scheme, host, port,
no path, at most ``MAX_ORIGIN`` characters), so the server never draws arbitrary text. A code
is drawn in one worker thread, never in the event loop, at most ``--qr-per-min`` per client
address (429 beyond, the ``UploadGuard``'s per-address buckets), and the last ``QR_CACHE``
drawings are kept by link (a cached one costs no drawing and no budget).
"""

from __future__ import annotations

import asyncio
import io
import ipaddress
import re
import socket
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from aiohttp import web

from ..keys import CONFIG_KEY

CODE_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{4}-[0-9A-HJKMNP-TV-Z]{4}-[0-9A-HJKMNP-TV-Z]{2}$")
HOST_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]{1,253})(:[0-9]{1,5})?$")

MAX_ORIGIN = 200
QR_CACHE = 64
QR_CACHE_KEY = web.AppKey("daisychain_qr_cache", OrderedDict)

PLAIN_HTTP_NOTE = ("A page opened on a LAN address over plain http trains on the JS units "
                   "(browsers keep WebGPU for secure contexts: https or localhost).")


def _room(request: web.Request) -> str:
    code = request.query.get("room", "").strip().upper()
    if not CODE_RE.match(code):
        raise web.HTTPBadRequest(text="room must be a private room code like K7QM-4XZP-9R")
    return code


def _is_loopback(host: str) -> bool:
    h = host.strip("[]").lower()
    if h in ("localhost", "localhost.") or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def lan_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback and link-local, sorted."""
    found: set[str] = set()
    try:
        import psutil

        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family == socket.AF_INET:
                    found.add(a.address)
    except Exception:  # noqa: BLE001 - psutil missing or the OS says no: no LAN links
        return []
    out = []
    for a in found:
        ip = ipaddress.ip_address(a)
        if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast):
            out.append(a)
    return sorted(out, key=lambda a: ipaddress.ip_address(a))


def _listening(request: web.Request) -> tuple[str, int]:
    """(address the server listens on, its port) for the socket this request came in on."""

    sock = request.transport.get_extra_info("sockname") if request.transport else None
    port = int(sock[1]) if sock else int(request.url.port or 80)
    return request.app[CONFIG_KEY].host, port


def share_links(request: web.Request, code: str) -> dict:
    scheme = request.scheme
    host = request.host
    if not HOST_RE.match(host):
        raise web.HTTPBadRequest(text="the request's Host header is not a host name")
    bind, port = _listening(request)
    links: list[dict] = []
    if not _is_loopback(urlsplit(f"//{host}").hostname or ""):
        links.append({"url": f"{scheme}://{host}/?room={code}", "label": "this page's address",
                      "lan": False})
    note = ""
    if bind in ("0.0.0.0", "", "::"):
        lan = [a for a in lan_addresses() if f"{a}:{port}" != host]
    else:
        lan = [bind] if bind and not _is_loopback(bind) and f"{bind}:{port}" != host else []
    for a in lan:
        links.append({"url": f"http://{a}:{port}/?room={code}", "label": f"LAN address {a}",
                      "lan": True})
    if any(link["lan"] for link in links):
        note = PLAIN_HTTP_NOTE
    elif not links:
        note = (f"The server listens on {bind} only, which other devices cannot reach: start "
                f"it with `daisychain serve --host 0.0.0.0` to share the room on your network.")
    if not links:  # nothing better: the page's own address still works on this machine
        links.append({"url": f"{scheme}://{host}/?room={code}", "label": "this machine only",
                      "lan": False})
    return {"links": links, "note": note}


async def _share(request: web.Request) -> web.Response:
    return web.json_response(share_links(request, _room(request)),
                             headers={"Cache-Control": "no-store"})


def draw_qr(url: str) -> bytes:
    """The SVG of ``url``'s QR code (segno)."""
    import segno

    buf = io.BytesIO()
    segno.make(url, error="m", micro=False).save(buf, kind="svg", scale=6, border=2,
                                                  dark="#111", light="#fff",
                                                  title=f"QR code of {url}")
    return buf.getvalue()


async def _qr(request: web.Request) -> web.Response:
    from ..uploads import guard_of

    code = _room(request)
    origin = request.query.get("origin", "")
    parts = urlsplit(origin) if len(origin) <= MAX_ORIGIN else None
    if (parts is None or parts.scheme not in ("http", "https")
            or not HOST_RE.match(parts.netloc or "") or parts.path not in ("", "/")
            or parts.query or parts.fragment):
        raise web.HTTPBadRequest(text=f"origin must look like http://HOST:PORT (no path, at "
                                      f"most {MAX_ORIGIN} characters)")
    url = f"{parts.scheme}://{parts.netloc}/?room={code}"
    cache: OrderedDict = request.app.get(QR_CACHE_KEY)
    if cache is None:
        cache = _FALLBACK_CACHE.setdefault(id(request.app), OrderedDict())
    svg = cache.get(url)
    if svg is None:
        guard = guard_of(request)
        guard.charge(request, "QR code", guard.config.qr_per_min)
        # ~15-20 ms of CPU: off the event loop, one at a time (fewer threads fighting the
        # event loop for the GIL)
        svg = await asyncio.get_running_loop().run_in_executor(_QR_POOL, draw_qr, url)
        cache[url] = svg
        while len(cache) > QR_CACHE:
            cache.popitem(last=False)
    else:
        cache.move_to_end(url)
    return web.Response(body=svg, content_type="image/svg+xml",
                        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                                 "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'"})


_FALLBACK_CACHE: dict[int, OrderedDict] = {}  # apps not made by create_app
_QR_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="daisy-qr")


def share_routes() -> list[web.AbstractRouteDef]:
    return [web.get("/share", _share), web.get("/share/qr.svg", _qr)]
