"""The int64 codec's deflate through zlib-ng (the `fast` extra) against plain zlib, which
Pyodide and peers without the extra have: each reads what the other packed, a corrupt
stream is the codec's MessageError under either, and a zlib-ng that does not round-trip
with zlib is refused."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from pynode.comm import wire

zlib_ng = pytest.importorskip("zlib_ng.zlib_ng")


def vectors() -> list[np.ndarray]:
    rng = np.random.default_rng(12)  # test data only
    grad = rng.integers(-(2**26), 2**26, 119_104, dtype=np.int64)
    grad[rng.random(grad.shape[0]) < 0.9] >>= 18  # mostly small: zero runs in upper planes
    return [
        np.zeros(0, np.int64),
        np.array([2**63 - 1, -1, 0, 1, -(2**63)], np.int64),
        grad,
        rng.integers(0, 40, 50_000, dtype=np.int64),  # a skewed low plane, no zero runs
    ]


def test_zlib_ng_packs_what_plain_zlib_unpacks_and_back(fresh_codec, monkeypatch):
    assert wire._deflate() is zlib_ng  # installed, and passed its round trip
    packed = [wire.pack_int64(x) for x in vectors()]
    assert any(wire._PLANE_DEFLATED in data for data in packed)
    monkeypatch.setattr(wire, "_deflate", lambda: zlib)  # as in Pyodide
    for x, data in zip(vectors(), packed, strict=True):
        assert np.array_equal(wire.unpack_int64(data, x.shape[0]), x)
        mine = wire.pack_int64(x)
        monkeypatch.setattr(wire, "_deflate", lambda: zlib_ng)
        assert np.array_equal(wire.unpack_int64(mine, x.shape[0]), x)
        monkeypatch.setattr(wire, "_deflate", lambda: zlib)


def test_a_corrupt_stream_is_a_message_error_under_zlib_ng(fresh_codec):
    assert wire._deflate() is zlib_ng
    garbage = bytes(range(255, 215, -1))  # not a deflate stream: an invalid block type
    with pytest.raises(zlib_ng.error):
        zlib_ng.decompressobj(-15).decompress(garbage)
    plane = b"\x02" + len(garbage).to_bytes(4, "little") + garbage
    with pytest.raises(wire.MessageError, match="malformed int64 vector"):
        wire.unpack_int64(plane + b"\x00" * 7, 40)


def test_a_zlib_ng_that_does_not_round_trip_is_not_used(fresh_codec, monkeypatch, caplog):
    right = zlib_ng.compressobj

    class Flipped:
        """zlib-ng's compressor with the middle byte of each stream inverted."""

        def __init__(self, *args):
            self._packer = right(*args)

        def compress(self, data):
            return self._packer.compress(data)

        def flush(self):
            tail = bytearray(self._packer.flush())
            tail[len(tail) // 2] ^= 0xFF
            return bytes(tail)

    monkeypatch.setattr(zlib_ng, "compressobj", Flipped)
    assert wire._deflate() is zlib
    assert "do not round-trip" in caplog.text
    x = vectors()[2]
    assert np.array_equal(wire.unpack_int64(wire.pack_int64(x), x.shape[0]), x)
