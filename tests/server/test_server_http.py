"""Functional tier: the real server on loopback, over HTTP — files, MIME types, cache headers,
no path traversal, /healthz, /ice-servers, extension points, and the CLI's clean Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

import daisychain
from daisychain.server.app import HUB_KEY, create_app
from daisychain.server.config import ConfigError, ServerConfig

from server_helpers import run_async, aio, running_server


@pytest.fixture
def folders(tmp_path: Path) -> dict:
    web_ = tmp_path / "webui"
    (web_ / "lib").mkdir(parents=True)
    (web_ / "index.html").write_text("<!doctype html><title>t</title>")
    (web_ / "lib" / "protocol.js").write_text("export const x = 1;\n")
    (web_ / "mod.mjs").write_text("export default 2;\n")
    sh = tmp_path / "shaders"
    sh.mkdir()
    (sh / "gemm.wgsl").write_text("@compute @workgroup_size(1) fn main() {}\n")
    (tmp_path / "secret.txt").write_text("do not serve")
    return {"webui": web_, "shaders": sh}


@aio
async def test_files_mime_types_and_cache_headers(folders):
    async with running_server(folders=folders) as (base, _), aiohttp.ClientSession() as s:
        expect = {"/": "text/html", "/webui/lib/protocol.js": "text/javascript",
                  "/webui/mod.mjs": "text/javascript", "/shaders/gemm.wgsl": "text/wgsl",
                  "/luts/manifest.json": "application/json",
                  "/luts/mul.bin": "application/octet-stream", "/golden/units.json": "application/json"}
        for path, ctype in expect.items():
            async with s.get(base + path) as r:
                assert r.status == 200, path
                assert r.content_type == ctype, path
                assert r.headers["Cache-Control"] == "no-cache"
                etag = r.headers["ETag"]
                body = await r.read()
            async with s.get(base + path, headers={"If-None-Match": etag}) as r:
                assert r.status == 304 and await r.read() == b""
            async with s.get(base + path + "?v=" + etag.strip('"')) as r:
                assert "immutable" in r.headers["Cache-Control"] and await r.read() == body
        lut = Path(str(daisychain.package_path("luts", "mul.bin"))).read_bytes()
        async with s.get(base + "/luts/mul.bin") as r:
            assert await r.read() == lut


@aio
async def test_no_path_traversal(folders):
    async with running_server(folders=folders) as (base, _), aiohttp.ClientSession() as s:
        for raw in ["/webui/../secret.txt", "/webui/%2e%2e/secret.txt", "/webui/..%2fsecret.txt",
                    "/webui/lib/../../secret.txt", "/shaders/..%2f..%2fsecret.txt",
                    "/webui/%2fetc%2fpasswd", "/luts/..%5c..%5cserver", "/webui/.",
                    "/shaders/gemm.js", "/luts/nope.bin"]:
            async with s.get(URL(base + raw, encoded=True)) as r:
                assert r.status == 404, raw
                assert b"do not serve" not in await r.read()


@aio
async def test_missing_page_gives_a_clear_404(tmp_path):
    async with running_server(folders={"webui": tmp_path}) as (base, _), aiohttp.ClientSession() as s:
        for path in ("/", "/selftest"):
            async with s.get(base + path) as r:
                assert r.status == 404 and "not built yet" in await r.text()


@aio
async def test_healthz_and_ice_servers():
    ice = ({"urls": "stun:stun.example.org:3478"},
           {"urls": ["turn:turn.example.org"], "username": "u", "credential": "c"})
    async with running_server(ice_servers=ice) as (base, _), aiohttp.ClientSession() as s:
        async with s.get(base + "/healthz") as r:
            h = await r.json()
            assert h["ok"] and h["protocol"] == 1 and h["connections"] == 0
        async with s.get(base + "/ice-servers") as r:
            assert await r.json() == {"iceServers": [dict(x) for x in ice]}


def test_bad_settings_are_refused_with_a_message():
    with pytest.raises(ConfigError, match="CIDR"):
        ServerConfig(trust_proxy=("not-a-net",))
    with pytest.raises(ConfigError, match="urls"):
        ServerConfig(ice_servers=({"urls": "http://x"},))
    with pytest.raises(ConfigError, match="max_room_size"):
        ServerConfig(max_room_size=0)


@aio
async def test_extra_routes_and_hub_key():
    async def data(request):
        return web.json_response({"rooms": request.app[HUB_KEY].stats()["rooms"]})

    app = create_app(ServerConfig(), extra_routes=[web.get("/data/x", data)])
    app.router.add_get("/data/y", data)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        async with aiohttp.ClientSession() as s:
            for path in ("/data/x", "/data/y"):
                async with s.get(base + path) as r:
                    assert await r.json() == {"rooms": 0}
    finally:
        await runner.cleanup()


def test_cli_prints_url_and_stops_cleanly_on_ctrl_c():
    proc = subprocess.Popen(
        [sys.executable, "-m", "daisychain.cli", "serve", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://\S+/", line).group(0)

        async def probe():
            async with aiohttp.ClientSession() as s, s.get(url + "healthz") as r:
                return await r.json()
        assert run_async(probe())["ok"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_reads_ice_servers_file(tmp_path):
    from daisychain.cli import build_parser
    from daisychain.server.cli import config_from_args

    f = tmp_path / "ice.json"
    f.write_text(json.dumps([{"urls": "stun:127.0.0.1:3478"}]))
    args = build_parser().parse_args(["serve", "--ice-servers", str(f), "--trust-proxy",
                                      "10.0.0.0/8", "fd00::/8", "--max-room-size", "5"])
    cfg = config_from_args(args)
    assert cfg.ice_servers == ({"urls": "stun:127.0.0.1:3478"},)
    assert len(cfg.trusted_networks) == 2 and cfg.max_room_size == 5
