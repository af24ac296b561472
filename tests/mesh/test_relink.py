"""Mesh tier, the aiortc shell (``daisychain.peer.rtc``) alone: two real ``Mesh`` objects in
one process, real ``RTCPeerConnection``s on 127.0.0.1, their offers and answers handed
straight to each other (no server). Run in the private network namespace:

    scripts/in-netns.sh .venv/bin/python -m pytest tests/mesh/test_relink.py -q
"""

from __future__ import annotations

import asyncio

import pytest

from daisychain.peer import rtc


class Side:
    def __init__(self, me: str):
        self.me = me
        self.opens: list[str] = []
        self.closes: list[str] = []
        self.got: list[bytes] = []
        self.other: "Side | None" = None
        self.mesh = rtc.Mesh(me, self.signal, self.opens.append, lambda p, d: self.got.append(d),
                             self.closes.append)

    async def signal(self, kind, to, payload):
        if kind == "offer":
            await self.other.mesh.on_offer(self.me, payload)
        elif kind == "answer":
            await self.other.mesh.on_answer(self.me, payload)


async def _until(cond, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)


async def linked_pair() -> tuple[Side, Side]:
    """Two ``Mesh`` objects, "a" and "b", in one room with their data channel open."""
    a, b = Side("a"), Side("b")
    a.other, b.other = b, a
    await a.mesh.update(["a", "b"])
    await b.mesh.update(["a", "b"])
    await _until(lambda: a.opens == ["b"] and b.opens == ["a"])
    return a, b


@pytest.mark.parametrize("closer", ["a", "b"])
def test_a_lost_channel_to_a_member_still_in_the_room_is_linked_again(closer):
    """Regression: when a data channel closed (or its connection failed) while both peers
    stayed in the room, the offering side (the smaller id) never offered again: the two
    never spoke for the rest of the run (a daisy-peer that joined a tab's room late could
    wait for its STATE for ever). Now the offerer links again; the answerer answers."""
    rtc.use_loopback_only()

    async def go():
        a, b = await linked_pair()
        try:
            side = a if closer == "a" else b
            side.mesh.links[side.other.me].channel.close()
            await _until(lambda: a.closes == ["b"] and b.closes == ["a"])
            await _until(lambda: a.opens == ["b", "b"] and b.opens == ["a", "a"])
            assert a.mesh.send("b", [b"hello again"])
            await _until(lambda: b.got == [b"hello again"])
        finally:
            await a.mesh.close()
            await b.mesh.close()
    asyncio.run(go())


def test_a_member_that_left_the_room_is_not_linked_again():
    """The other side of it: a peer the room no longer lists gets no new offer."""
    rtc.use_loopback_only()

    async def go():
        a, b = await linked_pair()
        try:
            await a.mesh.update(["a"])  # b left the room
            await _until(lambda: b.closes == ["a"])
            await asyncio.sleep(2 * rtc.RELINK_S + 0.5)
            assert a.opens == ["b"] and "b" not in a.mesh.links and not a.mesh.relinks
        finally:
            await a.mesh.close()
            await b.mesh.close()
    asyncio.run(go())


def test_a_connection_that_never_closes_does_not_keep_the_peer_from_exiting(monkeypatch):
    """Regression (issue 34: a daisy-peer whose run had ended did not exit, at load ~27):
    aiortc's ``RTCPeerConnection.close()`` can wait for ever, and the peer closes its mesh
    before it prints its summary and exits. Each link's close is now bounded by ``CLOSE_S``
    and the links close together; the hung one is said in the log."""
    rtc.use_loopback_only()
    monkeypatch.setattr(rtc, "CLOSE_S", 0.5, raising=False)

    async def go():
        a, b = await linked_pair()
        never = asyncio.get_running_loop().create_future()
        real = a.mesh.links["b"].pc

        async def hangs():
            await never
        monkeypatch.setattr(a.mesh.links["b"].pc, "close", hangs)
        try:
            await asyncio.wait_for(a.mesh.close(), 10)
            assert not a.mesh.links
        finally:
            await type(real).close(real)  # the real close, for the test's own cleanup
            await b.mesh.close()
    asyncio.run(go())
