"""The int64 codec of pack_message / unpack_message: lossless, compact, refuses bad data.

Plain functions without fixtures or pytest: this module also runs inside Pyodide
(tests/pyodide/harness.py), where the page packs and unpacks the same vectors.
"""

from __future__ import annotations

import zlib

import numpy as np

from pynode.comm.base import CollectiveUsageError
from pynode.comm.wire import (
    INT64_KEY,
    MessageError,
    int64_saving,
    pack_int64,
    pack_message,
    unpack_int64,
    unpack_message,
)

# pack_int64(golden_vector()) as CPython's zlib 1.2.13 wrote it: every runtime must read it
GOLDEN_HEX = (
    "6360fcf7bfee5de1a48b5fed9a75ced4f24dbcdaf73b2171e73de32b8b845bcac35d9e9e62d2e7636563283c"
    "227bbe62b24fd143a6a3ac59932f9dac35c96e53f8ffed2403c3ffff3b85a3169c2838f82857b5945171e1b3"
    "0fa2eb8ab7af7e26a821ccc4cec800050259135ffff0f97a62cb4ccb04bd4aab65a55bf2521c668835313"
    "0fcff5fb9c648494052ebdc32a97eada23ff20ae20c6c8c0c68e0cd5f7637abcfb55529365a95172ffc16e8"
    "2f51b766e564656060f8ffdffcd1ea39960ff424a5185999187080e023cfc293d8ef27864d94b4e56067656"
    "0648081ffffe5985898180800d9b55c663c6c6c0c8c0ce8e0ff7f06220023032ef0ff3f0345e0ff7f060a0000"
)


def refused(error: type[Exception], fn, *args) -> str:
    """The message of the `error` that fn(*args) raises; fails if it returns."""
    try:
        fn(*args)
    except error as exc:
        return str(exc)
    raise AssertionError(f"{fn.__name__}{args!r:.60} did not raise {error.__name__}")


def golden_vector() -> np.ndarray:
    """(64,) int64 of every magnitude from 2**0 to 2**41, the int64 extremes first."""
    i = np.arange(64, dtype=np.uint64)
    words = (i * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)  # wraps: a cheap hash
    x = words >> (i % np.uint64(40) + np.uint64(23)).astype(np.int64)
    x[:4] = [0, -1, 2**63 - 1, -(2**63)]
    return x


def test_golden_bytes_unpack_to_the_same_bits():
    got = unpack_int64(bytes.fromhex(GOLDEN_HEX), 64)
    assert got.dtype == np.int64 and np.array_equal(got, golden_vector())


def test_round_trip_is_exact_for_every_kind_of_vector():
    rng = np.random.default_rng(3)  # test data only
    cases = [
        np.zeros(0, np.int64),
        np.array([-(2**63), 2**63 - 1, -1, 0, 1], np.int64),
        rng.integers(-(2**62), 2**62, 1001, dtype=np.int64),
        rng.integers(-(2**25), 2**25, 5000, dtype=np.int64),
        np.arange(0, 3000, dtype=np.int64)[::3],  # not contiguous
    ]
    for x in cases:
        head, got = unpack_message(pack_message({"t": "x", "n": 1}, x))
        assert head == {"t": "x", "n": 1}  # the codec's key is gone again
        assert got.dtype == np.int64 and got.flags.writeable and np.array_equal(got, x)


def test_bytes_blobs_are_untouched():
    head, blob = unpack_message(pack_message({"a": [1, 2]}, b"\x00raw"))
    assert head == {"a": [1, 2]} and blob == b"\x00raw"


def test_small_magnitudes_take_few_bytes():
    x = np.arange(-5000, 5000, dtype=np.int64)  # 14 bits of 64
    message = pack_message({}, x)
    assert len(message) < x.nbytes / 4
    assert int64_saving(message, {}, x) == len(pack_message({})) + x.nbytes - len(message)


def test_bad_vectors_are_refused_at_the_sender():
    refused(CollectiveUsageError, pack_int64, np.zeros(3, np.int32))
    refused(CollectiveUsageError, pack_int64, np.zeros((2, 2), np.int64))
    assert INT64_KEY in refused(CollectiveUsageError, pack_message, {INT64_KEY: 1},
                                np.zeros(1, np.int64))


def test_malformed_vectors_raise_message_error():
    x = golden_vector()
    packed = pack_int64(x)
    bad = [
        (packed, 63),  # fewer values than it holds
        (packed, 65),  # more
        (packed[:-5], 64),  # truncated
        (packed + b"\x00", 64),  # trailing bytes
        (b"\xff" * 40, 64),  # not deflate
        (packed, -1),
        (packed, "64"),
        (packed, True),
    ]
    for data, length in bad:
        refused(MessageError, unpack_int64, data, length)
    bomb = zlib.compressobj(1, zlib.DEFLATED, -15)
    huge = bomb.compress(bytes(8 * 10**6)) + bomb.flush()  # 8 MB of zeros claimed as 8 values
    refused(MessageError, unpack_int64, huge, 8)
    refused(MessageError, unpack_message, pack_message({}, x)[:-3])
