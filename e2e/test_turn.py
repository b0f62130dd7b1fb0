"""Peers on networks that cannot reach each other train through a real TURN server (coturn).

Three spoke namespaces reach only a hub (e2e/private_net.py `SeparateNets`), where the
server and coturn run; the hub forwards nothing between spokes. The host's tab, another
tab and a native `join` each sit in their own spoke, so every pair connects through relayed
candidates: the server hands each approved peer a short-lived coturn REST credential
(`--ice-server turn:... --turn-secret`) and ICE picks a pair that works. The server does
not ask for relay-only: the relay is what ICE chose. A spoke's own (host) address reaches
the hub, so a selected pair may join one peer's host candidate to the other's relay
candidate; either way every byte between the peers passes through coturn, and every
selected pair must have an end on coturn's relay address and ports (`relayed`). Chromium
keeps its default flags. The connectivity matrix (each peer's measured links, shared with
the others) reaches every peer: the host's tab has every direction, and `join` prints it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from browser_helpers import (
    CHROMIUM_FLAGS,
    Tabs,
    approve_ids,
    missing_browser_parts,
    status,
    unavailable,
    wait,
    wait_booted,
    wait_trainable,
)
from mixed_helpers import REPO, NativeJoin
from private_net import HUB, NetnsUnavailable, SeparateNets

pytestmark = [pytest.mark.slow]

TURN_PORT = 3478
RELAY_PORTS = (49152, 49999)  # coturn's --min-port, --max-port
CONFIG = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16,
          "microbatch_size": 2, "microbatches": 4, "steps": 3, "lr": 0.003, "seed": 26}
PROBE = """import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
    print("open")
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print(type(exc).__name__)
"""


def relayed(route: dict) -> bool:
    """Whether a selected pair goes through coturn: an end of type relay, at coturn's relay
    address and ports. An end that is the other peer's relay may read prflx (learned from
    its check before its relay candidate was signalled): its address tells."""
    for kind, address in ((route["local"], route["localAddress"]),
                          (route["remote"], route["remoteAddress"])):
        host, _, port = (address or "").rpartition(":")
        on_relay = host == HUB and RELAY_PORTS[0] <= int(port or 0) <= RELAY_PORTS[1]
        if on_relay and kind in ("relay", "prflx"):
            return True
    return False


class Spoke:
    """One spoke of `SeparateNets` as NativeJoin wants a network: popen(argv, **kw)."""

    def __init__(self, nets: SeparateNets, index: int) -> None:
        self.nets, self.index = nets, index

    def popen(self, argv: list[str], **kw: Any) -> subprocess.Popen:
        return self.nets.popen(self.index, argv, **kw)

    def reach(self, host: str, port: int) -> str:
        """"open", "refused" (the host answered) or why nothing answered."""
        done = subprocess.run(self.nets.command(self.index, [sys.executable, "-c", PROBE, host,
                                                             str(port)]),
                              capture_output=True, text=True, timeout=30)
        return done.stdout.strip()


@pytest.fixture(scope="module")
def nets() -> Iterator[SeparateNets]:
    reason = missing_browser_parts()
    if reason:
        unavailable(reason)
    if shutil.which("turnserver") is None:
        unavailable("coturn is not installed (apt-get install coturn)")
    separate = SeparateNets(3)
    try:
        separate.__enter__()
    except NetnsUnavailable as exc:
        unavailable(f"no private network namespaces: {exc}")
    try:
        yield separate
    finally:
        separate.close()


@pytest.fixture(scope="module")
def server_url(nets: SeparateNets, tmp_path_factory: pytest.TempPathFactory) -> str:
    """coturn and the server in the hub, with one shared secret."""
    folder = tmp_path_factory.mktemp("turn")
    secret = secrets.token_hex(16)
    turn = nets.popen(None, [
        "turnserver", "-n", f"--listening-ip={HUB}", f"--relay-ip={HUB}",
        f"--listening-port={TURN_PORT}", "--use-auth-secret", f"--static-auth-secret={secret}",
        "--realm=daisychain.test", "--fingerprint", "--no-cli", "--no-tls", "--no-dtls",
        f"--min-port={RELAY_PORTS[0]}", f"--max-port={RELAY_PORTS[1]}",
        f"--log-file={folder / 'turn.log'}", "--simple-log", f"--pidfile={folder / 'turn.pid'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    until = time.monotonic() + 30
    while Spoke(nets, 0).reach(HUB, TURN_PORT) != "open":
        assert turn.poll() is None and time.monotonic() < until, "coturn did not start"
        time.sleep(0.2)
    server = nets.popen(None, [
        sys.executable, "-m", "server", "--host", HUB, "--port", "0",
        "--data-dir", str(folder), "--log-level", "WARNING",
        "--ice-server", f"turn:{HUB}:{TURN_PORT}?transport=udp"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "DAISYCHAIN_TURN_SECRET": secret})
    return _url(server)


@pytest.fixture(scope="module")
def plain_server_url(nets: SeparateNets, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A server in the hub with no ICE servers: peers offer host candidates only."""
    server = nets.popen(None, [
        sys.executable, "-m", "server", "--host", HUB, "--port", "0",
        "--data-dir", str(tmp_path_factory.mktemp("plain")), "--log-level", "WARNING"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return _url(server)


def _url(server: subprocess.Popen) -> str:
    line = server.stdout.readline()
    found = re.search(r"http://[\d.]+:(\d+)/", line)
    assert found, f"the server did not start: {line}"
    return f"http://{HUB}:{found.group(1)}"


@pytest.fixture(scope="module")
def browsers(nets: SeparateNets, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    """One Chromium in spoke 0 and one in spoke 1, default WebRTC settings."""
    from playwright.sync_api import sync_playwright

    folder = tmp_path_factory.mktemp("bin")
    with sync_playwright() as pw:
        launched = [pw.chromium.launch(
            executable_path=str(nets.wrapper(i, folder / f"chromium{i}", shutil.which("chromium"))),
            args=CHROMIUM_FLAGS) for i in (0, 1)]
        yield launched
        for browser in launched:
            browser.close()


def test_two_tabs_and_a_native_peer_on_separate_networks_train_through_turn(
    nets, server_url, browsers, native_reference, tmp_path, request
):
    native_net = Spoke(nets, 2)
    assert native_net.reach(HUB, int(server_url.rsplit(":", 1)[1])) == "open"
    for other in nets.address[:2]:
        assert native_net.reach(other, 9) != "refused", "the spokes must not reach each other"
    tabs = [Tabs(browser, server_url, f"{request.node.name}-{i}")
            for i, browser in enumerate(browsers)]
    try:
        host = tabs[0].open("?create=1")
        code = status(host)["room"]
        tab = tabs[1].open(f"?room={code}")
        native = NativeJoin(native_net, server_url, tmp_path, "native", "--room", code)
        ids = [status(tab)["peerId"], native.peer_id]
        approve_ids(host, *ids)
        wait_booted(host, tab)
        wait_trainable(host, ids)
        wait(tab, "(s, id) => s.peers.some(p => p.id === id && p.trainable)", 60_000, ids[1])
        for page in (host, tab):
            routes = page.evaluate("() => daisychain.routes()")
            assert len(routes) == 2, routes
            for route in routes:
                assert route["state"] == "connected", routes
                assert relayed(route), routes
        host_id = status(host)["peerId"]
        for peer_id in (host_id, ids[0]):
            found = native.wait_for(rf"link to peer {peer_id} open: (\w+) -> (\w+) "
                                    r"candidates \((\S+) -> (\S+)\)")
            local, remote, local_address, remote_address = found.groups()
            assert relayed({"local": local, "remote": remote, "localAddress": local_address,
                            "remoteAddress": remote_address}), native.messages()
        everyone = [host_id, *ids]
        wait(host, "(s, ids) => ids.every(a => ids.every(b => a === b || s.links.some(l => "
             "l.a === a && l.b === b && l.rtt_ms > 0 && l.mbps > 0)))", 30_000, everyone)
        matrix = status(host)["links"]
        # the page's Links table says what the candidate types mean, as join does
        through = sum("relay" in (row["local"], row["remote"]) for row in matrix)
        assert through, matrix
        host.wait_for_function(
            "n => [...document.querySelectorAll('#links td.route')].filter(td => "
            "td.textContent.endsWith(', relayed by the TURN server')).length >= n", arg=through,
            timeout=30_000)
        host.evaluate("(c) => daisychain.start(c)", CONFIG)
        assert native.finish(240) == 0, native.messages()
        for page in (host, tab):
            wait(page, "s => ['done', 'failed'].includes(s.state)", 60_000)
        expected = {row["step"]: row["hash"] for row in native_reference(CONFIG)}
        assert native.hashes() == expected
        printed = native.wait_for(r"connectivity: \d+ link\(s\)[^\n]*((\n[^\n]*  \S+ -> "
                                  r"\S+: [^\n]*)+)").group(1)
        for page in (host, tab):
            assert {h["step"]: h["hash"] for h in status(page)["history"]} == expected
        for a in everyone:
            for b in everyone:
                if a != b:
                    (row,) = [r for r in matrix if r["a"] == a and r["b"] == b]
                    assert row["state"] == "connected" and relayed(row), row
        for b in ids[:1] + [host_id]:
            assert re.search(rf"{ids[1]} -> {b}: connected, \w+ -> \w+(, relayed by the TURN "
                             r"server)?, RTT [\d.]+ ms, [\d.]+ MB/s", printed), printed
    except BaseException:
        for opened in tabs:
            print("\n".join(opened.console[-100:]))
        raise
    finally:
        if "native" in locals():
            native.kill()
        for opened in tabs:
            opened.close()



def test_without_turn_a_pair_that_cannot_connect_is_named_on_both_sides(
    nets, plain_server_url, browsers, tmp_path, request
):
    """No TURN server: the tab and the native peer each name the other and what to do."""
    tabs = Tabs(browsers[0], plain_server_url, request.node.name)
    native = None
    try:
        host = tabs.open("?create=1")
        host_id, code = status(host)["peerId"], status(host)["room"]
        native = NativeJoin(Spoke(nets, 2), plain_server_url, tmp_path, "native", "--room", code)
        native_id = native.peer_id
        approve_ids(host, native_id)
        said = native.wait_for(rf"no connection to peer {host_id}: .*", 120).group(0)
        wait(host, "(s, id) => id in s.linkProblems", 120_000, native_id)
        shown = host.inner_text("#link-problems")
        row = host.inner_text(f"#peers tr:has-text('{native_id}')")
        tabs.shot(host, "no-connection")
    except BaseException:
        print("\n".join(tabs.console[-100:]))
        raise
    finally:
        if native is not None:
            native.kill()
        tabs.close()
    advice = ("no ICE candidate pair works between the two networks. On one LAN allow UDP "
              "between the machines (and multicast DNS for tabs); across networks the server "
              "needs a TURN server (--ice-server); or put both on one VPN. See "
              "docs/NETWORKS.md.")
    assert said == f"no connection to peer {host_id}: {advice}"
    assert shown == f"no connection to peer {native_id}: {advice}"
    assert "no connection" in row, row
