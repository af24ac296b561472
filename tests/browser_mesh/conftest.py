"""Mesh-tier fixtures: the real server (``create_app``) on loopback, real Chromium tabs of the
page (``/``), and helpers that wait on the page's explicit state (``window.__daisy``).

WebRTC needs the private network namespace (Chromium ignores loopback for ICE): run these
tests as ``scripts/in-netns.sh .venv/bin/python -m pytest tests/browser_mesh -q``. Outside
it the tests that need a data channel are skipped with that command as the reason.

Chromium's path and flags, and the ``--disable-features`` merge that keeps host candidates
as plain addresses: bench/_chromium.py, shared with the benches and scripts.

Chromium gathers host candidates only when the machine has a default route (it asks the
kernel which interface reaches a public address). ``scripts/in-netns.sh`` sets up none, so
inside the private namespace (and only there) the ``netns_route`` fixture adds
``default dev dc0``: packets for other addresses go into the veth pair, whose other end is
in the same namespace, so still nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mesh_helpers import IN_NETNS, Tab  # noqa: E402

from bench._chromium import BASE_ARGS, CHROMIUM  # noqa: E402
from bench._chromium import disable_features as merged_disable_features  # noqa: E402

from daisychain.server.app import create_app  # noqa: E402
from daisychain.server.config import ServerConfig  # noqa: E402

playwright_sync = pytest.importorskip("playwright.sync_api")



class Server:
    """The app on its own event loop in a thread, on 127.0.0.1:<random> (a secure context)."""

    def __init__(self, app: web.Application):
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""

    def start(self) -> "Server":
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> str:
        self.runner = web.AppRunner(self.app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="package", autouse=True)
def netns_route():
    """A default route inside the private namespace, so Chromium gathers ICE candidates."""
    if IN_NETNS:
        routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
        if "default" not in routes:
            subprocess.run(["ip", "route", "add", "default", "dev", "dc0"], check=True)
    yield


@pytest.fixture(scope="package")
def server():
    app = create_app(ServerConfig(port=0, grace_s=2.0, tick_s=0.2))
    srv = Server(app).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="package")
def server_url(server):
    return server.url


@pytest.fixture(scope="package")
def playwright():
    with playwright_sync.sync_playwright() as p:
        yield p


@pytest.fixture(scope="package")
def disable_features(playwright) -> str:
    """Playwright's own --disable-features list merged with ours."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is not installed (scripts/setup.sh installs it)")
    return merged_disable_features(playwright)


def _launch(playwright, disable_features: str, webgpu: bool):
    args = BASE_ARGS + (["--enable-unsafe-webgpu"] if webgpu else []) + [disable_features]
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=args)
    # A page computes on its faster passing path, and SwiftShader's WebGPU is far slower than
    # the JS units: the WebGPU browser's tabs ask for WebGPU (?path=gpu, mesh_helpers.Tab) so
    # that the mixed rooms keep a member computing through the WGSL kernels.
    b.daisy_path = "gpu" if webgpu else None
    return b


@pytest.fixture(scope="package")
def browser_webgpu(playwright, disable_features):
    b = _launch(playwright, disable_features, webgpu=True)
    yield b
    b.close()


@pytest.fixture(scope="package")
def browser_cpu(playwright, disable_features):
    b = _launch(playwright, disable_features, webgpu=False)
    yield b
    b.close()


@pytest.fixture
def tabs(server_url):
    """tabs(browser, name) -> Tab; all closed at the end of the test."""
    made: list[Tab] = []

    def make(browser, name: str) -> Tab:
        t = Tab(browser, server_url, name)
        made.append(t)
        return t

    yield make
    for t in made:
        try:
            t.close()
        except Exception:  # noqa: BLE001 - already closed by the test
            pass


