"""Functional tier: the real server on 127.0.0.1 and real WebSocket clients (aiohttp's
client, and ``websockets`` as a second, independent implementation)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import websockets

from daisychain import signaling as p
from daisychain.server.app import HUB_KEY

from server_helpers import Client, aio, room_state, running_server

E = p.ErrorCode


async def private_room(base, members=1):
    """A host and ``members - 1`` approved joiners of a new private room."""
    host = await Client.connect(base)
    await host.hello(room="new", name="host")
    st = await host.expect(p.RoomState)
    out = [host]
    for i in range(members - 1):
        j = await Client.connect(base)
        await j.hello(room=st.code, name=f"j{i}")
        await j.expect(p.Pending)
        req = await host.expect(p.JoinRequest)
        await host.send(p.Approve(peer=req.peer.id))
        await room_state(j, i + 2)
        out.append(j)
    for c in out:  # settle: everyone has seen the full room
        if c.seen and isinstance(c.seen[-1], p.RoomState) and len(c.seen[-1].members) == members:
            continue
        await room_state(c, members)
    return st.code, out


@aio
async def test_two_rooms_never_see_each_others_messages():
    async with running_server() as (base, _):
        _, (a1, a2) = await private_room(base, 2)
        _, (b1, b2) = await private_room(base, 2)
        net = await Client.connect(base)
        await net.hello(room="network")
        await net.expect(p.RoomState)
        await a1.send(p.Broadcast(data={"run": "A"}))
        await a1.send(p.Offer(sdp="v=0 A", to=a2.id))
        await a1.send(p.Offer(sdp="v=0 A->B", to=b1.id))  # another room's member
        err = await a1.expect(p.Error)
        assert err.code == E.NO_SUCH_PEER.value
        await b1.send(p.Broadcast(data={"run": "B"}))
        assert (await a2.expect(p.Broadcast)).data == {"run": "A"}
        assert (await a2.expect(p.Offer)).sdp == "v=0 A"
        assert (await b2.expect(p.Broadcast)).data == {"run": "B"}
        for c, forbidden in ((b1, "A"), (b2, "A"), (net, "A"), (net, "B"), (a2, "B")):
            got = [m for m in await c.quiet() if isinstance(m, (p.Broadcast, p.Offer))]
            assert not got, (forbidden, got)
        for c in (a1, a2, b1, b2, net):
            await c.close()


@aio
async def test_unapproved_device_gets_errors_and_nothing_is_delivered():
    async with running_server() as (base, _):
        code, (host, member) = await private_room(base, 2)
        waiting = await Client.connect(base)
        await waiting.hello(room=code, name="w")
        await waiting.expect(p.Pending)
        await host.expect(p.JoinRequest)
        for msg in (p.Offer(sdp="v=0", to=host.id), p.Answer(sdp="v=0", to=member.id),
                    p.Candidate(candidate={"candidate": "candidate:1 1 udp 1 1.2.3.4 5 typ host",
                                           "sdpMid": "0", "sdpMLineIndex": 0}, to=host.id),
                    p.Broadcast(data="x")):
            await waiting.send(msg)
            assert (await waiting.expect(p.Error)).code == E.NOT_APPROVED.value
        await host.send(p.Broadcast(data="members only"))
        assert (await member.expect(p.Broadcast)).data == "members only"
        assert not [m for m in await waiting.quiet() if not isinstance(m, p.Error)]
        for c in (host, member):
            assert not [m for m in await c.quiet() if isinstance(m, (p.Offer, p.Answer,
                                                                     p.Candidate, p.Broadcast))]
        # denied -> error; the device then is in no room
        await host.send(p.Deny(peer=waiting.id))
        assert (await waiting.expect(p.Error)).code == E.DENIED.value
        for c in (host, member, waiting):
            await c.close()


@aio
async def test_spoofed_sender_is_overwritten():
    async with running_server() as (base, _):
        a, b = await Client.connect(base), await Client.connect(base)
        await a.hello(), await b.hello()
        await room_state(a, 2)
        await a.send(json.dumps({"type": "offer", "to": b.id, "from": b.id, "sdp": "v=0"}))
        await a.send(json.dumps({"type": "broadcast", "from": "server", "sender": "x", "data": 1}))
        assert (await b.expect(p.Offer)).sender == a.id
        assert (await b.expect(p.Broadcast)).sender == a.id
        await a.close(), await b.close()


@aio
async def test_bad_input_gets_errors_and_everyone_else_is_served():
    async with running_server(rate_per_s=20, burst=40) as (base, _):
        a, bystander = await Client.connect(base), await Client.connect(base)
        await a.hello(), await bystander.hello()
        await room_state(bystander, 2)
        for frame, code in (("{not json", E.BAD_JSON), ('{"type":"teleport"}', E.UNKNOWN_TYPE),
                            ('{"type":"offer","to":1,"sdp":"x"}', E.BAD_MESSAGE),
                            (json.dumps({"type": "broadcast", "data": "x" * 20000}), E.TOO_LARGE),
                            ("x" * 70000, E.TOO_LARGE)):
            await a.send(frame)
            err = await a.expect(p.Error)
            assert err.code == code.value and err.message
        await a.ws.send_bytes(b"\x01\x02")
        assert (await a.expect(p.Error)).code == E.BAD_MESSAGE.value
        await a.send(p.Ping(t=1.5))
        assert (await a.expect(p.Pong)).t == 1.5
        # flood: closed with a reason; the bystander is untouched
        flooder = await Client.connect(base)
        await flooder.hello()
        for _ in range(200):
            await flooder.send(p.Ping())
        while True:
            m = await flooder.recv()
            if not hasattr(m, "TYPE"):
                break
        assert m.type == aiohttp.WSMsgType.CLOSE and m.data == 1008
        assert "flood" in m.extra
        await bystander.send(p.Offer(sdp="still here", to=a.id))
        assert (await a.expect(p.Offer)).sdp == "still here"
        await a.close(), await bystander.close(), await flooder.close()


@aio
async def test_host_handover_when_host_leaves_or_drops():
    async with running_server(grace_s=30) as (base, _):
        code, (host, j0, j1) = await private_room(base, 3)
        await host.send(p.Leave())
        for c in (j0, j1):
            st = await room_state(c, 2)
            assert st.host == j0.id and st.members[0].host
        # the new host approves; then it drops its socket and the next one takes over
        late = await Client.connect(base)
        await late.hello(room=code)
        req = await j0.expect(p.JoinRequest)
        await j0.send(p.Approve(peer=req.peer.id))
        await room_state(late, 3)
        await j0.close()
        st = await room_state(late, 2)
        assert st.host == j1.id
        for c in (host, j1, late):
            await c.close()


@aio
async def test_reconnect_within_and_after_grace():
    async with running_server(grace_s=0.5) as (base, app):
        code, (host, member) = await private_room(base, 2)
        old_id, token = member.id, member.token
        await member.close()
        await room_state(host, 1)
        back = await Client.connect(base)
        w = await back.hello(room=code, token=token)
        assert w.resumed and w.id == old_id
        st = await room_state(back, 2)
        assert st.host == host.id
        # after the grace period: a new device, waiting for approval again
        token = back.token
        await back.close()
        await room_state(host, 1)
        while app[HUB_KEY].peer_info(old_id) is not None:
            await asyncio.sleep(0.05)
        again = await Client.connect(base)
        w = await again.hello(room=code, token=token)
        assert not w.resumed and w.id != old_id
        await again.expect(p.Pending)
        for c in (host, again):
            await c.close()


@aio
async def test_forged_forwarded_for_from_untrusted_peer_is_ignored():
    async with running_server() as (base, _):
        plain = await Client.connect(base)
        forged = await Client.connect(base, headers={"X-Forwarded-For": "8.8.8.8"})
        await plain.hello(), await forged.hello()
        st = await room_state(forged, 2)
        assert {m.id for m in st.members} == {plain.id, forged.id}
        await plain.close(), await forged.close()


@aio
async def test_forwarded_for_from_trusted_proxy_groups_by_client():
    async with running_server(trust_proxy=("127.0.0.0/8",)) as (base, _):
        hdr = lambda ip: {"X-Forwarded-For": ip}  # noqa: E731
        a = await Client.connect(base, headers=hdr("8.8.8.8"))
        b = await Client.connect(base, headers=hdr("9.9.9.9"))
        c = await Client.connect(base, headers=hdr("2001:db8:1:2::5"))
        d = await Client.connect(base, headers=hdr("2001:db8:1:2::77, 127.0.0.1"))
        for x in (a, b, c, d):
            await x.hello()
        assert [m.id for m in (await a.expect(p.RoomState)).members] == [a.id]
        assert [m.id for m in (await b.expect(p.RoomState)).members] == [b.id]
        st = await room_state(c, 2)  # same IPv6 /64
        assert {m.id for m in st.members} == {c.id, d.id}
        for x in (a, b, c, d):
            await x.close()


@aio
async def test_idle_connections_are_dropped():
    async with running_server(ping_interval_s=0.2, hello_timeout_s=0.3) as (base, _):
        async with aiohttp.ClientSession() as s:
            silent = await s.ws_connect(base + "/ws")  # never says hello
            m = await silent.receive(timeout=10)
            assert m.type == aiohttp.WSMsgType.CLOSE and "idle" in m.extra
            deaf = await s.ws_connect(base + "/ws", autoping=False)  # never answers pings
            await deaf.send_str(p.encode(p.Hello(name="deaf", kind="cpu", capacity=1)))
            while (m := await deaf.receive(timeout=10)).type in (aiohttp.WSMsgType.TEXT,
                                                                  aiohttp.WSMsgType.PING):
                pass
            assert m.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)


@aio
async def test_websockets_client_and_clean_shutdown():
    """A second client library; the server closes sockets with 1001 when it stops."""
    async with running_server() as (base, _):
        ws = await websockets.connect(base.replace("http", "ws") + "/ws")
        await ws.send(p.encode(p.Hello(name="py", kind="python", capacity=2.5, room="new")))
        assert isinstance(p.parse_server(await ws.recv()), p.Welcome)
        st = p.parse_server(await ws.recv())
        assert st.members[0].kind == "python" and st.members[0].capacity == 2.5
    try:
        await asyncio.wait_for(ws.recv(), 5)
    except websockets.ConnectionClosed as exc:
        assert exc.rcvd is not None and exc.rcvd.code == 1001
    else:
        raise AssertionError("socket stayed open after shutdown")
