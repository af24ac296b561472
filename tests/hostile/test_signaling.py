"""Signaling attacks from a device on the LAN (or a member of your room): fan-out
amplification, approval spam, non-finite numbers, rooms and connections per IPv6 /64, code
guessing, and message floods spread over connections. Each against a real server process,
with a bystander in another room that must keep answering within 1 s."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from pathlib import Path

import aiohttp

from hostile import (ATTACKER, MAX_RSS_GROWTH, Bystander, device, expect, healthz, hello,
                     raw_ws, recv_json, run, session, ws_frame)


async def _drain(ws, seconds: float, got: list | None = None) -> list[dict]:
    got = [] if got is None else got
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (left := end - loop.time()) > 0:
        try:
            msg = await recv_json(ws, left)
        except asyncio.TimeoutError:
            break
        if msg is None:
            break
        got.append(msg)
    return got


def test_room_state_fan_out_is_coalesced_and_slow_readers_cost_one_log_line(serve):
    """Regression: one member's small messages (join/leave toggles) made the server queue a
    room state per change for every member; members that do not read grew the server by
    gigabytes, and the log got one "dropping" line per message."""
    srv = serve()
    stuck: list[socket.socket] = []
    for a in range(3, 6):  # 45 members that never read, from three addresses
        for i in range(15):
            s = raw_ws(srv.port, f"127.0.0.{a}", rcvbuf=4096)
            s.sendall(ws_frame(hello("network", f"{'m' * 56}-{a}-{i:02d}")))
            stuck.append(s)

    async def attack():
        async with Bystander(srv.url) as by, session(ATTACKER) as s:
            conns = []
            for i in range(8):
                ws, _, _ = await device(s, srv.url, "network", f"{'t' * 56}-{i}")
                conns.append(ws)
            got = [[] for _ in conns]
            readers = [asyncio.ensure_future(_drain(ws, 60, g)) for ws, g in zip(conns, got)]
            with srv.watch() as w:
                for k in range(95):  # 8 x 190 joins: each changes the network room
                    for ws in conns:
                        await ws.send_str('{"type":"join","room":"new"}')
                        await ws.send_str('{"type":"join","room":"network"}')
                    if k % 30 == 0:
                        await by.check()
                for _ in range(4):
                    await asyncio.sleep(0.5)
                    await by.check()
            for r in readers:
                r.cancel()
            health = await healthz(srv.url)
            return w, got, health

    try:
        w, got, health = run(attack())
    finally:
        for s in stuck:
            s.close()
    assert w["rss_growth"] < MAX_RSS_GROWTH, w
    assert w["peak_fds"] - w["fds0"] <= 24, w  # the 45 stuck members were there before
    log = srv.log()
    drops = log.count("does not read its messages")
    assert drops <= len(stuck), f"{drops} log lines for {len(stuck)} slow connections"
    assert len(log.splitlines()) <= len(stuck) + 20
    # the refusals the attacker got say which limit and where it stands
    errors = [m for ms in got for m in ms if m["type"] == "error"]
    assert errors and all("limit" in m and "current" in m for m in errors), errors[:3]
    rooms = [m for ms in got for m in ms if m["type"] == "room"]
    assert len(rooms) < 8 * 190  # coalesced: not one per change per member
    assert health["slow_readers_dropped"] <= len(stuck)
    srv.assert_healthy()


def test_non_finite_numbers_are_refused_and_never_relayed(serve):
    """Regression: a broadcast whose data held 1e999 was relayed as the literal Infinity
    (not JSON), and every daisy-peer in that network room exited."""
    srv = serve()

    async def attack():
        async with Bystander(srv.url) as by, session(ATTACKER) as s, session("127.0.0.3") as s3:
            listener, _, _ = await device(s3, srv.url, "network", "listener")
            bad, _, _ = await device(s, srv.url, "network", "attacker")
            await expect(listener, "room")
            answers = []
            for frame in ('{"type":"broadcast","data":{"x":1e999}}',
                          '{"type":"broadcast","data":[-1e999, 1]}',
                          '{"type":"broadcast","data":NaN}',
                          '{"type":"broadcast","data":{"y":Infinity}}',
                          '{"type":"ping","t":1e400}'):
                await bad.send_str(frame)
                answers.append(await expect(bad, "error"))
            await bad.send_str('{"type":"broadcast","data":{"fine":1.5e300}}')
            relayed = await expect(listener, "broadcast")  # strict JSON or AssertionError
            await by.check()
            return answers, relayed

    answers, relayed = srv.attacked(attack(), fds=16)
    assert all(a["code"] == "bad_json" for a in answers), answers
    assert "out of range" in answers[0]["message"] and "not JSON" in answers[2]["message"]
    assert relayed["data"] == {"fine": 1.5e300}
    srv.assert_healthy()


def test_the_peer_client_skips_an_unreadable_frame(caplog):
    """Regression: one unreadable frame (a relayed Infinity) ended daisy-peer's signaling
    client ("Infinity is not JSON"); now it is refused with a log line and skipped."""
    from aiohttp import web

    from daisychain.peer.client import SignalingClient
    from daisychain import signaling as p

    async def hostile(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.receive()  # hello
        await ws.send_str(p.encode(p.Welcome(id="ab12", token="t")))
        await ws.send_str('{"type":"broadcast","from":"cd34","data":Infinity}')
        await ws.send_str('{"type":"room","room":"network"')
        await ws.send_str(p.encode(p.Pong(t=1.0)))
        await ws.receive()
        return ws

    async def main():
        app = web.Application()
        app.router.add_get("/ws", hostile)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        try:
            async with aiohttp.ClientSession() as s:
                client = SignalingClient(url, s)
                await client.connect("peer", "python", 1.0, "network")
                msg = await asyncio.wait_for(client.recv(), 5)
                await client.leave()
                return msg, client.refused
        finally:
            await runner.cleanup()

    with caplog.at_level("WARNING", logger="daisychain.peer"):
        msg, refused = run(main())
    assert msg == p.Pong(t=1.0) and refused == 2
    assert sum("refused an unreadable signaling frame" in r.message for r in caplog.records) == 2
    assert any("bad_json" in r.message for r in caplog.records)


def test_approval_spam_denied_device_waits_and_repeats_fold(serve):
    """Regression: a denied device reconnected and asked again (~190 join requests in 5 s
    reached the host), and 16 pending requests from one address locked out real joiners."""
    srv = serve("--deny-cooldown", "30", "--join-requests-per-min", "1000")

    async def attack():
        async with Bystander(srv.url) as by, session("127.0.0.2") as hs:
            host, _, room = await device(hs, srv.url, "new", "host")
            code = room["code"]
            requests = []

            async def host_loop():
                while True:
                    msg = await recv_json(host, 30)
                    if msg is None:
                        return
                    if msg["type"] == "join_request":
                        requests.append(msg["peer"])
                        if msg["peer"]["name"] == "spammer":
                            await host.send_str(json.dumps({"type": "deny",
                                                            "peer": msg["peer"]["id"]}))
                    if msg["type"] == "room":
                        room.update(msg)

            hl = asyncio.ensure_future(host_loop())
            # 1. denied, then reconnecting and asking again: told to wait, host not asked
            told = []
            async with session(ATTACKER) as s:
                ws, _, first = await device(s, srv.url, code, "spammer")
                assert first["type"] == "pending"
                told.append(await expect(ws, "error"))
                await ws.close()
                for _ in range(40):
                    ws = await s.ws_connect(srv.url + "/ws")
                    await ws.send_str(hello(code, "spammer"))
                    await expect(ws, "welcome")
                    told.append(await expect(ws, "error"))
                    await ws.close()
            await by.check()
            # 2. one device asking again on many open connections: one entry for the host
            async with session("127.0.0.4") as s4:
                twins = []
                for _ in range(6):
                    ws, _, first = await device(s4, srv.url, code, "twin")
                    assert first["type"] == "pending"
                    twins.append(ws)
                await asyncio.sleep(0.3)
                pending_twins = [d for d in room["pending"] if d["name"] == "twin"]
                # 3. many names from one address: at most --max-pending-per-address wait
                capped = []
                for i in range(8):  # 6 + 8 connections: under the 16 per address
                    ws, _, first = await device(s4, srv.url, code, f"name-{i}")
                    capped.append(first)
                    twins.append(ws)  # kept open: a closed one's request goes with it
                # 4. a real joiner from another address is not locked out
                async with session("127.0.0.5") as s5:
                    real, _, first_real = await device(s5, srv.url, code, "real")
                    await by.check()
                    await real.close()
                for ws in twins:
                    await ws.close()
            hl.cancel()
            return told, requests, pending_twins, capped, first_real

    told, requests, pending_twins, capped, first_real = srv.attacked(attack(), fds=48)
    assert told[0]["code"] == "denied" and told[0]["retry_after_s"] == 30
    assert all(t["code"] == "denied" and 0 < t["retry_after_s"] <= 30 and "ask again in" in
               t["message"] for t in told[1:]), told[1:4]
    assert sum(r["name"] == "spammer" for r in requests) == 1
    assert sum(r["name"] == "twin" for r in requests) == 1 and len(pending_twins) == 1
    waiting = [c for c in capped if c["type"] == "pending"]
    refused = [c for c in capped if c["type"] == "error"]
    assert len(waiting) == 3 and len(refused) == 5  # with the twin: 4 of one address
    assert all(r["code"] == "too_many_pending" and r["limit"] == 4 and r["current"] == 4
               for r in refused), refused[:2]
    assert first_real["type"] == "pending"
    srv.assert_healthy()


def test_join_requests_per_address_and_pending_expiry(serve):
    """Join requests are rate-limited per address (not per connection), and a request the
    host never answers expires (they used to wait for ever)."""
    srv = serve("--join-requests-per-min", "3", "--pending-timeout", "1")

    async def attack():
        async with session("127.0.0.2") as hs:
            host, _, room = await device(hs, srv.url, "new", "host")
            code = room["code"]
            async with session(ATTACKER) as s:
                firsts = []
                for i in range(6):
                    ws, _, first = await device(s, srv.url, code, f"asker-{i}")
                    firsts.append((ws, first))
                expired = await expect(firsts[0][0], "error", timeout=5)
                state = room
                while state["pending"]:
                    state = await expect(host, "room", timeout=5)
                for ws, _ in firsts:
                    await ws.close()
            return [f for _, f in firsts], expired, state

    firsts, expired, state = srv.attacked(attack(), fds=24)
    assert [f["type"] for f in firsts[:3]] == ["pending"] * 3
    limited = firsts[3:]
    assert all(f["code"] == "rate_limited" and f["limit"] == 3 and f["retry_after_s"] > 0
               for f in limited), limited
    assert expired["code"] == "denied" and "expired" in expired["message"]
    assert state["pending"] == []
    srv.assert_healthy()


def test_rooms_and_connections_count_per_ipv6_64_not_per_address(serve):
    """Regression: the cap of private rooms counted exact addresses, so the addresses of one
    group (on IPv6, a host's whole /64) opened one cap each. Behind a trusted proxy here, so
    that the clients can have IPv6 addresses on loopback."""
    srv = serve("--trust-proxy", "127.0.0.1/32", "--max-rooms-per-address", "3")

    async def attack():
        async with Bystander(srv.url) as by, session(ATTACKER) as s:
            answers, sockets = [], []
            for i in range(20):
                try:
                    ws = await s.ws_connect(srv.url + "/ws",
                                            headers={"X-Forwarded-For": f"2001:db8:1:2::{i + 1:x}"})
                except aiohttp.WSServerHandshakeError as exc:
                    answers.append({"type": "http", "status": exc.status})
                    continue
                sockets.append(ws)
                await ws.send_str(hello("new", f"v6-{i}"))
                msg = await recv_json(ws)
                if msg is not None and msg["type"] == "welcome":
                    msg = await recv_json(ws)
                answers.append(msg)
            await by.check()
            health = await healthz(srv.url)
            for ws in sockets:
                await ws.close()
            return answers, health

    answers, health = srv.attacked(attack(), fds=40)
    rooms = [a for a in answers if a and a["type"] == "room"]
    too_many = [a for a in answers if a and a.get("code") == "too_many_rooms"]
    conn_refused = [a for a in answers if a and a.get("code") == "rate_limited"]
    assert len(rooms) == 3 and len(too_many) == 13, answers
    assert all(a["limit"] == 3 and a["current"] == 3 for a in too_many)
    assert len(conn_refused) == 4 and all(a["limit"] == 16 for a in conn_refused)
    assert health["per_address"]["private_rooms"] == {"limit": 3, "current": 3}
    srv.assert_healthy()


def test_code_guessing_is_limited_per_address_across_reconnects(serve):
    """Regression: ~11,000 wrong-code answers per second to one address; the limit was per
    connection, and every reconnect got a fresh burst."""
    srv = serve("--codes-per-min", "10")

    async def attack():
        async with Bystander(srv.url) as by, session("127.0.0.2") as hs:
            host, _, room = await device(hs, srv.url, "new", "host")
            code = room["code"]
            rng = random.Random(5)
            alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
            answers = []
            async with session(ATTACKER) as s:
                for _ in range(5):  # reconnecting buys nothing
                    ws, _, _ = await device(s, srv.url, "network", "guesser")
                    for _ in range(20):
                        guess = "".join(rng.choice(alphabet) for _ in range(10))
                        await ws.send_str(json.dumps({"type": "join", "room": guess}))
                        answers.append(await expect(ws, "error"))
                    await ws.close()
                ws, _, _ = await device(s, srv.url, "network", "guesser")
                await ws.send_str(json.dumps({"type": "join", "room": code}))
                right = await expect(ws, "error")  # even the right code, while limited
                await ws.close()
            await by.check()
            return answers, right

    answers, right = srv.attacked(attack(), fds=16)
    wrong = [a for a in answers if a["code"] == "no_such_room"]
    limited = [a for a in answers if a["code"] == "rate_limited"]
    assert len(wrong) <= 11 and len(wrong) + len(limited) == 100, [a["code"] for a in answers]
    assert all(a["limit"] == 10 and a["retry_after_s"] > 0 and "try again in" in a["message"]
               for a in limited)
    assert right["code"] == "rate_limited"
    srv.assert_healthy()


def test_messages_per_address_and_relay_budget(serve):
    """A flood spread over connections meets the per-address budget (the per-connection one
    alone multiplies by connections); relayed bytes are charged per recipient."""
    srv = serve("--address-rate", "20", "--address-burst", "40",
                "--relay-bytes-per-s", "10000", "--relay-burst-bytes", "60000")

    async def attack():
        async with Bystander(srv.url) as by, session(ATTACKER) as s:
            conns = [(await device(s, srv.url, "network", f"f{i}"))[0] for i in range(4)]
            for ws in conns:
                for k in range(30):
                    await ws.send_str(json.dumps({"type": "ping", "t": k}))
            got = await asyncio.gather(*(_drain(ws, 1.0) for ws in conns))
            await by.check()
            big = json.dumps({"type": "broadcast", "data": "x" * 15000})
            async with session("127.0.0.3") as s3, session("127.0.0.4") as s4:
                # a member sending big broadcasts to the network room (5 others there)
                c, _, _ = await device(s3, srv.url, "network", "c")
                for _ in range(4):
                    await c.send_str(big)
                relay = await _drain(c, 1.0)
            return got, relay

    got, relay = srv.attacked(attack(), fds=24)
    pongs = sum(m["type"] == "pong" for g in got for m in g)
    limited = [m for g in got for m in g if m["type"] == "error"]
    assert 30 <= pongs <= 45 and limited, pongs  # the burst of 40, less the hellos
    assert all(m["code"] == "rate_limited" and m["limit"] == 20 for m in limited)
    relay_errors = [m for m in relay if m["type"] == "error"]
    assert relay_errors and all(m["limit"] == 10000 and "relay budget" in m["message"]
                                for m in relay_errors), relay
    srv.assert_healthy()


def test_a_daisy_peer_survives_an_unreadable_frame(tmp_path):
    """Regression: every daisy-peer waiting in a network room exited when the server
    relayed a frame it could not read ("Infinity is not JSON"). A hostile server sends one
    (as the old server relayed it); the real daisy-peer process logs the refusal and stays."""
    import sys
    import threading

    from aiohttp import web

    from daisychain import signaling as p

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from peer_process import PeerProcess

    sent = threading.Event()

    async def hostile(request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.receive()  # hello
        await ws.send_str(p.encode(p.Welcome(id="ab12", token="t")))
        await ws.send_str(p.encode(p.RoomState(room="network", code=None, you="ab12", host="ab12",
                                               members=(p.Member("ab12", "peer", "python", 1.0,
                                                                 True),))))
        await ws.send_str('{"type":"broadcast","from":"cd34","data":{"x":Infinity}}')
        sent.set()
        async for _ in ws:
            pass
        return ws

    box = {}
    ready = threading.Event()

    def serve():
        loop = asyncio.new_event_loop()
        box["loop"] = loop

        async def up():
            app = web.Application()
            app.router.add_get("/ws", hostile)
            box["runner"] = runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            box["port"] = site._server.sockets[0].getsockname()[1]
            ready.set()

        loop.run_until_complete(up())
        loop.run_forever()
        loop.run_until_complete(box["runner"].cleanup())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(20)
    # the installed daisychain (or PYTHONPATH's), not the checkout's by its working directory
    command = [sys.executable, "-c", "import sys; sys.path = [p for p in sys.path if p not in "
               "('', '.')]; from daisychain.peer.cli import main; sys.exit(main())"]
    peer = PeerProcess(f"http://127.0.0.1:{box['port']}", "--capacity", "1", name="waiter",
                       err_dir=tmp_path, command=command)
    try:
        assert sent.wait(90), peer.stderr()[-2000:]
        peer.wait_for(r"refused an unreadable signaling frame \(bad_json\)", timeout=30)
        time.sleep(1.0)
        assert peer.proc.poll() is None, peer.stderr()[-2000:]
    finally:
        peer.stop()
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        t.join(10)
