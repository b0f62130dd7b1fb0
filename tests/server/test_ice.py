"""ICE servers from the server: coturn REST credentials for approved peers only, never logged.

A real server on a loopback port and real websocket peers; the credentials are checked the
way coturn checks them (HMAC-SHA1 of the username with the shared secret).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
from typing import Any

import pytest

from server.__main__ import config_from_args, parse_args
from server.config import ServerConfig, ServerConfigError

STUN = "stun:stun.example.net:3478"
TURNS = ("turn:turn.example.net:3478?transport=udp", "turns:turn.example.net:5349")
TTL_S = 600


@pytest.fixture
def secret() -> str:
    return secrets.token_urlsafe(24)


@pytest.fixture
def server(live, secret):
    return live(ice_servers=(STUN, *TURNS), turn_secret=secret, turn_ttl_s=TTL_S)


def check_rtc_config(config: dict[str, Any], peer_id: str, secret: str) -> str:
    """Assert coturn's REST format for ``peer_id``; returns the credential."""
    stun, turn = config["iceServers"]
    assert stun == {"urls": [STUN]}
    assert turn["urls"] == list(TURNS)
    expiry, _, who = turn["username"].partition(":")
    assert who == peer_id
    assert abs(int(expiry) - (time.time() + TTL_S)) < 30
    mac = hmac.new(secret.encode(), turn["username"].encode(), hashlib.sha1).digest()
    assert turn["credential"] == base64.b64encode(mac).decode()
    assert config["iceTransportPolicy"] == "all"
    return turn["credential"]


def test_approved_peers_get_coturn_credentials_pending_ones_nothing(
        server, peers, secret, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    host, guest = peers(server.ws_url, "10.0.0.1"), peers(server.ws_url, "10.0.0.2")
    host.send("create")
    made = host.expect("joined")
    host.id, code = made["peer"], made["room"]
    credentials = [check_rtc_config(made["rtcConfig"], host.id, secret)]
    pending = guest.join(room=code)
    assert pending["state"] == "pending" and "rtcConfig" not in pending
    seen_pending = pending, *guest.sync()
    assert "rtcConfig" not in json.dumps(seen_pending)
    assert not [f for f in host.sync() if "rtcConfig" in f]  # the roster carries none
    host.send("approve", peer=guest.id)
    host.sync()
    approved = guest.sync()[0]
    assert approved["type"] == "approved"
    credentials.append(check_rtc_config(approved["rtcConfig"], guest.id, secret))
    # A token resume (a dropped socket, a server restart) brings a fresh credential.
    guest.close()
    again = peers(server.ws_url, "10.0.0.2")
    resumed = again.join(room=code, token=guest.token)
    assert resumed["state"] == "approved" and resumed["peer"] == guest.id
    credentials.append(check_rtc_config(resumed["rtcConfig"], guest.id, secret))
    assert len(set(credentials[:2])) == 2  # per peer
    assert caplog.records  # the server did log (requests, sockets): none of it leaks
    for record in caplog.records:
        text = record.getMessage() + repr(record.args)
        assert secret not in text
        assert not [c for c in credentials if c in text]


def test_auto_rooms_and_the_relay_only_switch(live, peers, secret) -> None:
    server = live(ice_servers=TURNS[:1], turn_secret=secret, ice_relay_only=True,
                  trust_proxy_header="X-Forwarded-For")
    peer = peers(server.ws_url, "198.51.100.9")
    joined = peer.join()
    config = joined["rtcConfig"]
    assert config["iceTransportPolicy"] == "relay"
    (turn,) = config["iceServers"]
    assert turn["username"].endswith(":" + peer.id)


def test_without_ice_servers_frames_are_unchanged(live, peers) -> None:
    host = peers(live().ws_url, "10.0.0.1")
    host.send("create")
    assert "rtcConfig" not in host.expect("joined")


def test_ice_settings_are_checked_and_the_secret_never_shown(make_config, monkeypatch):
    with pytest.raises(ServerConfigError, match="turn_secret"):
        make_config(ice_servers=TURNS)
    with pytest.raises(ServerConfigError, match="stun:, stuns:, turn: or turns:"):
        make_config(ice_servers=("http://turn.example.net",))
    with pytest.raises(ServerConfigError, match="needs a turn: ICE server"):
        make_config(ice_servers=(STUN,), ice_relay_only=True)
    with pytest.raises(ServerConfigError, match="turn_ttl_s"):
        make_config(ice_servers=(STUN,), turn_ttl_s=0)
    monkeypatch.setenv("DAISYCHAIN_TURN_SECRET", "from-the-environment")
    cfg = make_config(ice_servers=TURNS)
    assert cfg.turn_secret == "from-the-environment"
    assert "from-the-environment" not in json.dumps(cfg.to_dict())
    assert cfg.to_dict()["turn_secret"] == "<set>"


def test_cli_flags(monkeypatch):
    monkeypatch.delenv("DAISYCHAIN_TURN_SECRET", raising=False)
    args = parse_args(["--ice-server", STUN, "--ice-server", TURNS[0], "--turn-secret", "s",
                       "--turn-ttl", "120", "--ice-relay-only"])
    cfg = ServerConfig.from_dict(config_from_args(args))
    assert cfg.ice_servers == (STUN, TURNS[0])
    assert (cfg.turn_secret, cfg.turn_ttl_s, cfg.ice_relay_only) == ("s", 120, True)
    plain = ServerConfig.from_dict(config_from_args(parse_args([])))
    assert (plain.ice_servers, plain.turn_secret, plain.ice_relay_only) == ((), None, False)


def test_the_served_processs_debug_log_holds_neither_secret_nor_credential(tmp_path, secret):
    from attack_kit import ServerProcess
    from server_testkit import Peer

    server = ServerProcess(tmp_path, {"ice_servers": [STUN, *TURNS], "turn_secret": secret,
                                      "turn_ttl_s": TTL_S}, extra_args=("--log-level", "DEBUG"))
    opened: list[Peer] = []
    try:
        url = f"ws://127.0.0.1:{server.port}/ws"
        host, guest = Peer(url), Peer(url)
        opened += [host, guest]
        host.send("create")
        made = host.expect("joined")
        credentials = [check_rtc_config(made["rtcConfig"], made["peer"], secret)]
        guest.join(room=made["room"])
        host.sync()
        host.send("approve", peer=guest.id)
        host.sync()
        credentials.append(check_rtc_config(guest.sync()[0]["rtcConfig"], guest.id, secret))
        host.close()
        guest.close()
    finally:
        for peer in opened:
            peer.close()
        server.stop()
    log = server.log()
    assert "serving with gevent" in log, "the log is the served process's"
    assert secret not in log
    assert not [c for c in credentials if c in log]
