"""Server settings: one dataclass, validated once, shown in ``daisychain serve --help``."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field, fields
from pathlib import Path


class ConfigError(ValueError):
    """A setting that cannot work, with a message saying which and why."""


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8787
    #: CIDRs of reverse proxies whose X-Forwarded-For is believed; from anyone else it is ignored.
    trust_proxy: tuple[str, ...] = ()
    #: RTCIceServer dicts handed to clients (``/ice-servers`` and ``welcome``). Default: none.
    ice_servers: tuple[dict, ...] = ()
    #: Largest signaling frame, in bytes; bigger ones get a ``too_large`` error.
    max_message_bytes: int = 64 * 1024
    #: Messages per second per connection (sustained) and the burst allowed above it.
    rate_per_s: float = 50.0
    burst: int = 200
    max_room_size: int = 64
    max_pending: int = 16
    #: Private rooms that one client address may have open at once.
    max_rooms_per_address: int = 16
    #: Seconds a dropped device keeps its id and approval for a reconnect with its token.
    grace_s: float = 30.0
    #: WebSocket ping interval; a connection that does not answer is dropped.
    ping_interval_s: float = 20.0
    #: Seconds a new connection has to send its hello.
    hello_timeout_s: float = 10.0
    #: How often timers (grace, hello timeout) are checked.
    tick_s: float = 1.0
    #: Frames queued for one slow connection before it is dropped.
    send_queue: int = 1024
    trusted_networks: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name, None)
            if f.name in ("host", "trust_proxy", "ice_servers", "trusted_networks"):
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{f.name} must be a non-negative number, not {v!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0..65535, not {self.port}")
        for name in ("max_message_bytes", "rate_per_s", "burst", "max_room_size",
                     "ping_interval_s", "hello_timeout_s", "tick_s", "send_queue"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        nets = []
        for cidr in self.trust_proxy:
            try:
                nets.append(ipaddress.ip_network(cidr, strict=False))
            except ValueError as exc:
                raise ConfigError(f"--trust-proxy {cidr!r} is not a CIDR: {exc}") from None
        object.__setattr__(self, "trusted_networks", tuple(nets))
        object.__setattr__(self, "trust_proxy", tuple(self.trust_proxy))
        object.__setattr__(self, "ice_servers", tuple(check_ice_servers(list(self.ice_servers))))

    def limits(self) -> dict:
        """The limits a client is told in ``welcome``."""
        return {"max_message_bytes": self.max_message_bytes, "rate_per_s": self.rate_per_s,
                "burst": self.burst, "max_room_size": self.max_room_size,
                "max_pending": self.max_pending, "grace_s": self.grace_s}


def check_ice_servers(servers: object) -> list[dict]:
    """A JSON list of RTCIceServer dicts: each with ``urls`` (string or list of strings)."""
    if not isinstance(servers, list):
        raise ConfigError("ice servers must be a JSON list of RTCIceServer objects")
    for i, s in enumerate(servers):
        urls = s.get("urls") if isinstance(s, dict) else None
        if isinstance(urls, str):
            urls = [urls]
        if not urls or not isinstance(urls, list) or not all(
                isinstance(u, str) and u.split(":", 1)[0] in ("stun", "stuns", "turn", "turns")
                for u in urls):
            raise ConfigError(f"ice server #{i}: 'urls' must be stun:/turn: URL(s), got {s!r}")
        for key in ("username", "credential"):
            if key in s and not isinstance(s[key], str):
                raise ConfigError(f"ice server #{i}: '{key}' must be a string")
    return servers


def load_ice_servers(path: str | Path) -> list[dict]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read ice servers from {path}: {exc}") from None
    return check_ice_servers(data)
