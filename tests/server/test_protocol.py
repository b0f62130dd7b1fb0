"""The frame validator, directly: every schema entry accepted, everything else refused."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_testkit import examples

from server.protocol import CLIENT_SCHEMAS, ProtocolError, parse_frame

CODE = "A" * 22
GOOD = {
    "join": {"room": CODE, "token": "v1.x.y", "fresh": True},
    "create": {},
    "approve": {"peer": "abc_DEF-123"},
    "deny": {"peer": "p1"},
    "remove": {"peer": "p1"},
    "offer": {"to": "p1", "sdp": "v=0\r\n"},
    "answer": {"to": "p1", "sdp": "v=0\r\n"},
    "ice": {"to": "p1", "candidate": "candidate:1 1 udp 1 1.2.3.4 5 typ host",
            "sdpMid": "0", "sdpMLineIndex": 0, "usernameFragment": None},
    "status": {"step": 12, "loss": 2.5, "hash": "ab" * 32, "probe": "cd" * 32, "capacity": 3},
    "leave": {},
    "ping": {"t": 1.5},
}


def frame(kind: str, **fields: object) -> str:
    return json.dumps({"v": 1, "type": kind, **fields})


def refused(raw: str | bytes, max_bytes: int = 65536) -> str:
    with pytest.raises(ProtocolError) as info:
        parse_frame(raw, max_bytes)
    return info.value.code


def test_every_type_has_a_good_example_and_it_passes() -> None:
    assert set(GOOD) == set(CLIENT_SCHEMAS)
    for kind, fields in GOOD.items():
        assert parse_frame(frame(kind, **fields), 65536)["type"] == kind


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("not json", "bad_json"),
        ("[1, 2]", "bad_frame"),
        ('"join"', "bad_frame"),
        ('{"type": "join"}', "bad_version"),
        ('{"v": 2, "type": "join"}', "bad_version"),
        ('{"v": true, "type": "join"}', "bad_version"),
        ('{"v": 1.0, "type": "join"}', "bad_version"),
        ('{"v": 1, "type": "shout"}', "unknown_type"),
        ('{"v": 1, "type": 5}', "unknown_type"),
        ('{"v": 1, "type": "join", "admin": true}', "unknown_field"),
        # a token goes with join (a resume); create has nothing to resume
        ('{"v": 1, "type": "create", "token": "t"}', "unknown_field"),
        ('{"v": 1, "type": "offer", "to": "p1"}', "missing_field"),
        ('{"v": 1, "type": "offer", "to": 5, "sdp": ""}', "bad_field"),
        ('{"v": 1, "type": "offer", "to": "../etc", "sdp": ""}', "bad_field"),
        ('{"v": 1, "type": "offer", "to": null, "sdp": ""}', "bad_field"),
        ('{"v": 1, "type": "join", "room": "short"}', "bad_room"),
        ('{"v": 1, "type": "join", "fresh": 1}', "bad_field"),
        ('{"v": 1, "type": "join", "fresh": "true"}', "bad_field"),
        ('{"v": 1, "type": "status", "step": true}', "bad_field"),
        ('{"v": 1, "type": "status", "step": 1.5}', "bad_field"),
        ('{"v": 1, "type": "status", "step": -1}', "bad_field"),
        ('{"v": 1, "type": "status", "loss": NaN}', "bad_json"),
        ('{"v": 1, "type": "status", "loss": Infinity}', "bad_json"),
        ('{"v": 1, "type": "status", "capacity": "fast"}', "bad_field"),
        ('{"v": 1, "type": "status", "loss": 1e300}', "bad_field"),
        ('{"v": 1, "type": "status", "loss": 1e999}', "bad_field"),  # parses as inf
        # Integers too large for a float: refused by their bounds, never float(value).
        ('{"v": 1, "type": "ping", "t": 1' + "0" * 400 + '}', "bad_field"),
        ('{"v": 1, "type": "ping", "t": -1' + "0" * 400 + '}', "bad_field"),
        ('{"v": 1, "type": "status", "loss": -9' + "9" * 3000 + '}', "bad_field"),
        ('{"v": 1, "type": "status", "capacity": 9' + "9" * 3000 + '}', "bad_field"),
        ('{"v": 1, "type": "status", "step": 9' + "9" * 3000 + '}', "bad_field"),
        ('{"v": 1, "type": "status", "step": 9' + "9" * 5000 + '}', "bad_json"),  # > 4300
        ('{"v": 1, "type": "ice", "to": "p", "candidate": "", "sdpMLineIndex": 5000}',
         "bad_field"),
    ],
)
def test_malformed_frames_are_refused_with_a_code(raw: str, code: str) -> None:
    assert refused(raw) == code


def test_binary_and_oversize_frames_are_refused() -> None:
    assert refused(b"\x00\x01") == "binary"
    big = frame("offer", to="p1", sdp="x" * 2000)
    assert refused(big, max_bytes=1024) == "too_large"
    # The cap counts UTF-8 bytes: 400 three-byte characters are 1200 bytes, not 400.
    euros = json.dumps({"v": 1, "type": "status", "hash": "€" * 400}, ensure_ascii=False)
    assert len(euros) < 1024
    assert refused(euros, max_bytes=1024) == "too_large"
    assert refused(frame("status", hash="x" * 129)) == "too_large"
    assert refused("[" * 100000 + "]" * 100000, max_bytes=10**6) in ("bad_json", "bad_frame")


@settings(max_examples=examples(400), deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                               max_size=5),
    max_leaves=20,
))
def test_random_json_never_escapes_as_another_exception(value: object) -> None:
    raw = json.dumps(value)
    try:
        msg = parse_frame(raw, 65536)
    except ProtocolError as exc:
        assert exc.code
        return
    schema = CLIENT_SCHEMAS[msg["type"]]
    assert set(msg) <= set(schema) | {"v", "type"}


_FIELD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=80),
    st.sampled_from(["p1", CODE, "x" * 3000]), st.lists(st.integers(), max_size=3),
)


@settings(max_examples=examples(1000), deadline=None)
@given(st.sampled_from(sorted(CLIENT_SCHEMAS)),
       st.dictionaries(st.sampled_from(["to", "sdp", "peer", "room", "token", "step", "loss",
                                        "hash", "probe", "capacity", "candidate", "sdpMid",
                                        "sdpMLineIndex", "t", "extra"]),
                       _FIELD_VALUES, max_size=6))
def test_schema_shaped_frames_pass_only_when_every_field_fits(kind: str, fields: dict) -> None:
    raw = frame(kind, **fields)
    schema = CLIENT_SCHEMAS[kind]
    try:
        msg = parse_frame(raw, 65536)
    except ProtocolError:
        return
    for name, spec in schema.items():
        if spec.required:
            assert name in msg
        value = msg.get(name)
        if value is None:
            continue
        if spec.kind in ("int", "num"):
            assert type(value) is not bool and spec.lo <= value <= spec.hi
            assert math.isfinite(value)
            if spec.kind == "int":
                assert type(value) is int
        else:
            assert isinstance(value, str)
