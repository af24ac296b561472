"""Rooms and approval as a plain object: no sockets, no clock, no event loop.

:class:`Hub` is fed what happens on connections — ``open``, ``receive`` (a frame),
``closed`` — and the time, and answers with the frames to send and the connections to
close (:class:`Send`, :class:`Close`). ``tick(now)`` runs the timers (reconnect grace,
hello timeout). The aiohttp shell in ``app.py`` only moves frames; the tests drive this
object directly.

The rules it enforces:

- identities come from here: every relayed message gets ``sender`` = the connection's id,
  and is delivered only to an approved, connected member of the sender's own room;
- a device waiting for approval gets its ``pending`` notice and nothing else from the room,
  and every relay it tries is answered with ``not_approved``;
- when the host goes, the longest-standing connected member becomes host, and everyone is
  sent the new room state;
- a dropped approved member keeps id, approval and room for ``grace_s`` seconds; a hello
  with its token in that time resumes it, after it the token is forgotten.

And the limits (``docs/SECURITY.md``): the Hub asks its :class:`~.quota.Quota` (per client
address and per connection) before it acts; the two kinds of room and how a device asks to
enter each are in :mod:`.room_kinds`. Per room: room-state rounds per second, beyond which
changes coalesce (latest wins). Each refusal is an ``error`` with ``limit``, ``current`` and,
where waiting helps, ``retry_after_s``.
"""

from __future__ import annotations

import base64
import json
import random
import secrets
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable

from daisychain import signaling as p
from .config import ServerConfig
from .groups import address_key
from .quota import Bucket, ConnectionUse, Quota
from .outputs import CLOSE_GOING_AWAY, CLOSE_IDLE, CLOSE_POLICY, CLOSE_REPLACED, Close, Output, Send
from .room_kinds import NetworkRoom, PrivateRoom, Room

E = p.ErrorCode

@dataclass(frozen=True)
class PeerInfo:
    """A read-only view of one device, for routes outside signaling (e.g. serving data)."""

    id: str
    name: str
    kind: str
    capacity: float
    room: str | None       # "network" / "private" / None
    code: str | None       # private room code
    room_key: str | None   # stable key of the room (code, or "net:<group>")
    approved: bool
    host: bool
    online: bool


class _Conn:
    __slots__ = ("id", "group", "address", "key", "opened", "peer", "closing", "no_grace", "use")

    def __init__(self, id_: int, group: str, address: str, now: float, use: ConnectionUse):
        self.id, self.group, self.address, self.opened = id_, group, address, now
        self.key = address_key(address)
        self.peer: _Peer | None = None
        self.closing = False
        self.no_grace = False
        self.use = use


class _Peer:
    __slots__ = ("id", "token", "name", "kind", "capacity", "conn", "room", "approved", "seq",
                 "away_since", "group", "address", "key", "asked")

    def __init__(self, id_: str, token: str, hello: p.Hello, conn: _Conn):
        self.id, self.token = id_, token
        self.name, self.kind, self.capacity = hello.name, hello.kind, hello.capacity
        self.conn: int | None = conn.id
        self.group, self.address, self.key = conn.group, conn.address, conn.key
        self.asked = 0.0  # when its join request was made
        self.room: Room | None = None
        self.approved = False
        self.seq = 0
        self.away_since: float | None = None

    def device(self) -> p.Device:
        return p.Device(self.id, self.name, self.kind, self.capacity)


class Hub:
    """All rooms of one server. Not thread-safe; one event loop feeds it."""

    def __init__(self, config: ServerConfig | None = None, rng: random.Random | None = None):
        self.config = config or ServerConfig()
        self._rng = rng or secrets.SystemRandom()
        self._conns: dict[int, _Conn] = {}
        self._peers: dict[str, _Peer] = {}
        self._tokens: dict[str, _Peer] = {}
        self._away: dict[str, _Peer] = {}
        self._rooms: dict[str, Room] = {}
        self.quota = Quota(self.config)
        self.refused = self.quota.refused  # refusals by limit, for /healthz
        self._dirty: set[str] = set()  # rooms whose state waits for the round budget
        self._now = 0.0
        self._next_conn = 0
        self._seq = 0
        self._handlers: dict[type, Callable[[_Conn, object, float], list[Output]]] = {
            p.Hello: self._on_hello,
            p.Join: self._on_join,
            p.Leave: self._on_leave,
            p.Approve: self._on_approve,
            p.Deny: self._on_deny,
            p.Ping: self._on_ping,
            p.Offer: self._on_relay,
            p.Answer: self._on_relay,
            p.Candidate: self._on_relay,
            p.Broadcast: self._on_broadcast,
        }

    # -- events in ---------------------------------------------------------------------------

    def admit(self, address: str, now: float) -> p.Error | None:
        """Whether ``address`` may open another connection: None, or the error to send it
        before closing."""
        return self.quota.admit(address_key(address))

    def open(self, group: str, address: str, now: float) -> int:
        """A new connection from ``address`` whose network room is ``group``; returns its handle."""
        self._now = now
        self._next_conn += 1
        use = self.quota.connection(address_key(address), now)
        self._conns[self._next_conn] = _Conn(self._next_conn, group, address, now, use)
        return self._next_conn

    def receive(self, conn: int, frame: str | bytes, now: float) -> list[Output]:
        """One frame from a connection: rate limits (its own, its address's), parse, dispatch."""
        c = self._conns.get(conn)
        if c is None or c.closing:
            return []
        self._now = now
        refusal = self.quota.message(c.use, c.key, now)
        if refusal is not None:
            out: list[Output] = [Send(conn, refusal.error)]
            if refusal.close is not None:
                c.closing = c.no_grace = True
                out.append(Close(conn, CLOSE_POLICY, refusal.close))
            return out
        try:
            msg = p.parse_client(frame, self.config.max_message_bytes)
        except p.ProtocolError as exc:
            return [Send(conn, p.error_from(exc))]
        return self.receive_message(conn, msg, now)

    def receive_message(self, conn: int, msg: p.ClientMessage, now: float) -> list[Output]:
        """One parsed message (no rate limit): the dispatch table."""
        c = self._conns.get(conn)
        if c is None or c.closing:
            return []
        self._now = now
        try:
            return self._handlers[type(msg)](c, msg, now)
        except p.ProtocolError as exc:
            exc.ref = exc.ref or msg.TYPE
            return [Send(conn, p.error_from(exc))]

    def closed(self, conn: int, now: float) -> list[Output]:
        """The connection is gone (closed by either side)."""
        c = self._conns.pop(conn, None)
        self._now = now
        if c is not None:
            self.quota.closed(c.key, now)
        if c is None or c.peer is None:
            return []
        peer = c.peer
        peer.conn = None
        if c.no_grace or peer.room is None or not peer.approved or self.config.grace_s <= 0:
            return self._forget(peer)
        peer.away_since = now
        self._away[peer.id] = peer
        return self._changed(peer.room)

    def tick(self, now: float) -> list[Output]:
        """Timers: drop connections without hello, forget devices past their grace period."""
        out: list[Output] = []
        cfg = self.config
        for c in list(self._conns.values()):
            if c.peer is None and not c.closing and now - c.opened > cfg.hello_timeout_s:
                c.closing = True
                out.append(Close(c.id, CLOSE_IDLE, f"idle: no hello within {cfg.hello_timeout_s:g} s"))
        for peer in list(self._away.values()):
            if now - peer.away_since > cfg.grace_s:
                out += self._forget(peer)
        self._now = now
        for room in [r for r in self._rooms.values() if r.pending]:
            late = [w for w in room.pending.values() if now - w.asked > cfg.pending_timeout_s]
            for w in late:
                del room.pending[w.id]
                w.room = None
                self.refused["pending_expired"] += 1
                if w.conn is not None:
                    out.append(Send(w.conn, p.Error(
                        E.DENIED.value, f"your request to join room {room.code} expired: the "
                                        f"host did not answer within {cfg.pending_timeout_s:g} s",
                        ref="join", limit=cfg.pending_timeout_s, current=now - w.asked)))
            if late:
                out += self._changed(room)
        for key in list(self._dirty):
            room = self._rooms.get(key)
            if room is None:
                self._dirty.discard(key)
            elif room.updates.take(now):
                self._dirty.discard(key)
                out += self._round(room)
        self.quota.sweep(now)
        return out

    def shutdown(self) -> list[Output]:
        """Close every connection (the server stops)."""
        out = []
        for c in self._conns.values():
            c.closing = True
            out.append(Close(c.id, CLOSE_GOING_AWAY, "shutting_down: the server is stopping"))
        return out

    # -- read-only views ---------------------------------------------------------------------

    def stats(self) -> dict:
        cfg = self.config
        rooms = Counter(r.creator_key for r in self._rooms.values() if r.kind == "private")
        per_address = self.quota.stats(self._now)
        return {"connections": len(self._conns), "devices": len(self._peers),
                "rooms": len(self._rooms), "away": len(self._away),
                "addresses": len(self.quota.addresses),
                "pending": sum(len(r.pending) for r in self._rooms.values()),
                "coalescing_rooms": len(self._dirty),
                "per_address": {
                    "connections": per_address["connections"],
                    "private_rooms": {"limit": cfg.max_rooms_per_address,
                                      "current": max(rooms.values(), default=0)},
                    "messages_burst": per_address["messages_burst"]},
                "refused": dict(self.refused)}

    def peer_info(self, peer_id: str) -> PeerInfo | None:
        peer = self._peers.get(peer_id)
        if peer is None:
            return None
        room = peer.room
        return PeerInfo(peer.id, peer.name, peer.kind, peer.capacity,
                        room.kind if room else None, room.code if room else None,
                        room.key if room else None, peer.approved,
                        bool(room and room.host == peer.id), peer.conn is not None)

    def authenticate(self, token: str) -> PeerInfo | None:
        """The device holding reconnect ``token`` (for HTTP routes that need to know who asks)."""
        peer = self._tokens.get(token)
        return self.peer_info(peer.id) if peer else None

    def has_room(self, room_key: str) -> bool:
        """Whether the room is open (it has a member, connected or within its grace)."""
        return room_key in self._rooms

    def room_members(self, room_key: str) -> list[PeerInfo]:
        room = self._rooms.get(room_key)
        return [self.peer_info(m.id) for m in room.online()] if room else []

    # -- handlers ----------------------------------------------------------------------------

    def _on_hello(self, c: _Conn, msg: p.Hello, now: float) -> list[Output]:
        if c.peer is not None:
            raise p.ProtocolError(E.HELLO_FIRST, "hello was already sent on this connection")
        out: list[Output] = []
        peer = self._tokens.pop(msg.token, None) if msg.token else None
        resumed = peer is not None
        if resumed:
            if peer.conn is not None:  # the old socket is not dead yet: this one replaces it
                old = self._conns[peer.conn]
                old.peer, old.closing = None, True
                out.append(Close(old.id, CLOSE_REPLACED,
                                 "replaced: this device reconnected on another connection"))
            self._away.pop(peer.id, None)
            peer.away_since = None
            peer.name, peer.kind, peer.capacity = msg.name, msg.kind, msg.capacity
            peer.conn, peer.group, peer.address, peer.key = c.id, c.group, c.address, c.key
            peer.token = self._new_token()
        else:
            peer = _Peer(self._new_id(), self._new_token(), msg, c)
            self._peers[peer.id] = peer
        self._tokens[peer.token] = peer
        c.peer = peer
        out.append(Send(c.id, p.Welcome(id=peer.id, token=peer.token, resumed=resumed,
                                        ice_servers=self.config.ice_servers,
                                        limits=self.config.limits())))
        room = peer.room
        if room is not None and not (room.kind == "network" and room.key != "net:" + c.group):
            if peer.approved:
                return out + self._changed(room)
            return out + [Send(c.id, p.Pending(room.code))]
        try:  # a new device, or one back on another network: its (new) room
            return out + self._join(peer, p.ROOM_NETWORK if room is not None else msg.room)
        except p.ProtocolError as exc:
            exc.ref = "hello"
            return out + [Send(c.id, p.error_from(exc))]

    def _on_join(self, c: _Conn, msg: p.Join, now: float) -> list[Output]:
        return self._join(self._hello_done(c), msg.room)

    def _on_leave(self, c: _Conn, msg: p.Leave, now: float) -> list[Output]:
        peer = self._hello_done(c)
        if peer.room is None:
            raise p.ProtocolError(E.NOT_IN_ROOM, "you are in no room")
        return self._leave(peer)

    def _on_approve(self, c: _Conn, msg: p.Approve, now: float) -> list[Output]:
        room, target = self._host_request(c, msg.peer)
        del room.pending[target.id]
        target.approved, target.seq = True, self._next_seq()
        room.members[target.id] = target
        return self._changed(room)

    def _on_deny(self, c: _Conn, msg: p.Deny, now: float) -> list[Output]:
        room, target = self._host_request(c, msg.peer)
        del room.pending[target.id]
        target.room = None
        wait = self.quota.denied(target.key, room.key, now)
        out = self._changed(room)
        if target.conn is not None:
            out.append(Send(target.conn, p.Error(
                E.DENIED.value, f"the host of room {room.code} declined your request; you may "
                                f"ask again in {wait:g} s", ref="join", limit=wait, current=0,
                retry_after_s=wait)))
        return out

    def _on_ping(self, c: _Conn, msg: p.Ping, now: float) -> list[Output]:
        return [Send(c.id, p.Pong(t=msg.t))]

    def _on_relay(self, c: _Conn, msg, now: float) -> list[Output]:
        peer = self._member(c)
        target = self._target(peer, msg.to)
        size = len(msg.sdp) if isinstance(msg, (p.Offer, p.Answer)) else len(json.dumps(msg.candidate))
        self.quota.check_relay(c.use, size, 1, now)
        return [Send(target.conn, replace(msg, to=None, sender=peer.id))]

    def _on_broadcast(self, c: _Conn, msg: p.Broadcast, now: float) -> list[Output]:
        peer = self._member(c)
        out = replace(msg, to=None, sender=peer.id)
        size = len(json.dumps(msg.data, separators=(",", ":")))
        if msg.to is not None:
            target = self._target(peer, msg.to)
            self.quota.check_relay(c.use, size, 1, now)
            return [Send(target.conn, out)]
        to = [m for m in peer.room.online() if m is not peer]
        self.quota.check_relay(c.use, size, len(to), now)
        return [Send(m.conn, out) for m in to]

    # -- checks ------------------------------------------------------------------------------

    def _hello_done(self, c: _Conn) -> _Peer:
        if c.peer is None:
            raise p.ProtocolError(E.HELLO_FIRST, "send hello first")
        return c.peer

    def _member(self, c: _Conn) -> _Peer:
        peer = self._hello_done(c)
        if peer.room is None:
            raise p.ProtocolError(E.NOT_IN_ROOM, "you are in no room: join one first")
        if not peer.approved:
            raise p.ProtocolError(E.NOT_APPROVED,
                                  "you are waiting for the host's approval and can signal nobody")
        return peer

    def _target(self, peer: _Peer, to: str) -> _Peer:
        target = peer.room.members.get(to)
        if target is None or target.conn is None or target is peer:
            raise p.ProtocolError(E.NO_SUCH_PEER, f"{to!r} is no other connected member of your room")
        return target

    def _host_request(self, c: _Conn, peer_id: str) -> tuple[Room, _Peer]:
        peer = self._member(c)
        room = peer.room
        if room.host != peer.id or room.kind != "private":
            raise p.ProtocolError(E.NOT_HOST, "only the host of a private room approves or denies")
        target = room.pending.get(peer_id)
        if target is None:
            raise p.ProtocolError(E.NO_SUCH_PEER, f"no pending request from {peer_id!r}")
        return room, target

    # -- membership --------------------------------------------------------------------------

    def _join(self, peer: _Peer, request: str) -> list[Output]:
        request = p.normalize_room(request)
        if request == p.ROOM_NETWORK:
            key = "net:" + self._conns[peer.conn].group
            room = self._rooms.get(key)
            if room is None:
                out = self._leave(peer) if peer.room else []
                room = self._rooms[key] = self._new_room(NetworkRoom, key, None, peer.key)
                return out + self._admit(peer, room)
            return room.ask(self, peer)
        if request == p.ROOM_NEW:
            self.quota.check_rooms(sum(1 for r in self._rooms.values()
                                       if r.kind == "private" and r.creator_key == peer.key))
            out = self._leave(peer) if peer.room else []
            code = p.new_code(self._rng.getrandbits)
            while code in self._rooms:
                code = p.new_code(self._rng.getrandbits)
            room = self._rooms[code] = self._new_room(PrivateRoom, code, code, peer.key)
            return out + self._admit(peer, room)
        self.quota.check_codes(peer.key, self._now)
        room = self._rooms.get(request)
        if room is None:
            raise self.quota.wrong_code(peer.key, request, self._now)
        return room.ask(self, peer)

    def _new_room(self, kind: type[Room], key: str, code: str | None, creator_key: str) -> Room:
        cfg = self.config
        return kind(key, code, creator_key,
                    Bucket(cfg.room_updates_per_s, cfg.room_update_burst, self._now))

    def _admit(self, peer: _Peer, room: Room) -> list[Output]:
        peer.room, peer.approved, peer.seq = room, True, self._next_seq()
        room.members[peer.id] = peer
        return self._changed(room)

    def _leave(self, peer: _Peer) -> list[Output]:
        room = peer.room
        peer.room, peer.approved = None, False
        if room is None:
            return []
        room.members.pop(peer.id, None)
        room.pending.pop(peer.id, None)
        if room.members:
            return self._changed(room)
        del self._rooms[room.key]
        out = []
        for waiting in room.pending.values():  # nobody is left to approve them
            waiting.room = None
            if waiting.conn is not None:
                out.append(Send(waiting.conn, p.Error(E.NO_SUCH_ROOM.value,
                                                      f"room {room.code} closed: its last member left",
                                                      ref="join")))
        return out

    def _forget(self, peer: _Peer) -> list[Output]:
        """The device is gone for good: out of its room, its id and token forgotten."""
        out = self._leave(peer)
        self._away.pop(peer.id, None)
        self._tokens.pop(peer.token, None)
        self._peers.pop(peer.id, None)
        if peer.conn is not None:
            c = self._conns.get(peer.conn)
            if c is not None:
                c.peer = None
        return out

    def _changed(self, room: Room) -> list[Output]:
        """Re-elect the host if needed and send the room state to every connected member, or,
        past the room's round budget, mark it for the next round (``tick``): latest wins."""
        online = room.online()
        if room.host not in room.members or room.members[room.host].conn is None:
            room.host = online[0].id if online else None
        if not room.updates.take(self._now):
            self._dirty.add(room.key)
            return []
        self._dirty.discard(room.key)
        return self._round(room, online)

    def _round(self, room: Room, online: list[_Peer] | None = None) -> list[Output]:
        """The room state to every connected member."""
        online = room.online() if online is None else online
        members = tuple(p.Member(m.id, m.name, m.kind, m.capacity, m.id == room.host) for m in online)
        pending = tuple(w.device() for w in room.pending.values())
        return [Send(m.conn, p.RoomState(room=room.kind, code=room.code, you=m.id, host=room.host,
                                         members=members,
                                         pending=pending if m.id == room.host else ()))
                for m in online]

    # -- identities --------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _new_id(self) -> str:
        while True:
            pid = "%08x" % self._rng.getrandbits(32)
            if pid not in self._peers:
                return pid

    def _new_token(self) -> str:
        return base64.urlsafe_b64encode(self._rng.getrandbits(192).to_bytes(24, "big")).decode()
