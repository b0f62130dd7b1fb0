"""The int64 codec of pack_message / unpack_message: lossless, compact, refuses bad data.

Plain functions without fixtures or pytest: this module also runs inside Pyodide
(tests/pyodide/harness.py), where the page packs and unpacks the same vectors.
"""

from __future__ import annotations

import zlib

import numpy as np

from pynode.comm import blocks
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

# pack_int64(golden_vector()) as written with CPython's zlib 1.2.13: every runtime reads it
GOLDEN_HEX = (
    "010001feff7eee7192d1f53e832ccc7d0e91d58efb6061b9de33d4a21384775744e5ca022f0e05060071c41d"
    "cf78934c72e102c5056a93d2c97d346b8620fff6c9023f0000006360f8ff7fa770d4821305071fe5aa96322a"
    "2e7cf641745df1f6d5cf04358499d81919a040206be2eb1f3e5f4f6c996999a05769b5ac744b5e8ac30cb126"
    "0002360000006360f8ffbf728d919280a4d6b96552fd5a457fe415c419d81819d0c09bbfec6e569f6bab526c"
    "b42a2f5ef82dd05fa26ecdcac9ca000002290000006360f8ffdffcd1ea39960ff424a5185999187080e023cf"
    "c293d8ef27864d94b4e5606765606480000002180000006360f8ff5f8e8985898100905dcb65c6c3c6c6c0c8"
    "800a00020d0000006360f8ff9f8108c0c8801d000002090000006360f8ff9f8102000002090000006360f8ff"
    "9f81020000"
)

# pack_int64(golden_vector(), local=True): bit-packed blocks, written by pynode/comm/blocks.py
GOLDEN_BLOCKS_HEX = (
    "03402900000000000000000100000000000000feffffffffffffffffffffffffffffff7eb979371e000000ee"
    "13ace202000000715a32ab0400000092a0229c02000000d1c8103900000000f57019e0000000003ec12a2e00"
    "00000083e2ce19000000002c6da61a00000000cc251a01000000007d758f05000000000e012a020000000091"
    "21720000000000d5a1fc00000000008ee61f0000000000fbf0200000000000601517000000000061ae000000"
    "000000b973060000000000deb701000000000033ab000000000000d4e6000000000000a21100000000000013"
    "280000000000008413000000000000770200000000000057070000000000004401000000000000e500000000"
    "940100000008000000007801000000e000000000a00000000080010000000000000000007110ec531d89d5fa"
    "895b75441e982b785e37bab28187af23c6609269fec000537ddfb7013964bd3000e1b4645601043279220114"
    "e7a864002800cbeb01a0e6128d0060320ffa0080b4ce7e018064530800007d758f01006868e90000acb99d00"
    "003024db01000002540000e01f33010080bd45010080644100000000000000"
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
        np.concatenate([np.zeros(20000, np.int64),  # longer vectors, each part of a kind
                        rng.integers(-(2**40), 2**40, 20000, dtype=np.int64),
                        rng.integers(-3, 4, 7000, dtype=np.int64)]),
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
    assert len(message) < x.nbytes / 3  # two planes of eight, one deflated
    assert int64_saving(message, {}, x) == len(pack_message({})) + x.nbytes - len(message)


def test_skewed_planes_are_deflated_without_zero_bytes():
    rng = np.random.default_rng(6)  # test data only
    x = rng.integers(1, 8, 5000, dtype=np.int64)  # zigzag 2..14: a plane of 7 byte values
    # ~2.8 bits of entropy a byte: Huffman codes, where a noise plane would be sent raw
    assert len(pack_int64(x)) < 0.5 * x.shape[0]
    noise = rng.integers(-128, 128, 5000, dtype=np.int64)  # zigzag 0..255: ~8 bits a byte
    assert len(pack_int64(noise)) == 1 + noise.shape[0] + 7


def test_local_packing_is_bit_packed_blocks_that_read_back_exactly():
    """Between peers of one machine (`local`) a vector travels as bit-packed blocks
    (pynode/comm/blocks.py): the golden bytes read back on every runtime, the native and
    numpy forms write the same bytes, and every length, magnitude and sign round-trips."""
    assert np.array_equal(unpack_int64(bytes.fromhex("".join(GOLDEN_BLOCKS_HEX)), 64),
                          golden_vector())
    assert pack_int64(golden_vector(), local=True).hex() == "".join(GOLDEN_BLOCKS_HEX)
    rng = np.random.default_rng(12)  # test data only
    for n in (0, 1, 31, 32, 33, 95, 1000):
        for bits in (0, 1, 7, 33, 63):
            x = rng.integers(-(2**62), 2**62, n, dtype=np.int64) >> (63 - bits)
            if n > 64:
                x[:4], x[32:64] = [2**63 - 1, -(2**63), -1, 0], 0  # a zero block between
            packed = pack_int64(x, local=True)
            widths, words = blocks.pack(x)
            assert packed == b"\x03" + widths.tobytes() + words.astype("<u8").tobytes()
            assert np.array_equal(unpack_int64(packed, n), x)
            assert np.array_equal(blocks.unpack(widths, words, n), x)
    head, back = unpack_message(pack_message({"t": 1}, x, local=True))
    assert head == {"t": 1} and np.array_equal(back, x)


def test_blocks_take_the_bits_of_each_blocks_largest_value():
    """A block's width is its largest zigzag word's bits: 32 values below 2**9 in
    magnitude take 10 bits each, so a vector of them packs to ~10 / 64 of raw int64."""
    rng = np.random.default_rng(13)  # test data only
    x = rng.integers(-(2**9), 2**9, 32 * 50, dtype=np.int64)
    x[::32] = 2**9 - 1  # the largest magnitude in every block: zigzag 1022, 10 bits
    packed = pack_int64(x, local=True)
    assert list(blocks.block_widths(blocks.zigzag(x))) == [10] * 50
    assert len(packed) == 1 + 50 + 8 * (-(-50 * 32 * 10 // 64))


def test_malformed_blocks_raise_message_error():
    x = golden_vector()
    packed = pack_int64(x, local=True)
    wide = bytearray(packed)
    wide[1] = 65  # a width no 64-bit word has
    for data, length in [(packed, 63), (packed, 65), (packed[:-1], 64), (packed + b"\x00", 64),
                         (bytes(wide), 64), (b"\x03", 64), (b"\x03" + b"\x00", 33)]:
        refused(MessageError, unpack_int64, data, length)
    assert unpack_int64(b"\x03" + bytes(2), 33).tolist() == [0] * 33  # two zero-width blocks


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
    huge = bomb.compress(bytes(8 * 10**6)) + bomb.flush()  # 8 MB of zeros as a plane of 8
    plane = b"\x02" + len(huge).to_bytes(4, "little") + huge
    refused(MessageError, unpack_int64, plane + b"\x00" * 7, 8)
    refused(MessageError, unpack_int64, b"\x01" * 8, 8)  # raw planes without their bytes
    refused(MessageError, unpack_int64, b"\x00" * 7, 8)  # seven planes
    refused(MessageError, unpack_message, pack_message({}, x)[:-3])
