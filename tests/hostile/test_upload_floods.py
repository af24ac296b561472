"""Hardening II (issue 25), in the attacker's shoes against a real ``daisychain serve``:
uploads that stall on ``/datasets/upload``, a CSV bomb and a text of 148,000 distinct
characters, uploads cut off mid-body (a traceback each in the log), a QR-code flood, and
``daisychain export`` of a file larger than any checkpoint. Each test fails on the server
before issue 25; each checks that a bystander in another room still answers and that the
server's memory stays within 200 MB of where it started."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from hostile import ATTACKER, MB, Bystander, expect, hello, run, session

TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom.\n") * 8


async def credential(url: str, local: str = ATTACKER):
    """A device that opened a private room of its own (so it may upload): (session, ws, token)."""
    s = session(local)
    ws = await s.ws_connect(url + "/ws")
    await ws.send_str(hello("new", "attacker"))
    welcome = await expect(ws, "welcome")
    await expect(ws, "room")
    return s, ws, welcome["token"]


def raw_post(port: int, path: str, head: str, body: bytes, local: str = ATTACKER) -> socket.socket:
    sock = socket.socket()
    sock.bind((local, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode() + body)
    return sock


def status_within(sock: socket.socket, deadline: float) -> int | None:
    """The HTTP status the server answers on ``sock`` before ``deadline``, or None."""
    data = b""
    while b"\r\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return None
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None


def closed_by(sock: socket.socket, deadline: float) -> bool:
    """Whether the server closes ``sock`` before ``deadline`` (what it sends is dropped)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return False
        try:
            if not sock.recv(65536):
                return True
        except ConnectionError:
            return True


def test_stalled_data_uploads_are_cut_at_the_body_timeout(serve):
    """Six uploads from one address that send 1,000 of 100,000 bytes and stall: the data
    upload read its body itself, without ``--body-timeout`` or ``--max-uploads`` (all six
    stayed open). Now 2 are read (408 after 4 s), the other 4 get 503 at once; a stranger
    without a credential gets 401 before any of its body is read."""
    srv = serve("--body-timeout", "4", "--max-uploads", "2")

    async def main():
        s, ws, token = await credential(srv.url)
        async with Bystander(srv.url) as by:
            head = f"X-Daisy-Token: {token}\r\nContent-Length: 100000\r\n"
            socks = [raw_post(srv.port, "/datasets/upload?name=a.txt", head, b"a" * 1000)
                     for _ in range(6)]
            stranger = raw_post(srv.port, "/datasets/upload?name=a.txt",
                                "Content-Length: 100000\r\n", b"", "127.0.0.9")
            await asyncio.sleep(1)
            await by.check()
            deadline = time.monotonic() + 4 + 8  # the body timeout, then a liveness margin
            codes = await asyncio.to_thread(lambda: sorted(status_within(k, deadline)
                                                           for k in socks))
            no_cred = await asyncio.to_thread(status_within, stranger, time.monotonic() + 5)
            # and every refused socket is closed soon after its answer (aiohttp lingered 10 s
            # reading the rest of a body nobody wanted)
            deadline = time.monotonic() + 2 + 6  # guard.LINGER_S, then a liveness margin
            closed = await asyncio.to_thread(lambda: [closed_by(k, deadline)
                                                      for k in (*socks, stranger)])
            for k in (*socks, stranger):
                k.close()
            await by.check()
        await ws.close()
        await s.close()
        return codes, no_cred, closed

    codes, no_cred, closed = srv.attacked(main(), fds=64)
    assert codes == [408, 408, 503, 503, 503, 503], codes
    assert no_cred == 401
    assert all(closed), closed
    srv.assert_healthy()


def test_at_the_socket_cap_stalled_uploads_make_room_for_healthz(serve):
    """Stalled uploads from several addresses, reopened as soon as they close, up to the
    socket cap: a connection that owed an upload's body could not be closed to make room
    (only ones without a complete request could), so /healthz got 503 for everyone."""
    srv = serve("--max-sockets", "40", "--max-sockets-per-address", "1000")
    locals_ = ("127.0.0.1", "127.0.0.3", "127.0.0.4")

    async def main():
        creds = [await credential(srv.url, local) for local in locals_]
        heads = [f"X-Daisy-Token: {tok}\r\nContent-Length: 100000\r\n" for _, _, tok in creds]
        heads += ["Content-Length: 100000\r\n"]  # and strangers: 401, then lingering
        stop = threading.Event()
        socks: list[socket.socket] = []

        def keep_open():  # 20 stalled uploads per address, reopened as they close
            def fresh(i):
                k = raw_post(srv.port, "/datasets/upload?name=a.txt", heads[i % len(heads)],
                             b"a" * 1000, locals_[i % len(locals_)])
                k.setblocking(False)
                return k
            socks[:] = [fresh(i) for i in range(60)]
            while not stop.is_set():
                for i, k in enumerate(socks):
                    try:
                        gone = k.recv(65536) == b""
                    except BlockingIOError:
                        gone = False
                    except OSError:
                        gone = True
                    if gone:
                        k.close()
                        with contextlib.suppress(OSError):
                            socks[i] = fresh(i)
                stop.wait(0.05)

        t = threading.Thread(target=keep_open)
        t.start()
        try:
            async with Bystander(srv.url) as by:
                await asyncio.sleep(1)
                health = [await by.check() for _ in range(3)]
                await asyncio.sleep(2.5)  # past the refused ones' lingering: they come back
                health += [await by.check() for _ in range(3)]
        finally:
            stop.set()
            t.join()
            for k in socks:
                k.close()
            for s, ws, _ in creds:
                await ws.close()
                await s.close()
        return health

    health = srv.attacked(main(), fds=40 + 3 * 128 + 16)
    assert health[-1]["http"]["sockets"]["limit"] == 40
    assert health[-1]["http"]["evicted_at_cap"] >= 20
    srv.assert_healthy()


def test_at_the_socket_cap_a_new_request_not_yet_read_is_not_the_one_closed(serve):
    """At the cap, a new connection closed the oldest connection without a complete request
    to make room. On a busy loop a real request can sit unread when the next connection
    comes: the bystander's own /healthz was the one closed ("Connection reset by peer", seen
    in CI under load). Made certain here by stopping the server while the request and the
    next connection arrive. Now a connection younger than guard.FRESH_GRACE_S is judged
    after the stalled uploads, and the upload closed while its body was being read is
    refused without a traceback ("Connection closed." from aiohttp's reader)."""
    srv = serve("--max-sockets", "16", "--max-sockets-per-address", "1000",
                "--max-uploads", "2")

    async def main():
        s, ws, token = await credential(srv.url)  # its websocket: 1 of the 16
        mine = f"X-Daisy-Token: {token}\r\nContent-Length: 100000\r\n"
        stranger = "Content-Length: 100000\r\n"  # 401, then lingering on its body
        socks = [raw_post(srv.port, "/datasets/upload?name=a.txt", mine, b"a" * 1000)
                 for _ in range(2)]  # being read (read_body), the oldest
        await asyncio.sleep(0.3)
        socks += [raw_post(srv.port, "/datasets/upload?name=a.txt", stranger, b"a" * 1000,
                           "127.0.0.5") for _ in range(12)]
        await asyncio.sleep(0.5)  # 15 of 16 open, every request's headers in
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            first = socket.create_connection(("127.0.0.1", srv.port))
            first.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          b"Connection: close\r\n\r\n")
            second = raw_post(srv.port, "/datasets/upload?name=a.txt", stranger, b"",
                              "127.0.0.6")
            await asyncio.sleep(0.2)  # both in the listen backlog, the request unread
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        got = await asyncio.to_thread(status_within, first, time.monotonic() + 10)
        oldest_closed = await asyncio.to_thread(closed_by, socks[0], time.monotonic() + 10)
        for k in (*socks, first, second):
            k.close()
        await ws.close()
        await s.close()
        return got, oldest_closed

    got, oldest_closed = srv.attacked(main(), fds=64)
    assert got == 200, got
    assert oldest_closed  # the stalled upload made room instead
    srv.assert_healthy()


def csv_bomb() -> bytes:
    head = "text," + ",".join(f"c{i}" for i in range(90_000))
    row = "hello world," + ",".join("x" for _ in range(90_000))
    return (head + "\n" + row + "\n").encode()[: (1 << 20) - 1]


def distinct_text() -> bytes:
    chars = [chr(c) for c in range(0x4E00, 0x4E00 + 148_000) if not 0xD800 <= c < 0xE000]
    return "".join(chars).encode()


def test_csv_bomb_and_a_text_of_148000_classes_are_refused_before_parsing(serve):
    """A 1 MiB CSV of 90,000 columns was parsed for ~19 s of CPU and +510 MB, under a lock
    that held every room's uploads; a text of 148,000 distinct characters became a
    147,952-class data set. Both are refused in words now, and another room's upload goes
    through meanwhile."""
    srv = serve()

    async def main():
        s, ws, token = await credential(srv.url)
        s2, ws2, token2 = await credential(srv.url, "127.0.0.7")
        out = []
        async with Bystander(srv.url) as by:
            async def up(name, data, tok, local=ATTACKER):
                async with session(local) as c, c.post(
                        srv.url + "/datasets/upload", params={"name": name}, data=data,
                        headers={"X-Daisy-Token": tok},
                        timeout=__import__("aiohttp").ClientTimeout(total=120)) as r:
                    return r.status, await r.json(content_type=None)

            async def check_soon():
                await asyncio.sleep(0.3)
                await by.check()

            bomb, other, _ = await asyncio.gather(
                up("bomb.csv", csv_bomb(), token),
                up("book.txt", TEXT.encode(), token2, "127.0.0.7"), check_soon())
            out += [bomb, other]
            out.append(await up("wide.txt", distinct_text(), token))
            await by.check()
        for w, c in ((ws, s), (ws2, s2)):
            await w.close()
            await c.close()
        return out

    (st1, bomb), (st2, other), (st3, wide) = srv.attacked(main(), fds=64)
    assert st1 == 400 and "columns" in bomb["error"] and "64" in bomb["error"], bomb
    assert st2 == 200 and other["origin"] == "upload", other
    assert st3 == 400 and "distinct characters" in wide["error"], wide
    srv.assert_healthy()


def test_uploads_cut_mid_body_log_one_line_not_a_traceback_each(serve):
    """Headers, 100 bytes, then a reset: each logged a 17-line traceback (~725 KB/s of log
    from one address on /datasets/upload, ~49 KB/s on /checkpoint/import)."""
    srv = serve()

    async def main():
        s, ws, token = await credential(srv.url)
        head = f"X-Daisy-Token: {token}\r\nContent-Length: 100000\r\n"
        for i in range(40):
            path = "/datasets/upload?name=a.txt" if i % 2 else "/checkpoint/import"
            k = raw_post(srv.port, path, head, b"a" * 100)
            await asyncio.sleep(0.05)
            k.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            k.close()  # a reset
        await asyncio.sleep(0.5)
        async with session("127.0.0.2") as c, c.get(srv.url + "/healthz") as r:
            health = await r.json()
        await ws.close()
        await s.close()
        return health

    health = srv.attacked(main(), fds=64)
    log = srv.log()
    assert log.count("\n") <= 4, log[-3000:]
    assert "cut off mid-body" in log
    assert health["uploads"]["cut_mid_body"] >= 10, health["uploads"]  # most reach their body
    srv.assert_healthy()


def test_qr_flood_is_rate_limited_per_address_and_cached(serve):
    """48 keep-alive sockets asking for QR codes of long origins drew ~76 codes/s in the
    event loop. Now each address draws at most --qr-per-min (429 beyond, with
    retry_after_s), in a worker thread; a drawn link is served from the cache (no budget);
    an origin longer than 200 characters is refused."""
    srv = serve("--qr-per-min", "30")
    code = "K7QM-4XZP-9R"

    async def main():
        statuses = []
        async with Bystander(srv.url) as by:
            async def flood(k):
                async with session() as c:
                    for i in range(12):
                        origin = f"http://{'h' * 150}{k}x{i}.example:8787"
                        async with c.get(srv.url + "/share/qr.svg",
                                         params={"room": code, "origin": origin}) as r:
                            body = await r.read()
                            statuses.append((r.status, body))
            async def check_soon():
                await asyncio.sleep(0.2)
                await by.check()

            await asyncio.gather(*(flood(k) for k in range(8)), check_soon())
            async with session() as c:
                first = "http://" + "h" * 150 + "0x0.example:8787"
                async with c.get(srv.url + "/share/qr.svg", params={"room": code, "origin": first}) as r:
                    cached = r.status
                async with c.get(srv.url + "/share/qr.svg",
                                 params={"room": code, "origin": "http://" + "h" * 240 + ":1"}) as r:
                    long_origin = r.status
            async with session("127.0.0.8") as c:  # another address has its own budget
                async with c.get(srv.url + "/share/qr.svg",
                                 params={"room": code, "origin": "http://10.0.0.5:8787"}) as r:
                    other = r.status
            await by.check()
        return statuses, cached, long_origin, other

    statuses, cached, long_origin, other = srv.attacked(main(), fds=64)
    codes = [s for s, _ in statuses]
    assert codes.count(200) <= 30 + 2, codes  # the burst, and what refilled meanwhile
    refused = [json.loads(b) for s, b in statuses if s == 429]
    assert refused and all(r["limit"] == 30 and r["retry_after_s"] >= 1 for r in refused)
    assert cached == 200 and long_origin == 400 and other == 200
    srv.assert_healthy()


def test_export_checks_the_size_before_reading(tmp_path):
    """``daisychain export`` read a whole file before its 512 MiB check (+596 MB for a
    600 MiB file). A sparse 600 MiB file is refused now before it is read."""
    big = tmp_path / "big.pt"
    with open(big, "wb") as f:
        f.truncate(600 * MB)
    # the peak RSS from /proc (VmHWM, this process image's own): ru_maxrss would carry the
    # forked pytest's peak over the exec
    code = ("import re\nfrom daisychain.cli import main\n"
            f"rc = main(['export', {str(big)!r}, '--to', {str(tmp_path / 'out.safetensors')!r}])\n"
            "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read())\n"
            "print(rc, int(hwm.group(1)) * 1024)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env={**os.environ})
    rc, peak = map(int, out.stdout.split())
    assert peak < 300 * MB, peak / MB  # the file was never read (it is 600 MiB)
    assert rc == 1 and "more than a checkpoint may have" in out.stderr, out.stderr
    assert not (tmp_path / "out.safetensors").exists()
