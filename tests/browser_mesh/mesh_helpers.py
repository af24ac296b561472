"""Helpers for the mesh-tier tests: a tab of the page that logs, and the netns marker."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

IN_NETNS = os.environ.get("DAISY_IN_NETNS") == "1"
NETNS_HINT = ("WebRTC needs the private network namespace: "
              "scripts/in-netns.sh .venv/bin/python -m pytest tests/browser_mesh -q")
log = logging.getLogger("browser_mesh")

needs_netns = pytest.mark.skipif(not IN_NETNS, reason=NETNS_HINT)


class Tab:
    """One page of the product in its own browser context (its own storage, its own device)."""

    def __init__(self, browser, base: str, name: str):
        self.context = browser.new_context()
        self.name = name
        self.base = base
        self.path = getattr(browser, "daisy_path", None)  # ?path= every tab of this browser asks for
        self.page = self.context.new_page()
        self.page.on("console", lambda m: log.info("[%s console.%s] %s", name, m.type, m.text))
        self.page.on("pageerror", lambda e: log.error("[%s pageerror] %s", name, e))

    def open(self, query: str = "") -> "Tab":
        if self.path and "path=" not in query:
            query = f"{query}&path={self.path}" if query else f"path={self.path}"
        sep = "&" if query else ""
        self.page.goto(f"{self.base}/?name={self.name}{sep}{query}")
        self.wait("window.__daisy && window.__daisy.device !== null", 120_000)
        return self

    def state(self, expr: str = "window.__daisy"):
        return self.page.evaluate(f"() => JSON.parse(JSON.stringify({expr}))")

    def wait(self, js: str, timeout_ms: int = 60_000):
        self.page.wait_for_function(js, timeout=timeout_ms)

    @property
    def id(self) -> str:
        return self.page.evaluate("() => window.__daisy.id")

    def close(self) -> None:
        self.context.close()


# Every event of the page's bus, kept per type (the last one, and all of them): evaluate
# RECORD in a tab, then read `${EV}[type]` (or window.__ev.all[type]).
RECORD = """() => {
  const ev = window.__ev = { last: {}, all: {} };
  window.__daisy.mesh.bus.on("*", (d, t) => { ev.last[t] = d; (ev.all[t] ||= []).push(d); });
}"""
EV = "window.__ev.last"


@contextlib.contextmanager
def hosted_room(server_url: str, run: list[str], err_path: Path, cwd=None, wait_peers: int = 1):
    """A real ``daisy-peer`` hosting a new private room for ``wait_peers`` more devices with the
    run flags ``run`` (``--json`` summary on stdout); yields (process, room code). Killed at
    the end if it is still running."""
    err = Path(err_path).open("w+")
    host = subprocess.Popen([str(Path(sys.executable).parent / "daisy-peer"), "--server", server_url,
                             "--create-room", "--approve", "all", "--wait-peers", str(wait_peers), "--name",
                             "py-host", "--json", *run],
                            stdout=subprocess.PIPE, stderr=err, text=True, cwd=cwd)
    try:
        code, t0 = None, time.monotonic()
        while code is None and time.monotonic() - t0 < 60 and host.poll() is None:
            err.seek(0)
            m = re.search(r"room ([0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{2})", err.read())
            code = m.group(1) if m else None
            time.sleep(0.2)
        assert code, Path(err_path).read_text()[-2000:]
        yield host, code
    finally:
        if host.poll() is None:
            host.kill()
            host.wait(10)
        err.close()
