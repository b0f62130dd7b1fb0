"""A tab's `.local` host candidate resolves on a native peer (pynode/comm/mdns.py).

Chromium answers an mDNS query for its candidate's name with the A record and, in the
additional section, an NSEC record whose next-domain name is a compression pointer (the
layout below was captured from Debian's Chromium). dnspython 2.9 refuses that pointer and
aioice dropped the whole answer. Here host b of two private hosts (tests/netns.py) answers
the same way and host a resolves the name with aioice's own resolver, as aiortc does for a
remote candidate.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import uuid

import pytest
from comm_helpers import REPO  # noqa: F401  (puts the repo and tests/ on sys.path)
from netns import private_network

from pynode.comm.mdns import readable

pytest.importorskip("aioice")
dns_message = pytest.importorskip("dns.message")

CACHE_FLUSH_IN = 0x8001  # class IN with the mDNS cache-flush bit


def encode_name(name: str) -> bytes:
    return b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"


def chromium_answer(name: str, address: str) -> bytes:
    """Chromium's answer to `A? name`: the A record, and an NSEC (no other types) whose
    next-domain name points back at the NSEC's own owner name."""
    owner = encode_name(name)
    header = struct.pack(">6H", 0, 0x8400, 0, 1, 0, 1)  # id, QR+AA, qd, an, ns, ar
    a_record = owner + struct.pack(">HHIH", 1, CACHE_FLUSH_IN, 120, 4) + socket.inet_aton(address)
    nsec_owner_at = len(header) + len(a_record)
    bitmap = bytes([0, 1, 0x40])  # window 0, 1 byte, type A
    nsec_rdata = struct.pack(">H", 0xC000 | nsec_owner_at) + bitmap
    nsec = owner + struct.pack(">HHIH", 47, CACHE_FLUSH_IN, 120, len(nsec_rdata)) + nsec_rdata
    return header + a_record + nsec


def test_readable_keeps_what_parses_and_drops_what_aioice_does_not_read():
    name = f"{uuid.uuid4()}.local"
    query = dns_message.make_query(name, "A").to_wire()
    assert readable(query) == query
    answer = dns_message.from_wire(readable(chromium_answer(name, "10.77.0.2")))
    (rrset,) = answer.answer
    assert str(rrset.name) == f"{name}." and rrset.rdclass == CACHE_FLUSH_IN
    assert [socket.inet_ntoa(item.to_generic().data) for item in rrset] == ["10.77.0.2"]
    assert readable(b"\0\1junk") == b"\0\1junk"


RESPONDER = """
import socket, sys
import dns.message
sys.path.insert(0, sys.argv[3])
from test_mdns import chromium_answer
name, address = sys.argv[1], sys.argv[2]
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("", 5353))
sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                socket.inet_aton("224.0.0.251") + bytes(4))
print("listening", flush=True)
while True:
    data, _ = sock.recvfrom(9000)
    message = dns.message.from_wire(data)
    if any(str(q.name) == name + "." for q in message.question):
        sock.sendto(chromium_answer(name, address), ("224.0.0.251", 5353))
"""

RESOLVER = """
import asyncio, sys
from aioice import mdns
from pynode.comm.mdns import read_chromium_answers

async def main():
    read_chromium_answers()
    read_chromium_answers()  # a second install changes nothing
    protocol = await mdns.create_mdns_protocol()
    try:
        print(await protocol.resolve(sys.argv[1], timeout=5))
    finally:
        await protocol.close()

asyncio.run(main())
"""


def test_a_native_peer_resolves_a_name_answered_as_chromium_answers():
    name = f"{uuid.uuid4()}.local"
    with private_network() as net:
        for side in ("a", "b"):  # what a LAN host has through its default route
            net.run(side, ["ip", "route", "add", "224.0.0.0/4", "dev", net.ifname[side]],
                    check=True)
        responder = net.popen("b", [sys.executable, "-c", RESPONDER, name, net.address["b"],
                                    str(REPO / "tests" / "comm")],
                              stdout=subprocess.PIPE, text=True)
        assert responder.stdout.readline().strip() == "listening"
        done = net.run("a", [sys.executable, "-c", RESOLVER, name], cwd=REPO,
                       capture_output=True, text=True)
        assert done.stdout.strip() == net.address["b"], done.stderr
