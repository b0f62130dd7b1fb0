"""Whether a server address names this machine alone: the server's start-up line (who can
reach it) and a native peer's refusal hint ask the same question here (the page asks it
of its own address in server/static/app.js, LOOPBACK_PAGE)."""

from __future__ import annotations

import ipaddress
import socket


def only_this_machine(host: str) -> bool:
    """Whether `host` (a name or an address, as a URL or --host gives it) reaches this
    machine only: localhost, a name under .localhost, or a loopback address (an IPv4 one
    written short, 127.1, or mapped into IPv6, ::ffff:127.0.0.1, too)."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        if not name or not all(c.isdigit() or c == "." for c in name):
            return False
        try:  # the forms inet_aton reads and browsers take: 127.1, 2130706433
            address = ipaddress.IPv4Address(socket.inet_aton(name))
        except OSError:
            return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
