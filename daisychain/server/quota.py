"""What a client may use, as one policy object the Hub consults (docs/SECURITY.md).

Counted per client address (``groups.address_key``: an IPv4 address, an IPv6 /64), so that
reconnecting buys nothing: connections, messages, join requests, room codes tried, private
rooms created, pending requests per room, seats in a shared network room, a cool-down after
a denial. Counted per connection: messages, and the bytes it makes the server relay (fan-out
counted). Every refusal is a :class:`LimitError` with ``limit``, ``current`` and, where
waiting helps, ``retry_after_s``, and is counted in ``refused`` by the limit's name (for
``/healthz``). No sockets, no clock: the caller passes ``now``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from daisychain import signaling as p
from .config import ServerConfig

E = p.ErrorCode


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


class AddressUse:
    """What one client address has used."""

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


class ConnectionUse:
    """What one connection has used: its message tokens and its relay budget."""

    __slots__ = ("tokens", "last", "relay")

    def __init__(self, cfg: ServerConfig, now: float):
        self.tokens, self.last = cfg.burst, now
        self.relay = Bucket(cfg.relay_bytes_per_s, cfg.relay_burst_bytes, now)


@dataclass(frozen=True)
class Refusal:
    """A message refused: the error to send, and the reason to close with for a flood."""

    error: p.Error
    close: str | None = None


class Quota:
    """The limits of one server. The Hub asks before it acts; a ``check_*`` raises the
    :class:`LimitError` to answer with, a ``message`` refusal is returned."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.addresses: dict[str, AddressUse] = {}
        self.refused: Counter = Counter()

    def address(self, key: str, now: float) -> AddressUse:
        a = self.addresses.get(key)
        if a is None:
            a = self.addresses[key] = AddressUse(self.config, now)
        return a

    def connection(self, key: str, now: float) -> ConnectionUse:
        """A connection opens from address ``key``: counted, and its own budget made."""
        self.address(key, now).conns += 1
        return ConnectionUse(self.config, now)

    def closed(self, key: str, now: float) -> None:
        self.address(key, now).conns -= 1

    def sweep(self, now: float) -> None:
        """Forget the addresses that hold nothing."""
        for key in [k for k, a in self.addresses.items() if a.idle(now)]:
            del self.addresses[key]

    # -- refusals ----------------------------------------------------------------------------

    def _refuse(self, name: str, code: E, text: str, **fields) -> p.LimitError:
        self.refused[name] += 1
        return p.LimitError(code, text, **fields)

    def admit(self, key: str) -> p.Error | None:
        """Whether address ``key`` may open another connection: None, or the error to send."""
        a = self.addresses.get(key)
        cap = self.config.max_connections_per_address
        if a is None or a.conns < cap:
            return None
        return p.error_from(self._refuse(
            "connections_per_address", E.RATE_LIMITED,
            f"too many connections from your address: {a.conns} open, the limit is {cap}; "
            f"close one and try again", limit=cap, current=a.conns, retry_after_s=self.config.tick_s))

    def message(self, use: ConnectionUse, key: str, now: float) -> Refusal | None:
        """One message in, from a connection and its address."""
        cfg = self.config
        use.tokens = min(cfg.burst, use.tokens + (now - use.last) * cfg.rate_per_s)
        use.last = now
        if use.tokens < 1:
            self.refused["messages_per_connection"] += 1
            reason = f"flood: more than {cfg.rate_per_s:g} messages per second"
            return Refusal(p.Error(E.RATE_LIMITED.value, reason, limit=cfg.rate_per_s,
                                   current=cfg.burst), close=reason)
        use.tokens -= 1
        a = self.address(key, now)
        if a.msgs.take(now):
            return None
        return Refusal(p.error_from(self._refuse(
            "messages_per_address", E.RATE_LIMITED,
            f"your address sends more than {cfg.address_rate_per_s:g} messages per second "
            f"(burst {cfg.address_burst}, used {a.msgs.used()}): this one was dropped; wait "
            f"{a.msgs.wait_s():.2f} s",
            limit=cfg.address_rate_per_s, current=a.msgs.used(), retry_after_s=a.msgs.wait_s())))

    def check_relay(self, use: ConnectionUse, size: int, fanout: int, now: float) -> None:
        """A relayed message costs its size (plus framing) times its recipients."""
        cost = (size + 64) * fanout
        if fanout and not use.relay.take(now, cost):
            cfg = self.config
            raise self._refuse("relay_bytes", E.RATE_LIMITED,
                               f"relay budget spent: {cost} bytes to {fanout} members asked, the "
                               f"limit is {cfg.relay_bytes_per_s:g} bytes per second (burst "
                               f"{cfg.relay_burst_bytes}); dropped",
                               limit=cfg.relay_bytes_per_s, current=use.relay.used(),
                               retry_after_s=min(use.relay.wait_s(cost), 3600.0))

    def check_network_seats(self, held: int) -> None:
        """A shared network room (many addresses behind one group): no address fills it."""
        seats = max(1, self.config.max_room_size // 2)
        if held >= seats:
            raise self._refuse("network_seats_per_address", E.ROOM_FULL,
                               f"your address already holds {held} of the network room's seats, "
                               f"the limit is {seats}", limit=seats, current=held)

    def check_rooms(self, created: int) -> None:
        cap = self.config.max_rooms_per_address
        if created >= cap:
            raise self._refuse("rooms_per_address", E.TOO_MANY_ROOMS,
                               f"your address already has {created} private rooms open, the "
                               f"limit is {cap}: close one first", limit=cap, current=created)

    def check_codes(self, key: str, now: float) -> None:
        """Every code is refused while the address's wrong-code budget is spent, so that a
        refusal tells nothing."""
        a, cfg = self.address(key, now), self.config
        if a.codes.level(now) < 1:
            raise self._refuse("codes_per_address", E.RATE_LIMITED,
                               f"too many room codes tried from your address: the limit is "
                               f"{cfg.codes_per_min:g} wrong codes per minute; try again in "
                               f"{a.codes.wait_s():.1f} s",
                               limit=cfg.codes_per_min, current=a.codes.used(),
                               retry_after_s=a.codes.wait_s())

    def wrong_code(self, key: str, code: str, now: float) -> p.LimitError:
        """A code that names no room: charged, and the error to raise."""
        a, cfg = self.address(key, now), self.config
        a.codes.take(now)
        return p.LimitError(E.NO_SUCH_ROOM, f"there is no room {code}: check the code, or ask "
                                            f"its host for the link ({a.codes.used()} of "
                                            f"{cfg.codes_per_min:g} wrong codes per minute used)",
                            limit=cfg.codes_per_min, current=a.codes.used())

    def denied(self, key: str, room_key: str, now: float) -> float:
        """A host declined a request from ``key``: the cool-down it now waits (s)."""
        wait = self.config.deny_cooldown_s
        if wait > 0:
            self.address(key, now).denied[room_key] = now + wait
        return wait

    def check_cooldown(self, key: str, room_key: str, code: str, now: float) -> None:
        until = self.address(key, now).denied.get(room_key, 0.0)
        if until > now:
            raise self._refuse("denied_cooldown", E.DENIED,
                               f"the host of room {code} declined a request from your address; "
                               f"you may ask again in {until - now:.0f} s",
                               limit=self.config.deny_cooldown_s, current=until - now,
                               retry_after_s=until - now)

    def check_pending(self, mine: int, waiting: int, code: str) -> None:
        """A new request in a private room: ``mine`` from this address, ``waiting`` in all."""
        cfg = self.config
        if mine >= cfg.max_pending_per_address:
            raise self._refuse("pending_per_address", E.TOO_MANY_PENDING,
                               f"your address already has {mine} requests waiting in room "
                               f"{code}, the limit is {cfg.max_pending_per_address}",
                               limit=cfg.max_pending_per_address, current=mine,
                               retry_after_s=cfg.pending_timeout_s)
        if waiting >= cfg.max_pending:
            raise p.LimitError(E.TOO_MANY_PENDING, f"room {code} already has {cfg.max_pending} "
                                                   f"requests waiting: try later",
                               limit=cfg.max_pending, current=waiting)

    def check_join_rate(self, key: str, now: float) -> None:
        a, cfg = self.address(key, now), self.config
        if not a.joins.take(now):
            raise self._refuse("join_requests_per_address", E.RATE_LIMITED,
                               f"too many join requests from your address: the limit is "
                               f"{cfg.join_requests_per_min:g} per minute; try again in "
                               f"{a.joins.wait_s():.1f} s",
                               limit=cfg.join_requests_per_min, current=a.joins.used(),
                               retry_after_s=a.joins.wait_s())

    def stats(self, now: float) -> dict:
        """The busiest address's use (for ``/healthz``)."""
        busiest = max(self.addresses.values(), key=lambda a: a.conns, default=None)
        cfg = self.config
        return {"connections": {"limit": cfg.max_connections_per_address,
                                "current": busiest.conns if busiest else 0},
                "messages_burst": {"limit": cfg.address_burst,
                                   "current": max((a.msgs.cap - a.msgs.level(now)
                                                   for a in self.addresses.values()), default=0)}}
