"""A desktop window around the local server and page (pywebview).

The server runs on its own event loop in a background thread, bound to 127.0.0.1 only; the
window shows its page. Closing the window stops the server. QtWebEngine has no WebGPU, so
the page trains on the JS CPU units there and says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
from dataclasses import replace
from urllib.parse import quote


class BackgroundServer:
    """``daisychain serve`` on a private event loop in a daemon thread."""

    def __init__(self, config):
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="daisychain-server", daemon=True)
        self._task: asyncio.Task | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def _main(self) -> None:
        from daisychain.server.cli import serve

        asyncio.set_event_loop(self.loop)
        started = asyncio.Event()

        async def watch():
            await started.wait()
            self._ready.set()

        self._task = self.loop.create_task(serve(self.config, started=started))
        self.loop.create_task(watch())
        try:
            self.loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # reported by start()
            self._error = exc
        finally:
            self._ready.set()
            self.loop.close()

    def start(self, timeout: float = 30.0) -> str:
        self.thread.start()
        self._ready.wait(timeout)
        if self._error is not None or not self._ready.is_set():
            raise RuntimeError(f"the local server did not start: {self._error}")
        return f"http://{self.config.host}:{self.config.port}/"

    def stop(self) -> None:
        if self._task is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._task.cancel)
        self.thread.join(10)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _qt_environment() -> None:
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # Chromium refuses root with a sandbox
        flags = os.environ.get("QTWEBENGINE_CHROMIUM_FLAGS", "")
        if "--no-sandbox" not in flags:
            os.environ["QTWEBENGINE_CHROMIUM_FLAGS"] = (flags + " --no-sandbox").strip()


def run_desktop(config, room: str | None = None, probe: float | None = None,
                gui: str | None = None) -> int:
    """Open the window; with ``probe`` seconds, load the page, print what it shows, close."""
    try:
        import webview
    except ImportError:
        print("daisychain desktop needs pywebview: pip install 'daisychain[desktop]'", file=sys.stderr)
        return 2
    _qt_environment()
    if config.port == 0:
        config = replace(config, port=free_port(config.host))
    server = BackgroundServer(config)
    url = server.start()
    if room:
        url += f"?room={quote(room)}"
    print(f"DaisyChain desktop: {url}", flush=True)
    window = webview.create_window("DaisyChain", url, width=1100, height=800)
    result = {"ok": False}

    def probe_page():
        loaded = window.events.loaded.wait(probe)
        result["loaded"] = bool(loaded)
        if loaded:
            info = window.evaluate_js(
                "JSON.stringify({title: document.title, webgpu: !!navigator.gpu, "
                "status: (document.querySelector('#status') || {}).textContent || null})")
            result.update(json.loads(info) if isinstance(info, str) else {"raw": info})
            result["ok"] = bool(result.get("title"))
        window.destroy()

    try:
        webview.start(probe_page if probe else None, gui=gui or "qt")
    finally:
        server.stop()
    if probe:
        print(json.dumps(result), flush=True)
        return 0 if result["ok"] else 1
    return 0
