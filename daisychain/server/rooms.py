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

And the limits (``docs/SECURITY.md``), counted per client address (``groups.address_key``:
an IPv4 address, an IPv6 /64) so that reconnecting buys nothing: connections, messages,
join requests, room codes tried, pending requests per room, a cool-down after a denial;
per connection: the bytes it makes the server relay (fan-out counted); per room: room-state
rounds per second, beyond which changes coalesce (latest wins). Each refusal is an ``error``
with ``limit``, ``current`` and, where waiting helps, ``retry_after_s``.
"""

from __future__ import annotations

import base64
import json
import random
import secrets
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Union

from daisychain import signaling as p
from .config import ServerConfig
from .groups import LOCAL, address_key

E = p.ErrorCode

#: WebSocket close codes the hub asks for.
CLOSE_POLICY = 1008      # flood
CLOSE_GOING_AWAY = 1001  # shutdown
CLOSE_REPLACED = 4001
CLOSE_IDLE = 4002


@dataclass(frozen=True)
class Send:
    conn: int
    message: p.ServerMessage


@dataclass(frozen=True)
class Close:
    conn: int
    code: int
    reason: str


Output = Union[Send, Close]


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


class Bucket:
    """A token bucket: ``rate`` per second, at most ``cap``."""

    __slots__ = ("rate", "cap", "tokens", "last")

    def __init__(self, rate: float, cap: float, now: float):
        self.rate, self.cap, self.tokens, self.last = rate, cap, float(cap), now

    def level(self, now: float) -> float:
        if now > self.last:
            self.tokens = min(self.cap, self.tokens + (now - self.last) * self.rate)
            self.last = now
        return self.tokens

    def take(self, now: float, n: float = 1.0) -> bool:
        if self.level(now) < n:
            return False
        self.tokens -= n
        return True

    def used(self) -> int:
        return int(round(self.cap - self.tokens))

    def wait_s(self, n: float = 1.0) -> float:
        return max(0.0, (n - self.tokens) / self.rate) if self.rate > 0 else float("inf")

    def full(self, now: float) -> bool:
        return self.level(now) >= self.cap


class _Addr:
    """What one client address (``address_key``) has used."""

    __slots__ = ("conns", "msgs", "joins", "codes", "denied")

    def __init__(self, cfg: ServerConfig, now: float):
        self.conns = 0
        self.msgs = Bucket(cfg.address_rate_per_s, cfg.address_burst, now)
        self.joins = Bucket(cfg.join_requests_per_min / 60, cfg.join_requests_per_min, now)
        self.codes = Bucket(cfg.codes_per_min / 60, cfg.codes_per_min, now)
        self.denied: dict[str, float] = {}  # room key -> may ask again at

    def idle(self, now: float) -> bool:
        return (self.conns == 0 and not any(t > now for t in self.denied.values())
                and self.msgs.full(now) and self.joins.full(now) and self.codes.full(now))


class _Conn:
    __slots__ = ("id", "group", "address", "key", "opened", "peer", "closing", "tokens", "last",
                 "no_grace", "relay")

    def __init__(self, id_: int, group: str, address: str, now: float, cfg: ServerConfig):
        self.id, self.group, self.address, self.opened = id_, group, address, now
        self.key = address_key(address)
        self.peer: _Peer | None = None
        self.closing = False
        self.no_grace = False
        self.tokens, self.last = cfg.burst, now
        self.relay = Bucket(cfg.relay_bytes_per_s, cfg.relay_burst_bytes, now)


class _Peer:
    __slots__ = ("id", "token", "name", "kind", "capacity", "conn", "room", "approved", "seq",
                 "away_since", "group", "address", "key", "asked")

    def __init__(self, id_: str, token: str, hello: p.Hello, conn: _Conn):
        self.id, self.token = id_, token
        self.name, self.kind, self.capacity = hello.name, hello.kind, hello.capacity
        self.conn: int | None = conn.id
        self.group, self.address, self.key = conn.group, conn.address, conn.key
        self.asked = 0.0  # when its join request was made
        self.room: _Room | None = None
        self.approved = False
        self.seq = 0
        self.away_since: float | None = None

    def device(self) -> p.Device:
        return p.Device(self.id, self.name, self.kind, self.capacity)


class _Room:
    __slots__ = ("key", "kind", "code", "creator_key", "members", "pending", "host", "updates")

    def __init__(self, key: str, kind: str, code: str | None, creator_key: str,
                 updates: Bucket):
        self.key, self.kind, self.code, self.creator_key = key, kind, code, creator_key
        self.updates = updates  # room-state rounds
        self.members: dict[str, _Peer] = {}  # approved, connected or within grace
        self.pending: dict[str, _Peer] = {}
        self.host: str | None = None

    def online(self) -> list[_Peer]:
        return sorted((m for m in self.members.values() if m.conn is not None), key=lambda m: m.seq)

    def size(self) -> int:
        return len(self.members) + len(self.pending)


class Hub:
    """All rooms of one server. Not thread-safe; one event loop feeds it."""

    def __init__(self, config: ServerConfig | None = None, rng: random.Random | None = None):
        self.config = config or ServerConfig()
        self._rng = rng or secrets.SystemRandom()
        self._conns: dict[int, _Conn] = {}
        self._peers: dict[str, _Peer] = {}
        self._tokens: dict[str, _Peer] = {}
        self._away: dict[str, _Peer] = {}
        self._rooms: dict[str, _Room] = {}
        self._addrs: dict[str, _Addr] = {}
        self._dirty: set[str] = set()  # rooms whose state waits for the round budget
        self.refused: Counter = Counter()  # refusals by limit, for /healthz
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
        a = self._addrs.get(address_key(address))
        cap = self.config.max_connections_per_address
        if a is None or a.conns < cap:
            return None
        self.refused["connections_per_address"] += 1
        return p.error_from(p.LimitError(
            E.RATE_LIMITED, f"too many connections from your address: {a.conns} open, the "
                            f"limit is {cap}; close one and try again",
            limit=cap, current=a.conns, retry_after_s=self.config.tick_s))

    def open(self, group: str, address: str, now: float) -> int:
        """A new connection from ``address`` whose network room is ``group``; returns its handle."""
        self._now = now
        self._next_conn += 1
        c = self._conns[self._next_conn] = _Conn(self._next_conn, group, address, now, self.config)
        self._addr(c.key, now).conns += 1
        return self._next_conn

    def receive(self, conn: int, frame: str | bytes, now: float) -> list[Output]:
        """One frame from a connection: rate limits (its own, its address's), parse, dispatch."""
        c = self._conns.get(conn)
        if c is None or c.closing:
            return []
        self._now = now
        cfg = self.config
        c.tokens = min(cfg.burst, c.tokens + (now - c.last) * cfg.rate_per_s)
        c.last = now
        if c.tokens < 1:
            c.closing = c.no_grace = True
            self.refused["messages_per_connection"] += 1
            reason = f"flood: more than {cfg.rate_per_s:g} messages per second"
            return [Send(conn, p.Error(E.RATE_LIMITED.value, reason, limit=cfg.rate_per_s,
                                       current=cfg.burst)),
                    Close(conn, CLOSE_POLICY, reason)]
        c.tokens -= 1
        a = self._addr(c.key, now)
        if not a.msgs.take(now):
            self.refused["messages_per_address"] += 1
            return [Send(conn, p.error_from(p.LimitError(
                E.RATE_LIMITED, f"your address sends more than {cfg.address_rate_per_s:g} "
                                f"messages per second (burst {cfg.address_burst}, used "
                                f"{a.msgs.used()}): this one was dropped; wait "
                                f"{a.msgs.wait_s():.2f} s",
                limit=cfg.address_rate_per_s, current=a.msgs.used(),
                retry_after_s=a.msgs.wait_s())))]
        try:
            msg = p.parse_client(frame, cfg.max_message_bytes)
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
            self._addr(c.key, now).conns -= 1
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
        for key in [k for k, a in self._addrs.items() if a.idle(now)]:
            del self._addrs[key]
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
        cfg, now = self.config, self._now
        busiest = max(self._addrs.values(), key=lambda a: a.conns, default=None)
        return {"connections": len(self._conns), "devices": len(self._peers),
                "rooms": len(self._rooms), "away": len(self._away),
                "addresses": len(self._addrs),
                "pending": sum(len(r.pending) for r in self._rooms.values()),
                "coalescing_rooms": len(self._dirty),
                "per_address": {
                    "connections": {"limit": cfg.max_connections_per_address,
                                    "current": busiest.conns if busiest else 0},
                    "private_rooms": {"limit": cfg.max_rooms_per_address,
                                      "current": max(Counter(r.creator_key for r in self._rooms.values()
                                                             if r.kind == "private").values(),
                                                     default=0)},
                    "messages_burst": {"limit": cfg.address_burst,
                                       "current": max((a.msgs.cap - a.msgs.level(now)
                                                       for a in self._addrs.values()), default=0)}},
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
        wait = self.config.deny_cooldown_s
        if wait > 0:
            self._addr(target.key, now).denied[room.key] = now + wait
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
        self._charge_relay(c, size, 1, now)
        return [Send(target.conn, replace(msg, to=None, sender=peer.id))]

    def _on_broadcast(self, c: _Conn, msg: p.Broadcast, now: float) -> list[Output]:
        peer = self._member(c)
        out = replace(msg, to=None, sender=peer.id)
        size = len(json.dumps(msg.data, separators=(",", ":")))
        if msg.to is not None:
            target = self._target(peer, msg.to)
            self._charge_relay(c, size, 1, now)
            return [Send(target.conn, out)]
        to = [m for m in peer.room.online() if m is not peer]
        self._charge_relay(c, size, len(to), now)
        return [Send(m.conn, out) for m in to]

    def _charge_relay(self, c: _Conn, size: int, fanout: int, now: float) -> None:
        """A relayed message costs its size (plus framing) times its recipients."""
        cost = (size + 64) * fanout
        if fanout and not c.relay.take(now, cost):
            cfg = self.config
            self.refused["relay_bytes"] += 1
            raise p.LimitError(E.RATE_LIMITED, f"relay budget spent: {cost} bytes to {fanout} "
                                               f"members asked, the limit is "
                                               f"{cfg.relay_bytes_per_s:g} bytes per second "
                                               f"(burst {cfg.relay_burst_bytes}); dropped",
                               limit=cfg.relay_bytes_per_s, current=c.relay.used(),
                               retry_after_s=min(c.relay.wait_s(cost), 3600.0))

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

    def _host_request(self, c: _Conn, peer_id: str) -> tuple[_Room, _Peer]:
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
        cfg, now = self.config, self._now
        request = p.normalize_room(request)
        if request == p.ROOM_NETWORK:
            group = self._conns[peer.conn].group
            key = "net:" + group
            room = self._rooms.get(key)
            if room is not None and peer.room is room:
                return self._changed(room)
            if room is not None and room.size() >= cfg.max_room_size:
                raise p.LimitError(E.ROOM_FULL, f"your network room is full ({cfg.max_room_size} "
                                                "devices): create a private room instead",
                                   limit=cfg.max_room_size, current=room.size())
            if room is not None and group == LOCAL:  # many addresses share it: none may fill it
                seats = max(1, cfg.max_room_size // 2)
                mine = sum(1 for m in (*room.members.values(), *room.pending.values())
                           if m.key == peer.key)
                if mine >= seats:
                    self.refused["network_seats_per_address"] += 1
                    raise p.LimitError(E.ROOM_FULL, f"your address already holds {mine} of the "
                                                    f"network room's seats, the limit is {seats}",
                                       limit=seats, current=mine)
            out = self._leave(peer) if peer.room else []
            if room is None:
                room = self._rooms[key] = self._new_room(key, "network", None, peer.key)
            return out + self._admit(peer, room)
        if request == p.ROOM_NEW:
            mine = sum(1 for r in self._rooms.values()
                       if r.kind == "private" and r.creator_key == peer.key)
            if mine >= cfg.max_rooms_per_address:
                self.refused["rooms_per_address"] += 1
                raise p.LimitError(E.TOO_MANY_ROOMS, f"your address already has {mine} private "
                                                     f"rooms open, the limit is "
                                                     f"{cfg.max_rooms_per_address}: close one first",
                                   limit=cfg.max_rooms_per_address, current=mine)
            out = self._leave(peer) if peer.room else []
            code = p.new_code(self._rng.getrandbits)
            while code in self._rooms:
                code = p.new_code(self._rng.getrandbits)
            room = self._rooms[code] = self._new_room(code, "private", code, peer.key)
            return out + self._admit(peer, room)
        a = self._addr(peer.key, now)
        if a.codes.level(now) < 1:  # every code refused while spent: a refusal tells nothing
            self.refused["codes_per_address"] += 1
            raise p.LimitError(E.RATE_LIMITED, f"too many room codes tried from your address: "
                                               f"the limit is {cfg.codes_per_min:g} wrong codes "
                                               f"per minute; try again in {a.codes.wait_s():.1f} s",
                               limit=cfg.codes_per_min, current=a.codes.used(),
                               retry_after_s=a.codes.wait_s())
        room = self._rooms.get(request)
        if room is None:
            a.codes.take(now)
            raise p.LimitError(E.NO_SUCH_ROOM, f"there is no room {request}: check the code, or "
                                               f"ask its host for the link ({a.codes.used()} of "
                                               f"{cfg.codes_per_min:g} wrong codes per minute used)",
                               limit=cfg.codes_per_min, current=a.codes.used())
        if peer.room is room:
            return self._changed(room) if peer.approved else [Send(peer.conn, p.Pending(room.code))]
        until = a.denied.get(room.key, 0.0)
        if until > now:
            self.refused["denied_cooldown"] += 1
            raise p.LimitError(E.DENIED, f"the host of room {room.code} declined a request from "
                                         f"your address; you may ask again in {until - now:.0f} s",
                               limit=cfg.deny_cooldown_s, current=until - now,
                               retry_after_s=until - now)
        if room.size() >= cfg.max_room_size:
            raise p.LimitError(E.ROOM_FULL, f"room {room.code} is full ({cfg.max_room_size} devices)",
                               limit=cfg.max_room_size, current=room.size())
        again = [w for w in room.pending.values()
                 if w.key == peer.key and w.name == peer.name and w.kind == peer.kind]
        if not again:
            mine = sum(1 for w in room.pending.values() if w.key == peer.key)
            if mine >= cfg.max_pending_per_address:
                self.refused["pending_per_address"] += 1
                raise p.LimitError(E.TOO_MANY_PENDING, f"your address already has {mine} requests "
                                                       f"waiting in room {room.code}, the limit is "
                                                       f"{cfg.max_pending_per_address}",
                                   limit=cfg.max_pending_per_address, current=mine,
                                   retry_after_s=cfg.pending_timeout_s)
            if len(room.pending) >= cfg.max_pending:
                raise p.LimitError(E.TOO_MANY_PENDING, f"room {room.code} already has "
                                                       f"{cfg.max_pending} requests waiting: try later",
                                   limit=cfg.max_pending, current=len(room.pending))
        if not a.joins.take(now):
            self.refused["join_requests_per_address"] += 1
            raise p.LimitError(E.RATE_LIMITED, f"too many join requests from your address: the "
                                               f"limit is {cfg.join_requests_per_min:g} per minute; "
                                               f"try again in {a.joins.wait_s():.1f} s",
                               limit=cfg.join_requests_per_min, current=a.joins.used(),
                               retry_after_s=a.joins.wait_s())
        out = self._leave(peer) if peer.room else []
        for old in again:  # the same device asking again: its new request replaces the old
            del room.pending[old.id]
            old.room = None
            if old.conn is not None:
                out.append(Send(old.conn, p.Error(E.REPLACED.value, "a newer request from this "
                                                  "device replaced this one", ref="join")))
        peer.room, peer.approved, peer.asked = room, False, now
        room.pending[peer.id] = peer
        out.append(Send(peer.conn, p.Pending(room.code)))
        host = room.members.get(room.host) if room.host else None
        if host is not None and host.conn is not None and not again:
            out.append(Send(host.conn, p.JoinRequest(peer.device())))
        return out + self._changed(room)

    def _new_room(self, key: str, kind: str, code: str | None, creator_key: str) -> _Room:
        cfg = self.config
        return _Room(key, kind, code, creator_key,
                     Bucket(cfg.room_updates_per_s, cfg.room_update_burst, self._now))

    def _addr(self, key: str, now: float) -> _Addr:
        a = self._addrs.get(key)
        if a is None:
            a = self._addrs[key] = _Addr(self.config, now)
        return a

    def _admit(self, peer: _Peer, room: _Room) -> list[Output]:
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

    def _changed(self, room: _Room) -> list[Output]:
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

    def _round(self, room: _Room, online: list[_Peer] | None = None) -> list[Output]:
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
