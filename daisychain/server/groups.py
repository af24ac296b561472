"""Which network room a connection belongs to: its public address, grouped.

- The address is the socket's peer address. ``X-Forwarded-For`` is read only when that peer
  is a trusted proxy (``--trust-proxy``); then the right-most hop that is not itself a
  trusted proxy is the client. From anyone else the header is ignored, so a client cannot
  choose its group.
- IPv6 addresses group by their /64 (one home or office network); IPv4 by the address.
- Per-address limits (``address_key``) count the same way, except that the server's own
  networks are not pooled: each LAN device (each IPv4 address, each IPv6 /64) has its own.
- Loopback, RFC 1918, link-local and IPv6 ULA addresses are the server's
  own networks: they all form one ``local`` group, so the devices on the server's LAN find
  each other whatever their private address.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

LOCAL = "local"
_LOCAL_NETS = tuple(ipaddress.ip_network(n) for n in (
    "127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
    "::1/128", "fc00::/7", "fe80::/10"))


def parse_ip(text: str | None) -> IPAddress | None:
    if not text:
        return None
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.split(":")[0]
    try:
        ip = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return ip.ipv4_mapped
    return ip


def client_address(peer: str | None, forwarded_for: str | None,
                   trusted: Iterable[ipaddress._BaseNetwork]) -> IPAddress | None:
    """The client's address: the socket peer, or what a trusted proxy forwarded."""
    ip = parse_ip(peer)
    trusted = tuple(trusted)

    def is_trusted(a: IPAddress) -> bool:
        return any(a.version == n.version and a in n for n in trusted)

    if ip is None or not forwarded_for or not is_trusted(ip):
        return ip
    for hop in reversed(forwarded_for.split(",")):
        hop_ip = parse_ip(hop)
        if hop_ip is None:
            return ip  # a garbled header from behind the proxy: trust only what we saw
        ip = hop_ip
        if not is_trusted(hop_ip):
            return hop_ip
    return ip


def network_group(ip: IPAddress | None) -> str:
    """The key of the network room of a client address."""
    if ip is None or any(ip.version == n.version and ip in n for n in _LOCAL_NETS):
        return LOCAL
    if isinstance(ip, ipaddress.IPv6Address):
        return "v6:" + str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return "v4:" + str(ip)


def address_key(address: str | None) -> str:
    """The key that per-address limits count under: an IPv6 address by its /64 (a host may
    hold the whole /64), an IPv4 address by itself. Unlike :func:`network_group`, the server's
    own networks are not pooled, so each device of the LAN has its own budget."""
    ip = parse_ip(address) if address else None
    if ip is None:
        return str(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip != ipaddress.IPv6Address("::1"):
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)
