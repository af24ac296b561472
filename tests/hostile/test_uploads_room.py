"""Uploaded data belongs to a room (issue 21), tried in the attacker's shoes against a real
``daisychain serve``: a plain HTTP client with no credential, a forged one, a member of
another room, a device waiting for approval, a member that left, an approved member that
is not the host. None of them can upload, list, download or evict a room's upload; the
room's host, its members and a late joiner still can.

On the server before issue 21 every one of these requests succeeded: anyone uploaded, every
upload was listed to anyone, its fingerprint fetched it, and twenty uploads from a stranger
pushed every room's uploads out (one LRU of 16 for the whole server)."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from hostile import ATTACKER, BYSTANDER, expect, hello, recv_json, run, session

HOST_A = "127.0.0.3"
MEMBER_A = "127.0.0.4"
LATE_A = "127.0.0.5"
TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, "
        "it was the age of foolishness, it was the epoch of belief.\n") * 8


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from hostile import ServerProcess

    s = ServerProcess(tmp_path_factory.mktemp("rooms"), "--grace", "1")
    yield s
    s.stop()


class Device:
    """A signaling connection from one loopback address, and its room credential."""

    def __init__(self, url: str, local: str, name: str):
        self.url, self.local, self.name = url, local, name

    async def open(self, room: str) -> dict:
        self.s = session(self.local)
        self.ws = await self.s.ws_connect(self.url + "/ws")
        await self.ws.send_str(hello(room, self.name))
        welcome = await expect(self.ws, "welcome")
        self.id, self.token = welcome["id"], welcome["token"]
        return await recv_json(self.ws)

    @property
    def cred(self) -> dict:
        return {"X-Daisy-Token": self.token}

    async def close(self) -> None:
        await self.ws.close()
        await self.s.close()


async def host_room(url: str, local: str, name: str = "host") -> tuple[Device, str]:
    host = Device(url, local, name)
    room = await host.open("new")
    assert room["type"] == "room" and room["room"] == "private", room
    return host, room["code"]


async def join(url: str, local: str, host: Device, code: str, name: str,
               approve: bool = True) -> Device:
    dev = Device(url, local, name)
    first = await dev.open(code)
    assert first["type"] == "pending", first
    req = await expect(host.ws, "join_request")
    assert req["peer"]["name"] == name
    if approve:
        await host.ws.send_str(json.dumps({"type": "approve", "peer": req["peer"]["id"]}))
        await expect(dev.ws, "room")
    return dev


async def upload(url: str, headers: dict | None, name: str, data: bytes,
                 local: str = ATTACKER) -> tuple[int, dict]:
    async with session(local) as s, s.post(url + "/datasets/upload", params={"name": name},
                                           data=data, headers=headers or {}) as r:
        return r.status, await r.json(content_type=None)


async def fetch(url: str, headers: dict | None, fp: str, local: str = ATTACKER) -> tuple[int, bytes]:
    async with session(local) as s, s.get(url + "/data/text.dcds", params={"fingerprint": fp},
                                          headers=headers or {}) as r:
        return r.status, await r.read()


async def listed(url: str, headers: dict | None, local: str = ATTACKER) -> list[str]:
    async with session(local) as s, s.get(url + "/datasets", headers=headers or {}) as r:
        assert r.status == 200
        return [d["fingerprint"] for d in (await r.json())["datasets"] if d["origin"] == "upload"]


def test_strangers_cannot_upload_list_or_fetch_a_rooms_data_and_its_members_can(srv):
    async def main():
        host, code = await host_room(srv.url, HOST_A)
        member = await join(srv.url, MEMBER_A, host, code, "member")
        other, _ = await host_room(srv.url, BYSTANDER, "other-host")  # a room of its own
        waiting = await join(srv.url, "127.0.0.6", host, code, "waiting", approve=False)
        try:
            # strangers cannot upload: no credential, a forged one, one in the URL
            for headers in (None, {"X-Daisy-Token": "A" * 32}, {"X-Daisy-Token": "x" * 5000}):
                st, body = await upload(srv.url, headers, "diary.txt", TEXT.encode())
                assert st == 401 and "credential" in body["error"], (st, body)
            async with session() as s, s.post(srv.url + "/datasets/upload",
                                              params={"name": "d.txt", "token": host.token},
                                              data=TEXT.encode()) as r:
                assert r.status == 401
            # a device that waits for approval is no member; an approved member is no host
            st, body = await upload(srv.url, waiting.cred, "diary.txt", TEXT.encode(), "127.0.0.6")
            assert st == 403 and "approved member" in body["error"], body
            st, body = await upload(srv.url, member.cred, "diary.txt", TEXT.encode(), MEMBER_A)
            assert st == 403 and "host" in body["error"], body
            # the host can
            st, entry = await upload(srv.url, host.cred, "diary.txt", TEXT.encode(), HOST_A)
            assert st == 200 and entry["origin"] == "upload", entry
            fp = entry["fingerprint"]
            # ... and its room sees it, nobody else does: a fingerprint alone opens nothing
            assert await listed(srv.url, host.cred, HOST_A) == [fp]
            assert await listed(srv.url, member.cred, MEMBER_A) == [fp]
            unknown = "ab" * 32
            st, nothing = await fetch(srv.url, None, unknown)
            assert st == 404
            for headers, local in ((None, ATTACKER), (other.cred, BYSTANDER),
                                   (waiting.cred, "127.0.0.6"), ({"X-Daisy-Token": "A" * 32}, ATTACKER)):
                assert await listed(srv.url, headers, local) == []
                st, data = await fetch(srv.url, headers, fp, local)
                # the same answer as for a fingerprint nobody has: it says nothing of the upload
                assert (st, data.replace(fp.encode(), b"FP")) == \
                    (404, nothing.replace(unknown.encode(), b"FP")), (st, data[:200])
            st, data = await fetch(srv.url, member.cred, fp, MEMBER_A)
            assert st == 200 and hashlib.sha256(data).hexdigest() == fp
            # a late joiner fetches it too, once approved
            late = await join(srv.url, LATE_A, host, code, "late")
            st, data = await fetch(srv.url, late.cred, fp, LATE_A)
            assert st == 200 and hashlib.sha256(data).hexdigest() == fp
            # a member that left the room holds a valid credential of no room: nothing
            await member.ws.send_str(json.dumps({"type": "leave"}))
            await asyncio.sleep(0.3)
            st, _ = await fetch(srv.url, member.cred, fp, MEMBER_A)
            assert st == 404
            assert await listed(srv.url, member.cred, MEMBER_A) == []
            await late.close()
        finally:
            for d in (host, member, other, waiting):
                await d.close()
    run(main())
    srv.assert_healthy()


def test_a_stranger_cannot_evict_a_rooms_upload(srv):
    """Twenty uploads from another address (in a room of its own) used to push every other
    room's upload out of the server's one LRU of 16."""
    async def main():
        host, code = await host_room(srv.url, HOST_A)
        member = await join(srv.url, MEMBER_A, host, code, "member")
        attacker, _ = await host_room(srv.url, ATTACKER, "attacker")
        try:
            st, entry = await upload(srv.url, host.cred, "book.txt", TEXT.encode(), HOST_A)
            assert st == 200, entry
            fp = entry["fingerprint"]
            codes = []
            for i in range(20):
                data = (TEXT + f"\nthe attacker's file number {i}\n").encode()
                st, body = await upload(srv.url, attacker.cred, f"a{i}.txt", data)
                codes.append(st)
                if st != 200:
                    assert st in (413, 429) and ("limit" in body["error"]), body
            assert codes.count(200) <= 4, codes  # --room-uploads: 4
            st, data = await fetch(srv.url, member.cred, fp, MEMBER_A)
            assert st == 200 and hashlib.sha256(data).hexdigest() == fp
            assert await listed(srv.url, member.cred, MEMBER_A) == [fp]
        finally:
            for d in (host, member, attacker):
                await d.close()
    run(main())
    srv.assert_healthy()


def test_a_rooms_uploads_go_when_it_closes(srv):
    async def sets() -> int:
        async with session(BYSTANDER) as s, s.get(srv.url + "/healthz") as r:
            return (await r.json())["uploads"]["sets"]

    async def settle(want: int) -> int:
        for _ in range(100):
            if await sets() == want:
                break
            await asyncio.sleep(0.1)
        return await sets()

    async def main():
        assert await settle(0) == 0  # the rooms of the tests before have closed
        host, code = await host_room(srv.url, HOST_A)
        st, entry = await upload(srv.url, host.cred, "closing.txt",
                                 (TEXT + "a room that closes\n").encode(), HOST_A)
        assert st == 200, entry
        assert await sets() == 1
        await host.close()  # its last member: the room closes after the 1 s grace
        assert await settle(0) == 0
        st, _ = await fetch(srv.url, host.cred, entry["fingerprint"], HOST_A)
        assert st == 404
    run(main())
