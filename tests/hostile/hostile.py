"""Shared by the hostile tests: a real ``daisychain serve`` process on loopback (its RSS and
open files watched with psutil), a bystander device in a room of its own that must keep
answering, and small hostile clients (raw sockets, raw WebSocket frames, aiohttp).

Loopback is all of 127.0.0.0/8 on Linux, so a client that binds 127.0.0.2 is another
address of the server's local network: the attacker is 127.0.0.1, the bystander 127.0.0.2.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import psutil

ATTACKER = "127.0.0.1"
BYSTANDER = "127.0.0.2"
MB = 1 << 20
#: The bounds every attack must stay within (issue 13, "How it is shown").
MAX_RSS_GROWTH = 200 * MB


def _known_flags_only(flags: tuple[str, ...]) -> tuple[str, ...]:
    """``flags`` less those this ``daisychain serve`` does not know (with their values)."""
    help_ = subprocess.run([sys.executable, "-m", "daisychain.cli", "serve", "--help"],
                           capture_output=True, text=True, cwd="/").stdout
    out, skip = [], False
    for f in flags:
        if f.startswith("--"):
            skip = not re.search(rf"{re.escape(f)}\b", help_)
        if not skip:
            out.append(f)
    return tuple(out)


class ServerProcess:
    """``daisychain serve --host 127.0.0.1 --port 0 FLAGS`` with stderr in a file.

    ``HOSTILE_BASELINE=1`` in the environment drops the flags the server does not know: to
    run these attacks against an older server (e.g. ``PYTHONPATH=<old checkout>``) and see
    them succeed there."""

    def __init__(self, tmp: Path, *flags: str, nofile: int | None = None):
        if os.environ.get("HOSTILE_BASELINE"):
            flags = _known_flags_only(flags)
        self.log_path = tmp / "server.log"
        self._log = open(self.log_path, "w")
        pre = None
        if nofile is not None:
            def pre():
                import resource
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(
                    resource.RLIMIT_NOFILE)[1]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daisychain.cli", "serve", "--host", "127.0.0.1", "--port", "0",
             *flags], stdout=subprocess.PIPE, stderr=self._log, text=True, preexec_fn=pre,
            cwd=tmp,  # not the checkout: the daisychain that is installed (or on PYTHONPATH)
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        m = re.search(r"http://(\S+?):(\d+)/", line)
        if m is None:
            self.stop()
            raise AssertionError(f"server did not start: {line!r} {self.log()}")
        self.url = f"http://127.0.0.1:{m.group(2)}"
        self.port = int(m.group(2))
        self.ps = psutil.Process(self.proc.pid)
        self._peak = 0
        self._sampling = False

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def fds(self) -> int:
        return self.ps.num_fds()

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    @contextlib.contextmanager
    def watch(self):
        """Samples RSS and open files every 20 ms while the block runs; yields a dict that
        afterwards holds ``rss_growth`` (peak minus the start) and ``peak_fds``."""
        out = {"rss0": self.rss(), "fds0": self.fds(), "peak_rss": 0, "peak_fds": 0}
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                with contextlib.suppress(psutil.Error):
                    out["peak_rss"] = max(out["peak_rss"], self.rss())
                    out["peak_fds"] = max(out["peak_fds"], self.fds())
                stop.wait(0.02)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        try:
            yield out
        finally:
            stop.set()
            t.join()
            out["peak_rss"] = max(out["peak_rss"], self.rss())
            out["rss_growth"] = out["peak_rss"] - out["rss0"]
            _report(f"rss_growth_mb={out['rss_growth'] / MB:.1f} "
                    f"fds_growth={out['peak_fds'] - out['fds0']}")

    def attacked(self, coro, fds: int):
        """``run(coro)`` while watching: the RSS growth stays under 200 MB and the open files
        grow by at most ``fds``. Returns what the coroutine returns."""
        with self.watch() as w:
            out = run(coro)
        assert w["rss_growth"] < MAX_RSS_GROWTH, w
        assert w["peak_fds"] - w["fds0"] <= fds, w
        return out

    def assert_healthy(self) -> None:
        """Alive, and no 500 or traceback in its log."""
        assert self.proc.poll() is None, f"the server exited: {self.log()[-3000:]}"
        text = self.log()
        assert "Traceback" not in text and "Error handling request" not in text, text[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._log.close()


# -- clients ----------------------------------------------------------------------------------


def _report(line: str) -> None:
    """``HOSTILE_REPORT=<file>``: one line per measurement, under the running test's name."""
    path = os.environ.get("HOSTILE_REPORT")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(path, "a") as f:
            f.write(f"{test} {line}\n")


def session(local: str = ATTACKER, **kw) -> aiohttp.ClientSession:
    """An aiohttp session whose connections come from ``local`` (a loopback address)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(local, 0), limit=0,
                                                                force_close=True), **kw)


def hello(room="network", name="dev", kind="cpu") -> str:
    return json.dumps({"type": "hello", "version": 1, "name": name, "kind": kind,
                       "capacity": 1, "room": room})


async def recv_json(ws, timeout=5.0) -> dict | None:
    """The next text frame as JSON (strictly: no NaN/Infinity), or None when it closed."""
    m = await ws.receive(timeout=timeout)
    if m.type != aiohttp.WSMsgType.TEXT:
        return None
    return json.loads(m.data, parse_constant=_not_json)


def _not_json(name):
    raise AssertionError(f"the server sent non-JSON: {name}")


async def expect(ws, type_: str, timeout=5.0) -> dict:
    """Read until a message of ``type_``; AssertionError if the socket closes first."""
    deadline = time.monotonic() + timeout
    while True:
        msg = await recv_json(ws, max(0.05, deadline - time.monotonic()))
        if msg is None:
            raise AssertionError(f"closed while waiting for {type_}")
        if msg["type"] == type_:
            return msg


async def device(s: aiohttp.ClientSession, url: str, room="network", name="dev"):
    """A connected device: (ws, welcome, first room/pending/error message)."""
    ws = await s.ws_connect(url + "/ws", autoping=True)
    await ws.send_str(hello(room, name))
    welcome = await expect(ws, "welcome")
    nxt = await recv_json(ws)
    return ws, welcome, nxt


class Bystander:
    """A device at 127.0.0.2 in a private room of its own. ``check()`` times a fresh
    ``/healthz`` request and a signaling round trip (ping -> pong) on its socket."""

    def __init__(self, url: str):
        self.url = url
        self.worst = 0.0

    async def __aenter__(self):
        self.s = session(BYSTANDER)
        self.ws, _, room = await device(self.s, self.url, room="new", name="bystander")
        assert room["type"] == "room" and room["room"] == "private", room
        return self

    async def __aexit__(self, *exc):
        await self.ws.close()
        await self.s.close()

    async def check(self) -> dict:
        t0 = time.monotonic()
        async with session(BYSTANDER) as fresh:
            async with fresh.get(self.url + "/healthz",
                                 timeout=aiohttp.ClientTimeout(total=10)) as r:
                assert r.status == 200
                health = await r.json()
        t_health = time.monotonic() - t0
        t0 = time.monotonic()
        await self.ws.send_str(json.dumps({"type": "ping", "t": t0}))
        await expect(self.ws, "pong", timeout=10)
        t_rtt = time.monotonic() - t0
        self.worst = max(self.worst, t_health, t_rtt)
        _report(f"bystander_healthz_s={t_health:.3f} bystander_rtt_s={t_rtt:.3f}")
        # No timing assert here (timings are measurements, not test outcomes): the bystander
        # must answer at all, within the 10 s liveness deadlines above; the times go to the
        # HOSTILE_REPORT file, where docs/SECURITY.md takes its "within 1 s" figures from.
        return health


async def healthz(url: str) -> dict:
    async with session(BYSTANDER) as s, s.get(url + "/healthz") as r:
        return await r.json()


def raw_ws(port: int, local: str = ATTACKER, rcvbuf: int | None = None,
           headers: str = "") -> socket.socket:
    """A WebSocket opened by hand: after the handshake this socket reads nothing unless
    asked (``rcvbuf`` shrinks what the kernel buffers for it)."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((local, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  f"Sec-WebSocket-Version: 13\r\n{headers}\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError(f"closed during the handshake: {head!r}")
        head += chunk
    if b" 101 " not in head.split(b"\r\n")[0]:
        raise ConnectionError(head.decode(errors="replace"))
    return sock


def ws_frame(text: str) -> bytes:
    """One masked text frame (what a client must send)."""
    data = text.encode()
    mask = os.urandom(4)
    n = len(data)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else
                            bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else
                            bytes([0x80 | 127]) + struct.pack(">Q", n))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def run(coro):
    """asyncio.run in a fresh thread (safe beside other fixtures' loops)."""
    box = {}

    def main():
        try:
            box["v"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            box["e"] = exc

    t = threading.Thread(target=main)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box.get("v")
