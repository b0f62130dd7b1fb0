"""Signaling over real sockets: a threaded server on a loopback port and websocket clients.

Absence of a frame is proven without sleeping: ``Peer.sync()`` pings and collects what
arrives before the pong, and the acting peer syncs first, so anything the server would
have relayed is already queued ahead of that pong.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

XFF = "X-Forwarded-For"
RELAYED = {"offer", "answer", "ice", "roster", "status"}


@pytest.fixture
def server(live):
    return live(trust_proxy_header=XFF)


def test_same_address_auto_groups_and_relays(server, peers) -> None:
    a = peers(server.ws_url, "198.51.100.7")
    b = peers(server.ws_url, "198.51.100.7")
    far = peers(server.ws_url, "203.0.113.50")
    assert a.join()["state"] == "approved"
    b.join()
    far.join()
    roster = a.sync()[-1]
    assert {p["id"] for p in roster["peers"]} == {a.id, b.id}
    a.send("offer", to=b.id, sdp="v=0 offer")
    a.sync()
    got = [f for f in b.sync() if f["type"] == "offer"]
    assert got == [{"v": 1, "type": "offer", "from": a.id, "sdp": "v=0 offer"}]
    b.send("ice", to=a.id, candidate="candidate:1", sdpMid="0", sdpMLineIndex=0)
    b.send("status", step=4, loss=2.25, hash="ab12", capacity=2)
    b.sync()
    types = [f["type"] for f in a.sync()]
    assert "ice" in types and "status" in types
    # Another address is another room: an offer across is refused, nothing arrives.
    far.send("offer", to=a.id, sdp="x")
    assert far.sync()[-1]["code"] == "no_peer"
    assert not [f for f in a.sync() if f["type"] in RELAYED]


def test_unapproved_peer_receives_nothing_and_sends_nothing(server, peers) -> None:
    host, member, guest = (peers(server.ws_url, f"10.0.0.{i}") for i in (1, 2, 3))
    code = host.create()
    member.join(room=code)
    host.sync()
    host.send("approve", peer=member.id)
    host.sync()
    member.sync()
    assert guest.join(room=code) == {**guest_joined(guest, code)}
    # The host hears of the pending guest; nobody else does, and the guest hears nothing.
    assert [p["state"] for p in host.sync()[-1]["peers"]] == ["approved", "approved", "pending"]
    assert guest.id not in json.dumps(member.sync())
    for sender in (host, member):
        sender.send("offer", to=guest.id, sdp="v=0")
        sender.send("ice", to=guest.id, candidate="c")
        sender.send("status", step=1)
        assert [f.get("code") for f in sender.sync() if f["type"] == "error"] == ["no_peer"] * 2
    for kind, fields in (("offer", {"to": host.id, "sdp": "v=0"}),
                         ("answer", {"to": member.id, "sdp": "v=0"}),
                         ("ice", {"to": host.id, "candidate": "c"}),
                         ("status", {"step": 9}),
                         ("approve", {"peer": guest.id}),
                         ("remove", {"peer": member.id})):
        guest.send(kind, **fields)
        assert guest.sync() == [error(kind, "pending")]
    assert guest.sync() == []
    assert not [f for f in host.sync() + member.sync() if f.get("from") == guest.id]
    host.send("approve", peer=guest.id)
    host.sync()
    assert [f["type"] for f in guest.sync()] == ["approved", "roster"]
    host.send("offer", to=guest.id, sdp="now")
    host.sync()
    assert guest.sync()[-1] == {"v": 1, "type": "offer", "from": host.id, "sdp": "now"}


def guest_joined(guest, code: str) -> dict:
    return {"v": 1, "type": "joined", "peer": guest.id, "room": code, "private": True,
            "role": "member", "state": "pending", "token": guest.token}


def error(kind: str, code: str) -> dict:
    return {"v": 1, "type": "error", "code": code, "message": "wait for the host's approval",
            "ref": kind}


def test_removed_peer_is_cut_off(server, peers) -> None:
    host, member, other = (peers(server.ws_url, f"10.0.1.{i}") for i in (1, 2, 3))
    code = host.create()
    for peer in (member, other):
        peer.join(room=code)
        host.sync()
        host.send("approve", peer=peer.id)
    host.sync()
    host.send("remove", peer=member.id)
    host.sync()
    assert member.is_closed()
    roster = [f for f in other.sync() if f["type"] == "roster"][-1]
    assert member.id not in {p["id"] for p in roster["peers"]}
    host.send("offer", to=member.id, sdp="x")
    assert host.sync()[-1]["code"] == "no_peer"
    # Its resume token is revoked; a fresh join is merely pending again.
    back = peers(server.ws_url, "10.0.1.2")
    back.send("join", room=code, token=member.token)
    assert back.expect("removed")["type"] == "removed"
    assert back.is_closed()
    fresh = peers(server.ws_url, "10.0.1.2")
    assert fresh.join(room=code)["state"] == "pending" and fresh.id != member.id


def test_denied_peer_is_closed(server, peers) -> None:
    host, guest = peers(server.ws_url, "10.0.2.1"), peers(server.ws_url, "10.0.2.2")
    code = host.create()
    guest.join(room=code)
    host.sync()
    host.send("deny", peer=guest.id)
    host.sync()
    assert guest.expect("denied")
    assert guest.is_closed()


def test_room_codes_cannot_be_enumerated(server, peers) -> None:
    host = peers(server.ws_url, "10.0.3.1")
    code = host.create()
    assert len(code) == 22  # 110 bits (server/rooms.py)
    real, fake = peers(server.ws_url, "10.0.3.2"), peers(server.ws_url, "10.0.3.3")
    unknown = secrets.token_urlsafe(16)
    answers = [real.join(room=code), fake.join(room=unknown)]
    shapes = [{k: v for k, v in a.items() if k not in ("peer", "token", "room")} for a in answers]
    assert shapes[0] == shapes[1]
    assert real.sync() == [] and fake.sync() == []
    # A pending joiner cannot learn anything by probing either.
    for probe in (real, fake):
        probe.send("offer", to=host.id, sdp="x")
        assert probe.sync()[-1]["code"] == "pending"
    # Malformed codes are refused on format alone, before any lookup.
    bad = peers(server.ws_url, "10.0.3.4")
    bad.send("join", room=code[:-1])
    assert bad.sync()[-1]["code"] == "bad_room"


def test_create_codes_are_distinct_and_unguessable(server, peers) -> None:
    codes = set()
    for i in range(20):
        host = peers(server.ws_url, f"10.0.4.{i}")
        codes.add(host.create())
        host.close()
    assert len(codes) == 20
    # never a leading "-" (`join --room -abc` would read it as a flag): the alphabet has none
    assert all(len(c) == 22 and c.isascii() and not c.startswith("-") for c in codes)


def test_reconnect_with_token_keeps_id_and_approval(server, peers) -> None:
    host, guest = peers(server.ws_url, "10.0.5.1"), peers(server.ws_url, "10.0.5.2")
    code = host.create()
    guest.join(room=code)
    host.sync()
    host.send("approve", peer=guest.id)
    host.sync()
    guest.close()
    again = peers(server.ws_url, "10.0.5.2")
    joined = again.join(room=code, token=guest.token)
    assert (joined["peer"], joined["state"]) == (guest.id, "approved")
    host.send("offer", to=guest.id, sdp="back")
    host.sync()
    assert [f for f in again.sync() if f["type"] == "offer"][0]["sdp"] == "back"


def test_server_restart_keeps_identities(live, peers, make_config, tmp_path: Path) -> None:
    cfg = make_config(trust_proxy_header=XFF)
    first = live(cfg)
    host, member = peers(first.ws_url, "10.0.6.1"), peers(first.ws_url, "10.0.6.2")
    auto = peers(first.ws_url, "10.0.6.3")
    code = host.create()
    member.join(room=code)
    host.sync()
    host.send("approve", peer=member.id)
    host.sync()
    auto.join()
    first.stop()  # all in-memory state is gone; the signing key is in data_dir
    second = live(cfg)
    new_member = peers(second.ws_url, "10.0.6.2")
    assert new_member.join(room=code, token=member.token)["state"] == "pending"
    new_host = peers(second.ws_url, "10.0.6.1")
    joined = new_host.join(room=code, token=host.token)
    assert (joined["peer"], joined["role"], joined["state"]) == (host.id, "host", "approved")
    entry = next(p for p in new_host.sync()[-1]["peers"] if p["id"] == member.id)
    assert entry == {"id": member.id, "role": "member", "state": "pending", "resumed": True}
    new_host.send("approve", peer=member.id)
    new_host.send("offer", to=member.id, sdp="mesh still up")
    new_host.sync()
    assert new_member.sync()[-1]["sdp"] == "mesh still up"
    new_auto = peers(second.ws_url, "10.0.6.3")
    assert new_auto.join(token=auto.token)["peer"] == auto.id


def test_frame_size_caps(live, peers) -> None:
    server = live(max_frame_bytes=4096, hard_frame_bytes=16384)
    a, b = peers(server.ws_url), peers(server.ws_url)
    a.join()
    b.join()
    a.send("offer", to=b.id, sdp="x" * 5000)
    assert a.sync()[-1]["code"] == "too_large"
    a.send("offer", to=b.id, sdp="fits")
    a.sync()
    assert b.sync()[-1]["sdp"] == "fits"
    a.send("offer", to=b.id, sdp="x" * 20000)
    assert a.is_closed()
    assert not [f for f in b.sync() if f["type"] == "offer"]


def test_flood_is_limited_then_closed_without_disturbing_others(live, peers) -> None:
    server = live(trust_proxy_header=XFF, rate_per_s=20, rate_burst=30, max_strikes=10)
    host, member = peers(server.ws_url, "10.0.7.1"), peers(server.ws_url, "10.0.7.2")
    code = host.create()
    member.join(room=code)
    host.sync()
    host.send("approve", peer=member.id)
    host.sync()
    flooder = peers(server.ws_url, "10.0.7.3")
    flooder.join()
    for _ in range(200):
        try:
            flooder.send("ping", t=0)
        except OSError:
            break
    codes = []
    try:
        while True:
            msg = flooder.recv()
            if msg["type"] == "error":
                codes.append(msg["code"])
    except Exception:
        pass
    assert "rate_limited" in codes and codes[-1] == "abuse"
    assert flooder.is_closed()
    host.send("offer", to=member.id, sdp="still fine")
    host.sync()
    assert member.sync()[-1]["sdp"] == "still fine"


def test_unjoined_and_rejoin_rules(server, peers) -> None:
    peer = peers(server.ws_url)
    peer.send("offer", to="abc", sdp="x")
    peer.send("leave")
    assert [f["code"] for f in peer.sync()] == ["not_joined", "not_joined"]
    peer.join()
    peer.send("join")
    peer.send("create")
    assert [f["code"] for f in peer.sync() if f["type"] == "error"] == ["already_joined"] * 2
    peer.send("leave")
    assert peer.expect("left")["peer"] == peer.id
    assert peer.is_closed()


def test_a_lagging_peer_is_cut_off_instead_of_stalling_senders() -> None:
    from server.config import ServerConfig
    from server.signaling import Connection, SignalingState

    class FakeSocket:
        down = False

        def setsockopt(self, *args) -> None:
            pass

        def shutdown(self, how: int) -> None:
            self.down = True

    class NeverWritten:  # nothing drains the queue, like a peer that stopped reading
        sock = FakeSocket()

    def connection(**limits) -> tuple[Connection, NeverWritten]:
        ws = NeverWritten()
        ws.sock = FakeSocket()
        state = SignalingState(ServerConfig(**limits), rooms=None, sockets=None)
        return Connection(ws, state, "group"), ws

    conn, ws = connection(send_queue=8)
    for _ in range(8):
        conn.deliver("frame")
    assert not ws.sock.down
    conn.deliver("one too many")  # returns at once instead of blocking the sender
    assert ws.sock.down
    # The queue is bounded in bytes too: two 40 KiB frames fit in 100 KiB, a third does not.
    conn, ws = connection(send_queue_bytes=100 * 1024)
    conn.deliver("x" * 40 * 1024)
    conn.deliver("x" * 40 * 1024)
    assert not ws.sock.down
    conn.deliver("x" * 40 * 1024)
    assert ws.sock.down


def test_a_refused_join_is_in_the_servers_log(live, peers, caplog) -> None:
    """A friend turned away by a full room saw its error; the operator saw nothing."""
    caplog.set_level("INFO", logger="server")
    server = live(trust_proxy_header=XFF, max_room_peers=1)
    host, friend = peers(server.ws_url, "10.0.0.1"), peers(server.ws_url, "10.0.0.2")
    code = host.create()
    friend.send("join", room=code)
    assert friend.expect("error")["code"] == "room_full"
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("server")]
    assert f"a peer from 10.0.0.2 could not join room {code[:4]}…: the room has no free " \
        "place (room_full)" in lines, lines
