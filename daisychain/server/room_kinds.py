"""The two kinds of room, and how a device asks to enter each.

A network room (``net:<group>``) holds the devices of one network: a device enters at once,
unless the room is full or, in the shared ``local`` group, its address already holds half
of the seats. A private room (its code) is entered only when its host approves: asking puts
the device on the room's pending list, within the address's limits, and tells the host.

The :class:`~daisychain.server.rooms.Hub` owns the rooms; ``ask`` uses its membership
moves (``_leave``, ``_admit``, ``_changed``) and its :class:`~.quota.Quota`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daisychain import signaling as p
from .groups import LOCAL
from .outputs import Output, Send
from .quota import Bucket

if TYPE_CHECKING:
    from .rooms import Hub, _Peer

E = p.ErrorCode


class Room:
    kind = ""
    __slots__ = ("key", "code", "creator_key", "members", "pending", "host", "updates")

    def __init__(self, key: str, code: str | None, creator_key: str, updates: Bucket):
        self.key, self.code, self.creator_key = key, code, creator_key
        self.updates = updates  # room-state rounds
        self.members: dict[str, _Peer] = {}  # approved, connected or within grace
        self.pending: dict[str, _Peer] = {}
        self.host: str | None = None

    def online(self) -> list[_Peer]:
        return sorted((m for m in self.members.values() if m.conn is not None), key=lambda m: m.seq)

    def size(self) -> int:
        return len(self.members) + len(self.pending)

    def ask(self, hub: Hub, peer: _Peer) -> list[Output]:
        raise NotImplementedError


class NetworkRoom(Room):
    kind = "network"
    __slots__ = ()

    def ask(self, hub: Hub, peer: _Peer) -> list[Output]:
        if peer.room is self:
            return hub._changed(self)
        cap = hub.config.max_room_size
        if self.size() >= cap:
            raise p.LimitError(E.ROOM_FULL, f"your network room is full ({cap} devices): create "
                                            "a private room instead", limit=cap, current=self.size())
        if self.key == "net:" + LOCAL:  # many addresses share it: none may fill it
            hub.quota.check_network_seats(sum(1 for m in (*self.members.values(),
                                                          *self.pending.values())
                                              if m.key == peer.key))
        out = hub._leave(peer) if peer.room else []
        return out + hub._admit(peer, self)


class PrivateRoom(Room):
    kind = "private"
    __slots__ = ()

    def ask(self, hub: Hub, peer: _Peer) -> list[Output]:
        if peer.room is self:
            return hub._changed(self) if peer.approved else [Send(peer.conn, p.Pending(self.code))]
        quota, cfg, now = hub.quota, hub.config, hub._now
        quota.check_cooldown(peer.key, self.key, self.code, now)
        if self.size() >= cfg.max_room_size:
            raise p.LimitError(E.ROOM_FULL, f"room {self.code} is full ({cfg.max_room_size} devices)",
                               limit=cfg.max_room_size, current=self.size())
        again = [w for w in self.pending.values()
                 if w.key == peer.key and w.name == peer.name and w.kind == peer.kind]
        if not again:
            quota.check_pending(sum(1 for w in self.pending.values() if w.key == peer.key),
                                len(self.pending), self.code)
        quota.check_join_rate(peer.key, now)
        out = hub._leave(peer) if peer.room else []
        for old in again:  # the same device asking again: its new request replaces the old
            del self.pending[old.id]
            old.room = None
            if old.conn is not None:
                out.append(Send(old.conn, p.Error(E.REPLACED.value, "a newer request from this "
                                                  "device replaced this one", ref="join")))
        peer.room, peer.approved, peer.asked = self, False, now
        self.pending[peer.id] = peer
        out.append(Send(peer.conn, p.Pending(self.code)))
        host = self.members.get(self.host) if self.host else None
        if host is not None and host.conn is not None and not again:
            out.append(Send(host.conn, p.JoinRequest(peer.device())))
        return out + hub._changed(self)
