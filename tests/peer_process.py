"""Shared by the mesh-tier tests: a real ``daisy-peer`` process (stderr in a file to poll,
stdout for the summary) and the real server app on a thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
PEER = [sys.executable, "-c", "import sys; from daisychain.peer.cli import main; sys.exit(main())"]


@contextlib.contextmanager
def server_thread(datasets=None, **config):
    """``create_app`` on 127.0.0.1:<random> in a thread with its own event loop; yields the
    base URL. ``config`` overrides ServerConfig fields (fast grace and tick by default);
    ``datasets`` are the server's own sets (``create_app``'s)."""
    from daisychain.server.app import create_app
    from daisychain.server.config import ServerConfig

    started = threading.Event()
    box = {}

    def serve():
        loop = asyncio.new_event_loop()
        box["loop"] = loop

        async def up():
            cfg = ServerConfig(**{"grace_s": 0.5, "tick_s": 0.1, **config, "host": "127.0.0.1",
                                  "port": 0})
            runner = web.AppRunner(create_app(cfg, datasets=datasets), handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            box["runner"], box["port"] = runner, site._server.sockets[0].getsockname()[1]
            started.set()

        loop.run_until_complete(up())
        loop.run_forever()
        loop.run_until_complete(box["runner"].cleanup())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert started.wait(20), "the server did not start"
    try:
        yield f"http://127.0.0.1:{box['port']}"
    finally:
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        t.join(10)


def _default_sigint() -> None:
    """The peer takes Ctrl-C as a terminal user's process does. A test run started in the
    background by a non-interactive shell inherits SIGINT ignored (POSIX), and Python then
    leaves it ignored: test_ctrl_c's SIGINT did nothing (the stack dump showed the peer
    training on)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_hung(proc: subprocess.Popen) -> tuple[str, str]:
    """A daisy-peer that did not exit in time: every thread's stack to its stderr (SIGUSR1,
    faulthandler), then killed; (stdout, stderr) of what it wrote and the pipes still held."""
    if hasattr(signal, "SIGUSR1"):
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
    proc.kill()
    out, err = proc.communicate()
    return out or "", err or ""


class PeerProcess:
    def __init__(self, server: str, *args: str, name: str, err_dir: Path,
                 command: list[str] | None = None):
        self.name = name
        self.err_path = Path(err_dir) / f"dc-peer-{name}-{time.time_ns()}.err"
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen([*(command or PEER), "--server", server, "--name", name,
                                      *args], stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, cwd=ROOT, preexec_fn=_default_sigint)

    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_for(self, pattern: str, timeout=60.0) -> re.Match:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = re.search(pattern, self.stderr())
            if m:
                return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: no {pattern!r} in:\n{self.stderr()[-3000:]}")

    def finish(self, timeout=120.0) -> tuple[int, str]:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_hung(self.proc)
            raise AssertionError(f"{self.name} did not finish:\n{self.stderr()[-6000:]}")
        return self.proc.returncode, out

    def hash(self) -> str:
        rc, out = self.finish()
        m = re.search(r"^params-sha256: ([0-9a-f]{64})$", out, re.M)
        assert rc == 0 and m, f"{self.name} rc={rc}\n{out}\n{self.stderr()[-3000:]}"
        return m.group(1)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.err.close()
