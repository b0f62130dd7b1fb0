"""Which public address a request comes from, and which auto room that address belongs to."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any


def client_address(environ: Mapping[str, Any], header: str | None, hops: int = 1) -> str:
    """The client's address: the socket peer, or what a trusted proxy wrote in ``header``.

    Each proxy appends the address it saw to ``X-Forwarded-For``; the client controls
    everything to the left, so with ``hops`` trusted proxies the ``hops``-th entry from
    the right is the first one nobody could forge.
    """
    remote = str(environ.get("REMOTE_ADDR") or "")
    if header is None:
        return remote
    raw = environ.get("HTTP_" + header.upper().replace("-", "_"))
    if not raw:
        return remote
    entries = [part.strip() for part in str(raw).split(",") if part.strip()]
    if not entries:
        return remote
    candidate = entries[-hops] if len(entries) >= hops else entries[0]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        return remote


def address_group(address: str) -> str:
    """The auto-room grouping of an address.

    IPv4: the address itself (devices behind one NAT share it). IPv6: the /64 prefix,
    because every device of a home network gets its own address inside one /64.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "unknown:" + address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)
