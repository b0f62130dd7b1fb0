"""Shared checks of every transport: headroom, refusals, wire format, the registry."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from comm_helpers import REPO  # noqa: F401  (puts pynode on sys.path)

from pynode.comm import (
    CollectiveUsageError,
    CommError,
    PeerLost,
    check_headroom,
    make_collective,
)
from pynode.comm.base import check_contribution, check_timeout, refusal_code, refusal_error
from pynode.comm.wire import HEADER, Frame, Kind, decode_header, encode_header
from pynode.core.errors import FixedPointOverflowError, ShapeError


@pytest.mark.parametrize("world", [2, 3, 7, 1000])
def test_headroom_boundary_is_exact(world: int) -> None:
    largest_ok = (2**63 - 1) // world  # world * largest_ok < 2**63
    for sign in (1, -1):
        check_headroom(np.array([0, sign * largest_ok], dtype=np.int64), world)
        with pytest.raises(FixedPointOverflowError):
            check_headroom(np.array([sign * (largest_ok + 1), 0], dtype=np.int64), world)


def test_headroom_counts_the_most_negative_value() -> None:
    with pytest.raises(FixedPointOverflowError):
        check_headroom(np.array([-(2**63)], dtype=np.int64), 1)
    check_headroom(np.array([2**63 - 1], dtype=np.int64), 1)
    check_headroom(np.zeros(0, dtype=np.int64), 1000)


def test_headroom_is_what_keeps_int64_from_wrapping() -> None:
    x = np.array([2**62], dtype=np.int64)
    with np.errstate(over="ignore"):
        assert (x + x)[0] == -(2**63)  # what an unchecked int64 sum (and gloo) gives
    with pytest.raises(FixedPointOverflowError):
        check_headroom(x, 2)


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros(4, dtype=np.float64),
        np.zeros(4, dtype=np.float32),
        np.zeros(4, dtype=np.int32),
        np.zeros(4, dtype=np.uint64),
        np.zeros((2, 2), dtype=np.int64),
        [1, 2, 3],
    ],
)
def test_contribution_refuses_anything_but_1d_int64(bad: object) -> None:
    with pytest.raises(ShapeError):
        check_contribution(bad, 2)


def test_contribution_is_contiguous_int64() -> None:
    strided = np.arange(10, dtype=np.int64)[::2]
    out = check_contribution(strided, 2)
    assert out.flags.c_contiguous and np.array_equal(out, strided)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "5", None])
def test_timeout_must_be_positive_and_finite(bad: object) -> None:
    with pytest.raises(CollectiveUsageError):
        check_timeout(bad)


@pytest.mark.parametrize(
    "exc",
    [
        ShapeError("s"),
        FixedPointOverflowError("o"),
        CollectiveUsageError("u"),
        PeerLost([3, 1], "p"),
    ],
)
def test_refusal_codes_round_trip(exc: Exception) -> None:
    back = refusal_error(refusal_code(exc), "message", getattr(exc, "ranks", ()))
    assert type(back) is type(exc)
    if isinstance(exc, PeerLost):
        assert back.ranks == (1, 3)


def test_header_round_trip_and_foreign_bytes_refused() -> None:
    frame = Frame(Kind.ALLREDUCE, 2, 41, 3, -7, b"abc")
    raw = encode_header(frame)
    assert len(raw) == HEADER.size == 32
    assert decode_header(raw, 1 << 20) == (Kind.ALLREDUCE, 2, 41, 3, -7, 3)
    with pytest.raises(CommError, match="not a DaisyChain frame"):
        decode_header(b"GET / HTTP/1.1\r\n" + bytes(16), 1 << 20)
    with pytest.raises(CommError, match="exceeds the limit"):
        decode_header(raw, 2)


def test_unknown_transport_is_named() -> None:
    with pytest.raises(CollectiveUsageError, match="loopback"):
        asyncio.run(make_collective("carrier-pigeon"))
