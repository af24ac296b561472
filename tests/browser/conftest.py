"""Browser-tier fixtures: the real server on loopback, and headless Chromium.

The server is ``daisychain.server.app.create_app`` on 127.0.0.1 with a random port
(``/selftest``, ``/webui/<path>``, ``/shaders/<name>.wgsl``, ``/luts/<file>``,
``/golden/<file>``, ``/data/<task>.dcds``). Chromium is the system one
(``/usr/bin/chromium``, never ``playwright install``);
every page forwards ``console`` and ``pageerror`` into the test log, and tests wait for the
page's explicit ready marker (``window.__selftestDone``) before reading ``#result``.

Flags: Playwright already passes one ``--disable-features=...`` list of its own and Chromium
keeps only the last such flag, so these fixtures pass none (nothing of ours needs
disabling); if one is ever needed, merge it with Playwright's via ``ignore_default_args``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
from aiohttp import web
from browser_helpers import open_page

from bench._chromium import BASE_ARGS, CHROMIUM, WEBGPU_ARGS
from daisychain.server.app import create_app
from daisychain.server.config import ServerConfig

playwright_sync = pytest.importorskip("playwright.sync_api")



def _app() -> web.Application:
    app = create_app(ServerConfig(port=0))
    return app


class _Server:
    """An aiohttp app on its own event loop in a thread, bound to <host>:<random>."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1"):
        self.app = app
        self.host = host
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""

    def start(self) -> "_Server":
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> str:
        self.runner = web.AppRunner(self.app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"http://{self.host}:{port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="session")
def server_url():
    server = _Server(_app()).start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def lan_server_url():
    """The server on the private namespace's veth address: a page from there is NOT a secure
    context (no crypto.subtle, no WebGPU), like a LAN device opening http://192.168.x.y."""
    if os.environ.get("DAISY_IN_NETNS") != "1":
        pytest.skip("needs the private network namespace: run through scripts/in-netns.sh "
                    "(scripts/test.sh does)")
    server = _Server(_app(), host="10.77.0.1").start()
    yield server.url
    server.stop()


# Module scope, not session: a running sync Playwright keeps an asyncio loop alive in the
# main thread, and every later test that calls asyncio.run() would fail.
@pytest.fixture(scope="module")
def playwright():
    with playwright_sync.sync_playwright() as p:
        yield p


def _launch(playwright, webgpu: bool):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is not installed (scripts/setup.sh installs it)")
    return playwright.chromium.launch(executable_path=CHROMIUM,
                                      args=BASE_ARGS + (WEBGPU_ARGS if webgpu else []))


@pytest.fixture(scope="module")
def browser_webgpu(playwright):
    browser = _launch(playwright, webgpu=True)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def browser_nogpu(playwright):
    browser = _launch(playwright, webgpu=False)
    yield browser
    browser.close()


@pytest.fixture
def gpu_page(browser_webgpu):
    page = open_page(browser_webgpu, "webgpu")
    yield page
    page.close()


@pytest.fixture
def cpu_page(browser_nogpu):
    page = open_page(browser_nogpu, "no-webgpu")
    yield page
    page.close()
