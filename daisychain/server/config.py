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
    #: Bytes queued for one slow connection before it is dropped (room states coalesce:
    #: at most one, the latest, waits per connection).
    send_queue_bytes: int = 1 << 20

    # -- per client address (an IPv4 address, an IPv6 /64; groups.address_key) --------------
    #: Signaling connections (``/ws``) open at once from one address.
    max_connections_per_address: int = 16
    #: Messages per second from one address over all its connections, and the burst.
    address_rate_per_s: float = 200.0
    address_burst: int = 1000
    #: Requests to join private rooms per minute from one address (also the burst).
    join_requests_per_min: float = 30.0
    #: Room codes tried per minute from one address (also the burst); while it is spent every
    #: code is refused, right or wrong, so refusals say nothing about which codes exist.
    codes_per_min: float = 10.0
    #: Join requests from one address waiting in one room; a device asking again replaces
    #: its own earlier request instead of adding one.
    max_pending_per_address: int = 4
    #: Seconds a denied address must wait before asking the same room again.
    deny_cooldown_s: float = 60.0
    #: Seconds a join request waits for the host before it expires.
    pending_timeout_s: float = 300.0
    #: Bytes per second one connection may make the server relay (a broadcast to n members
    #: costs n times its size), and the burst.
    relay_bytes_per_s: float = float(1 << 20)
    relay_burst_bytes: int = 4 << 20
    #: Room-state rounds per second per room, and the burst; changes beyond it coalesce into
    #: the next round (latest wins).
    room_updates_per_s: float = 10.0
    room_update_burst: int = 20

    # -- HTTP ---------------------------------------------------------------------------------
    #: Open TCP connections (HTTP and WebSocket) in all; lowered at start to stay below the
    #: process's file limit, so /healthz always answers.
    max_sockets: int = 4096
    #: Open TCP connections from one address (trusted proxies are exempt).
    max_sockets_per_address: int = 48
    #: Seconds a connection may take to send a request's headers (and to sit idle between
    #: requests).
    header_timeout_s: float = 10.0
    #: Seconds an upload may take to arrive in full.
    body_timeout_s: float = 30.0
    #: Uploads (checkpoint conversions) read at once; more get 503 with Retry-After.
    max_uploads: int = 2
    #: Largest upload, in bytes.
    max_upload_bytes: int = 64 << 20

    # -- uploaded data (docs/SECURITY.md, "Uploaded data") ------------------------------------
    #: Who in a room may upload data for it: "host" or "members" (approved members).
    uploads_by: str = "host"
    #: Uploaded data sets one room keeps (until it closes), and their bytes (as DCDS) together.
    room_uploads: int = 4
    room_upload_bytes: int = 32 << 20
    #: Bytes of uploaded data one client address keeps on the server, over all its rooms.
    address_upload_bytes: int = 64 << 20
    #: Uploads per minute per client address (also the burst).
    uploads_per_min: float = 6.0
    #: Uploads of one client address being parsed at once.
    parses_per_address: int = 1
    #: Threads that parse uploads (for all rooms); a parse past its time gets 503.
    parse_workers: int = 2
    parse_timeout_s: float = 30.0
    #: What an uploaded file may hold: CSV columns, CSV rows, distinct characters (the text
    #: task's classes).
    upload_max_columns: int = 64
    upload_max_rows: int = 200_000
    upload_max_classes: int = 1024
    #: QR codes drawn per minute per client address (also the burst); drawn codes are cached.
    qr_per_min: float = 60.0
    # -- Hub data sets fetched for a room (``serve --hub``, server/routes/hub.py) -------------
    #: Whether a room's host may name a Hugging Face data set for the server to fetch.
    hub: bool = False
    #: The most rows one fetch reads (its size cap; the room's upload quotas hold as well).
    hub_max_rows: int = 20_000
    #: A folder that stands in for the Hub: ``owner/name`` is read from ``<folder>/owner/name``
    #: (a mirror for a machine without internet, and the tests'); "" reads the Hub itself.
    hub_mirror: str = ""
    trusted_networks: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name, None)
            if f.name in ("host", "trust_proxy", "ice_servers", "trusted_networks", "uploads_by",
                          "hub", "hub_mirror"):
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{f.name} must be a non-negative number, not {v!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be 0..65535, not {self.port}")
        for name in ("max_message_bytes", "rate_per_s", "burst", "max_room_size",
                     "ping_interval_s", "hello_timeout_s", "tick_s", "send_queue",
                     "send_queue_bytes", "max_connections_per_address", "address_rate_per_s",
                     "address_burst", "join_requests_per_min", "codes_per_min",
                     "max_pending_per_address", "pending_timeout_s", "relay_bytes_per_s",
                     "relay_burst_bytes", "room_updates_per_s", "room_update_burst",
                     "max_sockets", "max_sockets_per_address", "header_timeout_s",
                     "body_timeout_s", "max_uploads", "max_upload_bytes", "room_uploads",
                     "room_upload_bytes", "address_upload_bytes", "uploads_per_min",
                     "parses_per_address", "parse_workers", "parse_timeout_s",
                     "upload_max_columns", "upload_max_rows", "upload_max_classes", "qr_per_min",
                     "hub_max_rows"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.uploads_by not in ("host", "members"):
            raise ConfigError(f"uploads_by must be 'host' or 'members', not {self.uploads_by!r}")
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
                "max_pending": self.max_pending, "grace_s": self.grace_s,
                "max_connections_per_address": self.max_connections_per_address,
                "address_rate_per_s": self.address_rate_per_s,
                "join_requests_per_min": self.join_requests_per_min,
                "codes_per_min": self.codes_per_min, "deny_cooldown_s": self.deny_cooldown_s,
                "pending_timeout_s": self.pending_timeout_s}

    def all_limits(self) -> dict:
        """Every limit by name (for ``/healthz``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("host", "port", "trust_proxy", "ice_servers", "trusted_networks")}


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
