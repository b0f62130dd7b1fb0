"""state_hash: the documented byte order, and sensitivity to every bit of the state."""

import hashlib
import struct

import numpy as np
import pytest

from pynode.core.optim import AdamState
from pynode.core.statehash import StateHashError, state_hash


def small_state():
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "b": np.ones(3, np.float32)}
    opt = AdamState(m={k: v * np.float32(0.5) for k, v in params.items()},
                    v={k: v * v for k, v in params.items()}, step=3)
    return params, opt


def by_hand(params, opt, step, extra_bytes=b"\0\0\0\0"):
    """The stream docs/CHECKPOINTS.md specifies, built independently of the module."""
    def s(text):
        raw = text.encode()
        return struct.pack("<I", len(raw)) + raw

    def section(arrays):
        out = struct.pack("<I", len(arrays))
        for name in sorted(arrays):
            a = arrays[name]
            out += s(name) + struct.pack("<BI", 1, a.ndim)  # 1 = float32
            out += b"".join(struct.pack("<q", d) for d in a.shape)
            out += a.astype("<f4").tobytes()
        return out

    stream = b"DCSTATE\0" + struct.pack("<Iq", 1, step) + section(params)
    stream += b"\1" + section(opt.m) + section(opt.v) + struct.pack("<q", opt.step)
    return hashlib.sha256(stream + extra_bytes).hexdigest()


def test_matches_the_documented_byte_stream():
    params, opt = small_state()
    assert state_hash(params, opt, 5) == by_hand(params, opt, 5)
    extra = struct.pack("<I", 1) + struct.pack("<I", 6) + b"cursor" + b"I" + struct.pack("<q", 9)
    assert state_hash(params, opt, 5, {"cursor": 9}) == by_hand(params, opt, 5, extra)


def test_independent_of_dict_order_and_memory_layout():
    params, opt = small_state()
    reordered = {"b": params["b"], "w": np.asfortranarray(params["w"])}
    big_endian = {k: v.astype(">f4") for k, v in params.items()}
    h = state_hash(params, opt, 1)
    assert state_hash(reordered, opt, 1) == h
    assert state_hash(big_endian, opt, 1) == h


def test_every_part_of_the_state_counts():
    params, opt = small_state()
    base = state_hash(params, opt, 1, {"cursor": 4})
    flipped = params["w"].copy()
    flipped.view(np.uint32)[1, 2] ^= 1  # one mantissa bit
    variants = [
        state_hash({**params, "w": flipped}, opt, 1, {"cursor": 4}),
        state_hash(params, AdamState(opt.m, opt.v, 4), 1, {"cursor": 4}),
        state_hash(params, AdamState({**opt.m, "b": opt.m["b"] + 1}, opt.v, 3), 1, {"cursor": 4}),
        state_hash(params, AdamState(opt.m, {**opt.v, "b": opt.v["b"] * 2}, 3), 1, {"cursor": 4}),
        state_hash(params, opt, 2, {"cursor": 4}),
        state_hash(params, opt, 1, {"cursor": 5}),
        state_hash(params, opt, 1),
        state_hash(params, None, 1, {"cursor": 4}),
        state_hash({**params, "w": params["w"].reshape(3, 2)}, opt, 1, {"cursor": 4}),
        state_hash({**params, "w": params["w"].view(np.int32)}, opt, 1, {"cursor": 4}),
        state_hash({"ww": params["w"], "b": params["b"]}, opt, 1, {"cursor": 4}),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_negative_zero_and_name_boundaries_are_distinct():
    zero, neg = np.zeros(2, np.float32), np.array([0.0, -0.0], np.float32)
    assert state_hash({"a": zero}) != state_hash({"a": neg})
    x = np.ones(1, np.float32)
    assert state_hash({"ab": x, "c": x}) != state_hash({"a": x, "bc": x})
    assert state_hash({}, extra={"k": "1"}) != state_hash({}, extra={"k": 1})
    assert state_hash({}, extra={"k": 1.0}) != state_hash({}, extra={"k": 1})


def test_extra_value_kinds_hash():
    extra = {"n": None, "t": True, "i": -3, "f": 0.25, "s": "ünïcode", "b": b"\x00\x01",
             "a": np.arange(3, dtype=np.int64)}
    assert len(state_hash({}, None, 0, extra)) == 64


@pytest.mark.parametrize("bad", [
    lambda: state_hash({"c": np.zeros(2, np.complex64)}),
    lambda: state_hash({"x": [1.0, 2.0]}),
    lambda: state_hash({1: np.zeros(2, np.float32)}),
    lambda: state_hash({}, None, 1.5),
    lambda: state_hash({}, None, 2**63),
    lambda: state_hash({}, extra={"f": float("nan")}),
    lambda: state_hash({}, extra={"l": [1, 2]}),
])
def test_unhashable_state_is_refused(bad):
    with pytest.raises(StateHashError):
        bad()
