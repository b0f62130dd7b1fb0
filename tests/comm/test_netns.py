"""tests/netns.py: two private hosts that reach each other, and nothing left behind."""

from __future__ import annotations

import subprocess
import sys

import pytest
from comm_helpers import REPO  # noqa: F401  (puts tests/ on sys.path)
from netns import private_network

SERVER = """
import socket, sys
with socket.create_server((sys.argv[1], 29999)) as srv:
    print("listening", flush=True)
    conn, peer = srv.accept()
    conn.sendall(conn.recv(64).upper() + b" from " + peer[0].encode())
"""

CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], 29999), timeout=10) as sock:
    sock.sendall(b"ping")
    print(sock.recv(64).decode())
"""


def test_two_hosts_talk_over_the_veth_pair() -> None:
    with private_network() as net:
        server = net.popen(
            "a", [sys.executable, "-c", SERVER, net.address["a"]], stdout=subprocess.PIPE, text=True
        )
        assert server.stdout.readline().strip() == "listening"
        done = net.run(
            "b", [sys.executable, "-c", CLIENT, net.address["a"]], capture_output=True, text=True
        )
        assert done.stdout.strip() == f"PING from {net.address['b']}", done.stderr
        server.wait(timeout=10)
        # host b has its own loopback: nothing of host a listens there
        refused = net.run("b", [sys.executable, "-c", CLIENT, "127.0.0.1"], capture_output=True)
        assert refused.returncode != 0
    assert not net.exists()


def test_namespaces_are_removed_when_the_test_fails() -> None:
    with pytest.raises(RuntimeError, match="boom"), private_network() as net:
        net.popen("a", ["sleep", "60"])
        raise RuntimeError("boom")
    assert not net.exists()
