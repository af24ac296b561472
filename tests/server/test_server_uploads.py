"""The one upload guard (``daisychain.server.uploads``): the per-room shelf and its quotas as
a plain object, then its parse pool on a real loopback server (through a route of the
test's own, as any new upload route would use it), and its limits in ``/healthz`` and
``daisychain serve --help``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from daisychain.engine.data import Dataset
from daisychain.server.app import create_app
from daisychain.server.cli import LIMIT_FLAGS
from daisychain.server.config import ConfigError, ServerConfig
from daisychain.server.uploads import GUARD_KEY, Shelf, guard_of

from server_helpers import FAST, aio


def dataset(seed: int, n: int = 100) -> Dataset:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 30, (n, 8), dtype=np.int32)
    y = rng.integers(0, 30, n, dtype=np.int32)
    return Dataset("text", x, y, x[:10], y[:10], 30, {"source": f"s{seed}"})


def status_of(exc: web.HTTPException) -> int:
    return exc.status


# -- the shelf (no I/O) -------------------------------------------------------------------------


def test_a_full_room_refuses_and_never_pushes_out_its_own_or_another_rooms_sets():
    shelf = Shelf(ServerConfig(room_uploads=2))
    a = [dataset(i) for i in range(3)]
    shelf.add("ROOM-A", "10.0.0.1", a[0], {"n": 0})
    shelf.add("ROOM-A", "10.0.0.1", a[1], {"n": 1})
    with pytest.raises(web.HTTPException) as exc:
        shelf.add("ROOM-A", "10.0.0.1", a[2], {"n": 2})
    assert status_of(exc.value) == 429 and "limit" in exc.value.text
    shelf.add("ROOM-A", "10.0.0.1", a[1], {"n": "again"})  # the same set again replaces itself
    for i in range(2):
        shelf.add("ROOM-B", "10.0.0.2", dataset(10 + i), {"b": i})
    assert [e["n"] for e in shelf.entries("ROOM-A")] == ["again", 0]
    assert shelf.get("ROOM-B", a[0].fingerprint) is None  # another room's set is not its own
    assert shelf.get(None, a[0].fingerprint) is None


def test_byte_quotas_per_room_and_per_address():
    one = len(dataset(0).to_bytes())
    shelf = Shelf(ServerConfig(room_upload_bytes=2 * one + 10, address_upload_bytes=3 * one + 10))
    shelf.add("A", "10.0.0.1", dataset(0), {})
    shelf.add("A", "10.0.0.1", dataset(1), {})
    with pytest.raises(web.HTTPException) as exc:
        shelf.add("A", "10.0.0.1", dataset(2), {})
    assert status_of(exc.value) == 413 and "your room keeps" in exc.value.text
    shelf.add("B", "10.0.0.1", dataset(3), {})
    with pytest.raises(web.HTTPException) as exc:  # the same address, over all its rooms
        shelf.add("C", "10.0.0.1", dataset(4), {})
    assert status_of(exc.value) == 413 and "your address keeps" in exc.value.text
    shelf.add("C", "10.0.0.9", dataset(4), {})  # another address is not charged for it
    shelf.drop_closed(lambda room: room != "A")
    assert shelf.entries("A") == [] and shelf.by_address["10.0.0.1"] == one
    shelf.add("D", "10.0.0.1", dataset(5), {})  # room A's bytes went back to its uploader
    assert shelf.stats()["rooms_closed"] == 1


def test_uploads_by_must_be_host_or_members():
    with pytest.raises(ConfigError, match="uploads_by"):
        ServerConfig(uploads_by="anyone")
    with pytest.raises(ConfigError, match="parse_workers"):
        ServerConfig(parse_workers=0)


# -- the parse pool, on a real server -------------------------------------------------------------


async def _serve(cfg: ServerConfig, gate: threading.Event):
    async def work(request: web.Request) -> web.Response:  # an upload route of the future
        await guard_of(request).work(request, gate.wait, 30)
        return web.Response(text="done")

    app = create_app(cfg, extra_routes=[web.post("/work", work)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, app, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def _post(url: str, local: str) -> tuple[int, str]:
    conn = aiohttp.TCPConnector(local_addr=(local, 0))
    async with aiohttp.ClientSession(connector=conn) as s, s.post(url + "/work") as r:
        return r.status, await r.text()


@aio
async def test_the_parse_pool_holds_one_parse_per_address_and_a_bounded_queue():
    """One address cannot take more than its share of the parse pool; other addresses (other
    rooms) still get theirs; beyond the queue every caller gets 503 at once."""
    gate = threading.Event()
    runner, app, url = await _serve(ServerConfig(**FAST, parse_workers=1), gate)
    guard = app[GUARD_KEY]
    try:
        first = asyncio.create_task(_post(url, "127.0.0.1"))
        while guard.busy < 1:
            await asyncio.sleep(0.01)
        st, text = await _post(url, "127.0.0.1")
        assert st == 503 and "your address has 1 uploads being parsed" in text
        other = asyncio.create_task(_post(url, "127.0.0.2"))  # waits for the one worker
        while guard.busy < 2:
            await asyncio.sleep(0.01)
        st, text = await _post(url, "127.0.0.3")
        assert st == 503 and "the server is parsing 2 uploads" in text
        gate.set()
        assert await first == (200, "done") and await other == (200, "done")
        async with aiohttp.ClientSession() as s, s.get(url + "/healthz") as r:
            uploads = (await r.json())["uploads"]
        assert uploads["refused"] == {"parses_per_address": 1, "parse_queue": 1}
        assert uploads["parsing"] == {"limit": 2, "current": 0}
    finally:
        gate.set()
        await runner.cleanup()


@aio
async def test_a_parse_past_its_time_is_answered_503_and_its_slot_held_until_it_ends():
    gate = threading.Event()
    runner, app, url = await _serve(ServerConfig(**FAST, parse_timeout_s=0.3), gate)
    guard = app[GUARD_KEY]
    try:
        st, text = await _post(url, "127.0.0.1")
        assert st == 503 and "took longer than 0.3 s" in text
        assert guard.busy == 1  # the thread still runs: its address may not start another
        st, text = await _post(url, "127.0.0.1")
        assert st == 503 and "being parsed" in text
        gate.set()
        while guard.busy:
            await asyncio.sleep(0.01)
        assert not guard.parsing
    finally:
        gate.set()
        await runner.cleanup()


# -- the limits, shown --------------------------------------------------------------------------

UPLOAD_LIMITS = ("room_uploads", "room_upload_bytes", "address_upload_bytes", "uploads_per_min",
                 "parses_per_address", "parse_workers", "parse_timeout_s", "upload_max_columns",
                 "upload_max_rows", "upload_max_classes", "qr_per_min", "body_timeout_s",
                 "max_uploads")


@aio
async def test_healthz_shows_the_upload_limits_and_where_they_stand():
    runner, app, url = await _serve(ServerConfig(**FAST), threading.Event())
    try:
        async with aiohttp.ClientSession() as s, s.get(url + "/healthz") as r:
            body = await r.json()
    finally:
        await runner.cleanup()
    for name in UPLOAD_LIMITS:
        assert body["limits"][name] == getattr(ServerConfig(), name), name
    assert body["limits"]["uploads_by"] == "host"
    assert {"room_uploads", "room_upload_bytes", "address_upload_bytes", "parsing",
            "parses_per_address"} <= set(body["uploads"])
    assert body["uploads"]["cut_mid_body"] >= 0


def test_serve_help_names_every_upload_limit():
    out = subprocess.run([sys.executable, "-m", "daisychain.cli", "serve", "--help"],
                         capture_output=True, text=True, timeout=120).stdout
    flags = {dest: flag for flag, dest, _, _ in LIMIT_FLAGS}
    for name in UPLOAD_LIMITS:
        assert flags[name] in out, name
    assert "--uploads-by {host,members}" in out
