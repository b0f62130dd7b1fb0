"""The int64 codec's numba planes (pynode.native_codec) against its numpy ones: the same
bytes on the wire, whichever side packs or unpacks; a wrong native kernel is refused."""

from __future__ import annotations

import numpy as np
import pytest

from pynode.comm import wire

native_codec = pytest.importorskip("pynode.native_codec")
if native_codec.numba is None:
    pytest.skip("numba is not installed (the `fast` extra)", allow_module_level=True)


def vectors() -> list[np.ndarray]:
    rng = np.random.default_rng(11)  # test data only
    return [
        np.zeros(0, np.int64),
        np.array([-(2**63)], np.int64),
        np.array([2**63 - 1, -1, 0, 1, -(2**63)], np.int64),
        rng.integers(-(2**62), 2**62, 4097, dtype=np.int64) >> rng.integers(0, 62, 4097),
        rng.integers(-(2**26), 2**26, 119_104, dtype=np.int64),
    ]


def test_native_planes_are_numpys_bytes(fresh_codec):
    assert wire._native_planes() is not None  # numba is here and passed the gate
    for x in vectors():
        planes = native_codec.zigzag_planes(x)
        assert planes.dtype == np.uint8 and np.array_equal(planes, wire._zigzag_planes(x))
        assert np.array_equal(native_codec.words_of_planes(planes), x)
        assert np.array_equal(wire._words_of_planes(planes), x)


def test_packed_natively_unpacks_with_numpy_and_back(fresh_codec, monkeypatch):
    packed = [wire.pack_int64(x) for x in vectors()]  # numba's planes
    monkeypatch.setattr(native_codec, "numba", None)  # as in Pyodide
    wire._native_planes.cache_clear()
    assert wire._native_planes() is None
    for x, data in zip(vectors(), packed, strict=True):
        assert wire.pack_int64(x) == data  # numpy packs the same bytes
        assert np.array_equal(wire.unpack_int64(data, x.shape[0]), x)


def test_a_wrong_native_kernel_is_not_used(fresh_codec, monkeypatch, caplog):
    right = native_codec.zigzag_planes

    def off_by_one(x):
        planes = right(x)
        planes[0, -1] ^= 1  # the last value's lowest bit
        return planes

    monkeypatch.setattr(native_codec, "zigzag_planes", off_by_one)
    assert wire._native_planes() is None
    assert "differ from numpy's" in caplog.text
    x = vectors()[-1]
    assert np.array_equal(wire.unpack_int64(wire.pack_int64(x), x.shape[0]), x)
