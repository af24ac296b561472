"""A real server app on loopback that also serves given datasets at /data/<task>.dcds (the
image sets of the conv tests), started on its own event loop in a thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from aiohttp import web

from daisychain.server.app import create_app
from daisychain.server.config import ServerConfig


@contextlib.contextmanager
def serving(datasets: dict):
    """Yield the base URL of create_app(datasets=datasets) bound to 127.0.0.1:<random>."""
    app = create_app(ServerConfig(port=0), datasets=datasets)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, site._server.sockets[0].getsockname()[1]

    runner, port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
