"""Sockets: one address cannot fill the network room, hold the process's files, or keep
requests half-open (slowloris); the file limit is raised at start and /healthz answers."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import psutil

from hostile import (ATTACKER, MAX_RSS_GROWTH, Bystander, device, healthz, hello, recv_json,
                     run, session)


def test_sockets_from_one_address_leave_the_network_room_to_other_devices(serve):
    """Regression: 64 sockets from one address filled the network room (64 seats), so the
    real devices of that network got room_full."""
    srv = serve()

    async def attack():
        async with Bystander(srv.url) as by, session(ATTACKER) as s:
            held, refusals = [], []
            with srv.watch() as w:
                for i in range(64):
                    try:
                        ws = await s.ws_connect(srv.url + "/ws")
                    except aiohttp.WSServerHandshakeError as exc:
                        refusals.append({"http": exc.status})
                        continue
                    await ws.send_str(hello("network", f"attacker-{i}"))
                    msg = await recv_json(ws)
                    if msg is not None and msg["type"] == "welcome":
                        held.append(ws)
                    else:
                        refusals.append(msg)
                        await ws.close()
                # another device of the same (local) network still gets its seat
                async with session("127.0.0.3") as s3:
                    ws3, _, first = await device(s3, srv.url, "network", "real-device")
                    assert first["type"] == "room" and first["room"] == "network", first
                    await ws3.close()
                await by.check()
            health = await healthz(srv.url)
            for ws in held:
                await ws.close()
            return held, refusals, health, w

    held, refusals, health, w = run(attack())
    assert len(held) == 16  # --max-connections-per-address
    ws_refusals = [r for r in refusals if r and "code" in r]
    assert ws_refusals and all(r["code"] == "rate_limited" and r["limit"] == 16
                               and r["current"] == 16 and "16" in r["message"]
                               for r in ws_refusals), ws_refusals[:3]
    assert health["per_address"]["connections"] == {"limit": 16, "current": 16}
    assert health["refused"]["connections_per_address"] >= 40
    assert w["rss_growth"] < MAX_RSS_GROWTH
    assert w["peak_fds"] - w["fds0"] <= 16 + 16, w
    srv.assert_healthy()


def _half_open(port: int, local: str, n: int) -> tuple[list[socket.socket], int]:
    """``n`` connections that start a request and never finish its headers."""
    held, refused = [], 0
    for _ in range(n):
        s = socket.socket()
        s.bind((local, 0))
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n")
        except OSError:
            refused += 1
            s.close()
            continue
        held.append(s)
    return held, refused


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(0.05)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except (TimeoutError, socket.timeout):
        return False
    except OSError:
        return True


def test_slowloris_and_half_open_requests_are_bounded_and_cut(serve):
    """Regression: ~1,000 half-open requests (a header line every few seconds) held one file
    each with no header timeout, until the 1,024-file soft limit stopped /healthz and /ws."""
    srv = serve("--header-timeout", "1.5", nofile=1024)
    soft, hard = srv.ps.rlimit(psutil.RLIMIT_NOFILE)
    assert soft == hard and soft > 1024, (soft, hard)  # raised to the hard limit at start

    async def attack():
        async with Bystander(srv.url) as by:
            with srv.watch() as w:
                held, refused = await asyncio.to_thread(_half_open, srv.port, ATTACKER, 600)
                for _ in range(4):  # trickle a header line into every one, as a slowloris does
                    for s in held:
                        try:
                            s.send(b"X-More: 1\r\n")
                        except OSError:
                            pass
                    await by.check()
                    await asyncio.sleep(0.5)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    open_ = [s for s in held if not _closed_by_server(s)]
                    if not open_:
                        break
                    await asyncio.sleep(0.2)
                health = await by.check()
            for s in held:
                s.close()
            return held, refused, open_, health, w

    held, refused, open_, health, w = run(attack())
    assert open_ == [], f"{len(open_)} half-open requests still held after the header timeout"
    # --max-sockets-per-address, plus what the event loop accepts before it looks (a few
    # rounds of the listen backlog, 128): bounded, whatever the number of attackers
    assert w["peak_fds"] - w["fds0"] <= 48 + 3 * 128 + 16, w
    assert health["http"]["sockets"]["limit"] <= soft - 512
    assert health["http"]["sockets"]["current"] <= 4  # the bystander's, all others cut
    assert w["rss_growth"] < MAX_RSS_GROWTH
    srv.assert_healthy()


def test_at_the_socket_cap_half_open_requests_make_room_for_healthz(serve):
    """Many addresses holding half-open requests up to the server's socket cap: the oldest
    incomplete one is closed for each new connection, so /healthz still answers."""
    srv = serve("--max-sockets", "40", "--max-sockets-per-address", "1000",
                "--header-timeout", "30")

    async def attack():
        async with Bystander(srv.url) as by:
            with srv.watch() as w:
                held = []
                for local in ("127.0.0.1", "127.0.0.3", "127.0.0.4"):
                    got, _ = await asyncio.to_thread(_half_open, srv.port, local, 200)
                    held += got
                for _ in range(3):
                    health = await by.check()
            for s in held:
                s.close()
            return health, w

    health, w = run(attack())
    assert w["peak_fds"] - w["fds0"] <= 40 + 3 * 128 + 16, w
    assert w["rss_growth"] < MAX_RSS_GROWTH, w
    assert health["http"]["sockets"]["limit"] == 40
    assert health["http"]["evicted_at_cap"] >= 300
    srv.assert_healthy()


def test_malformed_requests_cost_one_log_line_not_a_traceback_each(serve):
    """aiohttp logged a traceback for every malformed request (an oversize header line, a
    bad header): a hostile client could fill the log at will."""
    srv = serve()

    def spam():
        for i in range(60):
            s = socket.socket()
            s.bind((ATTACKER, 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", srv.port))
            bad = (b"X-Big: " + b"a" * 9000) if i % 2 else b"Bad Header Without Colon"
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + bad + b"\r\n\r\n")
            head = s.recv(100)
            assert head.split(b" ")[1] == b"400", head
            s.close()

    async def attack():
        async with Bystander(srv.url) as by:
            await asyncio.to_thread(spam)
            return await by.check()

    health = srv.attacked(attack(), fds=16)
    assert health["http"]["bad_requests"] == 60
    log = srv.log()
    assert "Traceback" not in log and len(log.splitlines()) <= 2, log[-2000:]
    assert "refused a malformed HTTP request" in log
