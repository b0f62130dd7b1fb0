"""The counter-based RNG: known answers, stream layout, statistics, independence, errors.

Tests are plain functions (no fixtures), so tests/pyodide can run them on wasm too.
"""

from __future__ import annotations

import math

import numpy as np

from pynode.core import rng
from pynode.core.rng import RngArgumentError

# Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key, expected.
PHILOX_KAT = [
    ([0x00000000] * 4, (0x00000000, 0x00000000), [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, (0xFFFFFFFF, 0xFFFFFFFF), [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], (0xA4093822, 0x299F31D0),
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]

# Produced by this reference implementation when it was written (CPython 3.11, numpy
# 2.4, x86-64) and confirmed under Pyodide 0.27.7 (numpy 2.0.2, wasm32). They pin the key
# derivation and the stream layout: if one changes, every seeded run in the world does.
GOLDEN_BITS64 = {
    ((0,), 0): [0xFEE12B56E98EA148, 0xDB984D513C3E42EA, 0x8CCC8EE28C959F9C],
    ((1, 2, 3), 0): [0x1272C0CABC2380C4, 0x8B83451B4DDCCDFE, 0x9B8200C2E4DD3C4F],
    ((2024, 7, 3, 1, 2), 5): [0x9C8F423BB5D39142, 0xD2D8E2D0370DD0C6, 0xB2FFFF0B121DE35D],
    ((), 0): [0xD0B56590F63BDEDA, 0x5F624703361C3944, 0xEEE648E2B28C89BA],
    ((2**64 + 5, 0), 2**64 - 3): [0x78945FADB80EF30C, 0xD2FC26D6F7811E2F, 0x282DB072722A5FEB],
}


def test_philox_known_answers():
    for counter, key, expected in PHILOX_KAT:
        out = rng.philox4x32(np.array(counter, np.uint64).reshape(4, 1), key)
        assert out[:, 0].tolist() == expected, [hex(v) for v in out[:, 0].tolist()]


def test_golden_bits64():
    for (key, offset), expected in GOLDEN_BITS64.items():
        got = rng.bits64(key, len(expected), offset=offset)
        assert got.dtype == np.uint64
        assert got.tolist() == expected, (key, offset, [hex(v) for v in got.tolist()])


def test_offsets_address_the_same_stream():
    key = (5, 6, 7)
    whole = rng.bits64(key, 300)
    for offset in (0, 1, 2, 3, 5, 127, 128, 129, 250):
        for n in (0, 1, 2, 7, 50):
            if offset + n <= 300:
                assert np.array_equal(rng.bits64(key, n, offset=offset), whole[offset : offset + n])
    far = rng.bits64(key, 5, offset=2**63 - 2)
    assert np.array_equal(rng.bits64(key, 2, offset=2**63 + 1), far[3:])
    assert rng.bits64(key, 3, offset=2**64 - 3).shape == (3,)


def test_stream_layout_shared_by_all_draws():
    """bits64 element i is w[2i] << 32 | w[2i+1]; uniform takes the top 24 bits of w[i]."""
    key = (11, 3)
    b = rng.bits64(key, 40)
    words = np.stack([b >> np.uint64(32), b & np.uint64(0xFFFFFFFF)], axis=1).reshape(-1)
    expected = (words >> np.uint64(8)).astype(np.float32) * np.float32(2.0**-24)
    assert np.array_equal(rng.uniform(key, 80), expected)
    assert np.array_equal(rng.uniform(key, (8, 10)).reshape(-1), expected)


def test_uniform_range_resolution_and_moments():
    u = rng.uniform((1, 2, 3, 4), (512, 512))
    assert u.dtype == np.float32 and u.shape == (512, 512)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert np.array_equal(u * np.float32(2**24), np.floor(u * np.float32(2**24)))
    n = u.size
    mean, var = u.astype(np.float64).mean(), u.astype(np.float64).var()
    assert abs(mean - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(var - 1 / 12) < 5 * math.sqrt(1 / 180 / n)  # var of (u-1/2)^2 is 1/180


def _chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


def test_bytes_are_uniform_chi_square():
    """Bytes of 2**17 bits64 draws in 256 bins: chi^2 (255 dof) within 6 sigma of 255."""
    raw = rng.bits64((77,), 2**17).view(np.uint8)
    chi2 = _chi_square(np.bincount(raw, minlength=256))
    assert abs(chi2 - 255) < 6 * math.sqrt(2 * 255), chi2
    for lane in range(8):  # every byte position of the uint64, not just the mix
        lane_chi2 = _chi_square(np.bincount(raw[lane::8], minlength=256))
        assert abs(lane_chi2 - 255) < 6 * math.sqrt(2 * 255), (lane, lane_chi2)


def test_normal_moments_and_tails():
    z = rng.normal((3, 1, 4), 2**18).astype(np.float64)
    n = z.size
    assert rng.normal((3, 1, 4), (4, 5)).dtype == np.float32
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs((z**3).mean()) < 5 * math.sqrt(15 / n)
    assert abs((z**4).mean() - 3) < 5 * math.sqrt(96 / n)
    beyond3 = np.count_nonzero(np.abs(z) > 3) / n  # 0.0026998
    assert abs(beyond3 - 0.0026998) < 5 * math.sqrt(0.0027 / n)
    assert np.isfinite(z).all() and np.abs(z).max() < 8.6


def test_normal_odd_count_is_a_prefix():
    assert np.array_equal(rng.normal((8,), 7), rng.normal((8,), 8)[:7])


def test_distinct_keys_are_independent():
    base = rng.uniform((1, 2, 3), 2**16).astype(np.float64)
    for other in [(1, 2, 4), (1, 2, 3, 0), (1, 3, 2), (2, 2, 3), (1, 2), (1, 2, 2**64 + 3)]:
        u = rng.uniform(other, 2**16).astype(np.float64)
        corr = np.corrcoef(base, u)[0, 1]
        assert abs(corr) < 5 / math.sqrt(base.size), (other, corr)
        assert not np.array_equal(rng.bits64(other, 4), rng.bits64((1, 2, 3), 4))
    # neighbouring counters within one stream are uncorrelated too
    assert abs(np.corrcoef(base[:-1], base[1:])[0, 1]) < 5 / math.sqrt(base.size)


def test_key_forms_that_mean_the_same():
    want = rng.bits64((4, 5), 6)
    assert np.array_equal(rng.bits64([4, 5], 6), want)
    assert np.array_equal(rng.bits64((np.int64(4), np.uint8(5)), 6), want)


def test_randint_range_and_uniformity():
    r = rng.randint((9, 1), (100, 1000), 10)
    assert r.dtype == np.int64 and r.shape == (100, 1000)
    assert r.min() == 0 and r.max() == 9
    chi2 = _chi_square(np.bincount(r.reshape(-1).astype(np.intp), minlength=10))
    assert chi2 < 9 + 6 * math.sqrt(18), chi2
    assert (rng.randint((9, 2), 50, 1) == 0).all()
    big = rng.randint((9, 3), 4000, 2**63)
    assert big.min() >= 0 and (big > 2**62).mean() > 0.45


def test_mulhi_is_exact():
    g = np.random.default_rng(5)
    x = np.concatenate([g.integers(0, 2**64, 500, dtype=np.uint64, endpoint=False),
                        np.array([0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1], np.uint64)])
    for high in (1, 2, 3, 10, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 3, 2**63 - 25, 2**63):
        got = rng._mulhi64(x, high).tolist()
        assert got == [(int(v) * high) >> 64 for v in x.tolist()], high


def test_permutation():
    p = rng.permutation((12,), 1000)
    assert p.dtype == np.int64 and np.array_equal(np.sort(p), np.arange(1000))
    assert np.array_equal(p, rng.permutation((12,), 1000))
    assert not np.array_equal(p, rng.permutation((13,), 1000))
    assert rng.permutation((12,), 0).shape == (0,)
    first = np.array([rng.permutation((20, i), 4)[0] for i in range(1500)])
    assert _chi_square(np.bincount(first.astype(np.intp), minlength=4)) < 3 + 6 * math.sqrt(6)


def test_bad_arguments_are_refused():
    bad_keys = [(-1,), (1.5,), (True,), ("a",), "abc", 5, None, (1, None)]
    for key in bad_keys:
        _assert_raises(RngArgumentError, rng.bits64, key, 3)
    _assert_raises(RngArgumentError, rng.bits64, (1,), -1)
    _assert_raises(RngArgumentError, rng.bits64, (1,), 1, -1)
    _assert_raises(RngArgumentError, rng.bits64, (1,), 4, 2**64 - 3)
    _assert_raises(RngArgumentError, rng.uniform, (1,), (3, -1))
    _assert_raises(RngArgumentError, rng.normal, (1,), (2.5,))
    _assert_raises(RngArgumentError, rng.uniform, (1,), None)
    _assert_raises(RngArgumentError, rng.randint, (1,), 3, 0)
    _assert_raises(RngArgumentError, rng.randint, (1,), 3, 2**63 + 1)
    _assert_raises(RngArgumentError, rng.permutation, (1,), -2)
    _assert_raises(RngArgumentError, rng.philox4x32, np.full((4, 1), 2**32, np.uint64), (0, 0))
    _assert_raises(RngArgumentError, rng.philox4x32, np.zeros((4, 1), np.uint64), (2**32, 0))
    _assert_raises(RngArgumentError, rng.philox4x32, np.zeros((3, 1), np.uint64), (0, 0))
    assert issubclass(RngArgumentError, ValueError)


def _assert_raises(exc: type, fn, *args) -> None:
    try:
        fn(*args)
    except exc:
        return
    raise AssertionError(f"{fn.__name__}{args!r} did not raise {exc.__name__}")


def test_philox4x64_known_answers():
    """Random123's kat_vectors for philox4x64-10: the zero and the pi-digits vectors."""
    zero = rng.philox4x64(np.zeros((4, 1), np.uint64), (0, 0))[:, 0]
    assert [int(v) for v in zero] == [0x16554D9ECA36314C, 0xDB20FE9D672D0FDC,
                                      0xD7E772CEE186176B, 0x7E68B68AEC7BA23B]
    counter = np.array([[0x243F6A8885A308D3], [0x13198A2E03707344], [0xA4093822299F31D0],
                        [0x082EFA98EC4E6C89]], np.uint64)
    pi = rng.philox4x64(counter, (0x452821E638D01377, 0xBE5466CF34E90C6C))[:, 0]
    assert [int(v) for v in pi] == [0xA528F45403E61D95, 0x38C72DBD566E9788,
                                    0xA5A1610E72FD18B5, 0x57BD43B5E52B7FE6]


def test_numpy_philox_equals_the_oracle():
    """numpy's C Philox (the fast draws) gives the oracle's words on this runtime."""
    for key, n in (((1, 2, 3), 1001), ((2**63 - 1, 0, 2**32 + 7), 5), ((), 64)):
        assert np.array_equal(rng.raw64(key, n), rng.raw64_reference(key, n))
    rng.check_bit_generator()


def test_raw64_streams_are_prefixes_and_keyed():
    assert np.array_equal(rng.raw64((4, 5), 10), rng.raw64((4, 5), 37)[:10])
    assert not np.array_equal(rng.raw64((4, 5), 8), rng.raw64((4, 6), 8))
    assert not np.array_equal(rng.raw64((4, 5), 8), rng.raw64((4, 5, 0), 8))


def test_uniform16_lanes_resolution_and_moments():
    u = rng.uniform16((9, 1), (400, 500))
    assert u.dtype == np.float32 and u.shape == (400, 500)
    assert u.min() >= 0 and u.max() < 1
    assert np.all(u * np.float32(65536) == np.floor(u * np.float32(65536)))  # 16 bits
    lanes = (u.astype(np.float64) * 65536).astype(np.int64).reshape(-1)
    words = rng.raw64((9, 1), (lanes.size + 3) // 4)
    assert np.array_equal(lanes[:4], [(int(words[0]) >> (16 * j)) & 0xFFFF for j in range(4)])
    assert abs(float(u.mean(dtype=np.float64)) - 0.5) < 0.002
    counts = np.bincount((lanes >> 12).astype(np.intp), minlength=16)  # top 4 bits: 16 bins
    expected = lanes.size / 16
    assert float(((counts - expected) ** 2 / expected).sum()) < 60  # chi2(15) p ~ 1e-7


def test_uniform16_refuses_bad_keys_and_shapes():
    for key, shape in (((-1,), 4), ((1.5,), 4), ((True,), 4), ((1,), (-2, 3)), ((1,), "x")):
        try:
            rng.uniform16(key, shape)
        except RngArgumentError:
            continue
        raise AssertionError(f"uniform16({key!r}, {shape!r}) was not refused")
