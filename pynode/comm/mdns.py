"""Chromium's mDNS answers made readable to aioice, so a tab's `.local` host candidate resolves.

Chromium hides a tab's host address behind a random `NAME.local` (RFC 8828, mDNS ICE
candidates). aioice resolves such a candidate itself: it multicasts a query for the name
on the local network and reads the answer. Chromium answers with the A record and, in the
additional section, an NSEC record whose next-domain name is compressed, as mDNS allows
(RFC 6762 section 18.14). dnspython 2.9 refuses that compression (`DecompressionForbidden`,
a `FormError`), aioice then drops the whole answer, the name never resolves and, with no
other candidate, ICE fails: the tab never connects to the native peer.

aioice reads only the question and answer sections of a message, so `read_chromium_answers`
hands it a message dnspython cannot parse again without its authority and additional
sections.
"""

from __future__ import annotations

from typing import Any

_MARK = "_pynode_readable"  # set on the installed wrapper: install once


def read_chromium_answers() -> None:
    """Let aioice's mDNS resolver read answers that carry a compressed NSEC (idempotent)."""
    from aioice import mdns

    receive = mdns.MDnsProtocol.datagram_received
    if getattr(receive, _MARK, False):
        return

    def datagram_received(self: Any, data: bytes, addr: tuple[Any, ...]) -> None:
        receive(self, readable(data), addr)

    setattr(datagram_received, _MARK, True)
    mdns.MDnsProtocol.datagram_received = datagram_received  # type: ignore[method-assign]


def readable(data: bytes) -> bytes:
    """`data` as it is if dnspython parses it, else the same message without its authority
    and additional sections (or `data` again if even that fails)."""
    import dns.exception
    import dns.message

    try:
        dns.message.from_wire(data)
        return data
    except dns.exception.DNSException:
        pass
    # Header: id, flags, then the counts of question, answer, authority, additional (u16 each).
    if len(data) < 12:
        return data
    try:
        message = dns.message.from_wire(data[:8] + bytes(4) + data[12:], ignore_trailing=True)
    except dns.exception.DNSException:
        return data
    return message.to_wire()
