"""Property-based fuzz of the live signaling protocol.

Three fuzz-controlled peers (a host and two joiners of one private room) send thousands
of generated frame sequences: valid frames aimed at any known peer id, malformed JSON,
wrong types, oversize and binary frames, floods. Meanwhile a bystander room (host and
approved member on other addresses) must keep relaying, must never hear a fuzz peer, and
a fuzz peer must never receive a relayed frame or roster while it is pending.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import websocket
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_testkit import LiveServer, Peer, examples

from server import ServerConfig, create_app
from server.protocol import CLIENT_SCHEMAS

XFF = "X-Forwarded-For"
RELAYED = {"offer", "answer", "ice", "status", "roster"}
TARGETS = 7  # fuzz host, 2 joiners, 2 bystanders, 2 ids that exist nowhere


class Target(int):
    """Placeholder for 'the id of known peer number n', resolved when the frame is sent."""


class FuzzPeer:
    """A fuzz-controlled peer that reconnects after being closed and tracks its state."""

    def __init__(self, server: LiveServer, address: str, is_host: bool) -> None:
        self.server, self.address, self.is_host = server, address, is_host
        self.peer: Peer | None = None
        self.id = "unset"
        self.token: str | None = None
        self.room: str | None = None
        self.approved = False

    def ensure(self, code: str | None) -> None:
        if self.peer is not None:
            return
        self.peer = Peer(self.server.ws_url, self.address)
        if self.is_host and self.token is None:
            self.peer.send("create")
        else:
            fields = {"room": self.room if self.is_host else code, "token": self.token}
            self.peer.send("join", **{k: v for k, v in fields.items() if v is not None})
        self.observe([self.peer.recv()])

    def observe(self, frames: list[dict[str, Any]]) -> None:
        for frame in frames:
            kind = frame["type"]
            if kind == "joined":
                self.id, self.token, self.room = frame["peer"], frame["token"], frame["room"]
                self.approved = frame["state"] == "approved"
            elif kind == "approved":
                self.approved = True
            elif kind in ("removed", "denied"):
                self.approved, self.token = False, None
            assert kind not in RELAYED or self.approved, f"pending peer got {frame}"

    def send_all(self, items: list[str | bytes]) -> None:
        try:
            for item in items:
                self.peer.send_raw(item)
            self.observe(self.peer.sync())
        except (OSError, websocket.WebSocketException, ValueError):
            self.drop()

    def drop(self) -> None:
        if self.peer is not None:
            self.peer.close()
        self.peer = None


@pytest.fixture(scope="module")
def arena(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("fuzz-state")
    cfg = ServerConfig(data_dir=state, trust_proxy_header=XFF, rate_per_s=5000,
                       rate_burst=5000, bytes_per_s=1e8, max_strikes=40,
                       max_frame_bytes=8192, hard_frame_bytes=32768)
    server = LiveServer(create_app(cfg))
    host, member = Peer(server.ws_url, "10.9.0.1"), Peer(server.ws_url, "10.9.0.2")
    code = host.create()
    member.join(room=code)
    host.sync()
    host.send("approve", peer=member.id)
    host.sync()
    member.sync()
    fuzzers = [FuzzPeer(server, "10.8.0.1", True), FuzzPeer(server, "10.8.0.2", False),
               FuzzPeer(server, "10.8.0.3", False)]
    yield {"server": server, "bystanders": (host, member), "fuzzers": fuzzers, "rounds": [0]}
    for peer in (host, member):
        peer.close()
    for fuzzer in fuzzers:
        fuzzer.drop()
    server.stop()


_ids = st.integers(0, TARGETS - 1).map(Target)
_values = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=False),
    st.text(max_size=60), _ids, st.just("x" * 9000), st.lists(st.integers(), max_size=2),
)


@st.composite
def valid_frame(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(CLIENT_SCHEMAS)))
    fields: dict[str, Any] = {}
    for name, spec in CLIENT_SCHEMAS[kind].items():
        if not spec.required and draw(st.booleans()):
            continue
        if spec.kind == "id":
            fields[name] = draw(_ids)
        elif spec.kind == "code":
            fields[name] = draw(st.sampled_from(["A" * 22, "room-code-of-the-fuzz"]))
        elif spec.kind == "str":
            fields[name] = draw(st.text(max_size=min(spec.max_len, 80)))
        elif spec.kind == "int":
            fields[name] = draw(st.integers(int(spec.lo), int(min(spec.hi, 2**53))))
        else:
            fields[name] = draw(st.floats(spec.lo, spec.hi, allow_nan=False))
    return {"v": 1, "type": kind, **fields}


@st.composite
def mutated_frame(draw: st.DrawFn) -> dict[str, Any]:
    frame = draw(valid_frame())
    key = draw(st.sampled_from([*frame, "extra", "v", "type"]))
    frame[key] = draw(_values)
    return frame


_junk = st.one_of(
    st.text(max_size=200),
    st.binary(min_size=1, max_size=100),
    st.just("{" * 5000),
    st.just("[" * 20000 + "]" * 20000),
    st.just('{"v": 1, "type": "offer", "to": "a", "sdp": NaN}'),
    st.just('{"v": 1, "type": "status", "loss": Infinity}'),
    st.just("x" * 10000),  # above max_frame_bytes, below the hard cap
)

action = st.one_of(
    st.tuples(st.just("frame"), valid_frame()),
    st.tuples(st.just("frame"), mutated_frame()),
    st.tuples(st.just("raw"), _junk),
    st.tuples(st.just("flood"), st.integers(20, 80)),
)


def render(value: Any, ids: list[str]) -> Any:
    if isinstance(value, Target):
        return ids[int(value)]
    if isinstance(value, dict):
        return {k: render(v, ids) for k, v in value.items()}
    return value


@pytest.mark.slow
@settings(max_examples=examples(2000), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(0, 2), action), min_size=1, max_size=4))
def test_fuzzed_signaling_never_breaks_the_server_or_other_rooms(arena, script) -> None:
    host, member = arena["bystanders"]
    fuzzers: list[FuzzPeer] = arena["fuzzers"]
    fuzzers[0].ensure(None)
    code = fuzzers[0].room
    for fuzzer in fuzzers[1:]:
        fuzzer.ensure(code)
    ids = [f.id for f in fuzzers] + [host.id, member.id, "nobody000001", "nobody000002"]
    for actor, (kind, payload) in script:
        fuzzer = fuzzers[actor]
        if fuzzer.peer is None:
            fuzzer.ensure(code)
        if kind == "frame":
            items: list[str | bytes] = [json.dumps(render(payload, ids))]
        elif kind == "raw":
            items = [payload]
        else:
            items = [json.dumps({"v": 1, "type": "ping"})] * payload
        fuzzer.send_all(items)
    _check_bystanders(host, member, arena["rounds"])


def _check_bystanders(host: Peer, member: Peer, rounds: list[int]) -> None:
    rounds[0] += 1
    sdp = f"bystander round {rounds[0]}"
    host.send("offer", to=member.id, sdp=sdp)
    for frame in host.sync():
        assert frame.get("from") in (None, member.id), frame
    frames = member.sync()
    assert [f for f in frames if f["type"] == "offer"][-1]["sdp"] == sdp
    for frame in frames:
        assert frame.get("from") in (None, host.id), frame
        if frame["type"] == "roster":
            assert {p["id"] for p in frame["peers"]} == {host.id, member.id}
