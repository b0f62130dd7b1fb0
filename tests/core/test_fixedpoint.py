"""int64 fixed-point gradients: exact conversion, deterministic mean, refusals."""

from fractions import Fraction

import numpy as np
import pytest

from pynode.core.errors import FixedPointOverflowError, NonFiniteError, ShapeError
from pynode.core.fixedpoint import (
    DEFAULT_FRAC_BITS,
    SAFE_CONTRIBUTIONS,
    VALUE_BOUND,
    FixedPointFormatError,
    check_headroom,
    from_fixed,
    max_abs,
    to_fixed,
)


def random_grads(n: int, seed: int) -> np.ndarray:
    """float32 values spread over many binades, both signs, plus zeros and subnormals."""
    rs = np.random.RandomState(seed)
    mant = rs.uniform(1.0, 2.0, n)
    exps = rs.randint(-60, 12, n)
    signs = rs.choice([-1.0, 1.0], n)
    g = (signs * np.ldexp(mant, exps)).astype(np.float32)
    g[:4] = [0.0, -0.0, np.float32(1e-45), np.float32(-3e-39)]
    return g


def oracle_to_fixed(g: np.ndarray, frac_bits: int) -> list[int]:
    # Python's round() of a Fraction rounds half to even, exactly.
    return [round(Fraction(float(x)) * 2**frac_bits) for x in g]


@pytest.mark.parametrize("frac_bits", [16, 32, 40])
def test_to_fixed_matches_exact_rational_rounding(frac_bits):
    g = random_grads(3000, seed=frac_bits)
    g = g[np.abs(g.astype(np.float64)) < 2.0 ** (52 - frac_bits)]
    got = to_fixed(g, frac_bits)
    assert got.dtype == np.int64
    assert got.tolist() == oracle_to_fixed(g, frac_bits)


def test_ties_round_half_to_even():
    f = 20
    halves = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5], np.float64) * 2.0**-f
    got = to_fixed(halves.astype(np.float32), f)
    assert got.tolist() == [0, 2, 2, 0, -2, -2, 4]


def test_default_frac_bits_and_bound_from_design():
    assert DEFAULT_FRAC_BITS == 32
    q = to_fixed(np.array([0.27, -0.27], np.float32))
    assert max_abs(q).bit_length() <= 63 - 23  # 23+ bits of headroom (DESIGN section 3)
    assert SAFE_CONTRIBUTIONS * VALUE_BOUND == 2**63


def test_value_at_bound_passes_and_above_is_refused():
    f = 32
    at_bound = np.array([2.0 ** (53 - f), -(2.0 ** (53 - f))], np.float32)
    assert to_fixed(at_bound, f).tolist() == [2**53, -(2**53)]
    above = np.nextafter(np.float32(2.0 ** (53 - f)), np.float32(np.inf))
    with pytest.raises(FixedPointOverflowError, match="frac_bits"):
        to_fixed(np.array([0.0, above], np.float32), f)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_refused(bad):
    g = np.array([[0.1, 0.2], [bad, 0.3]], np.float32)
    with pytest.raises(NonFiniteError, match="index"):
        to_fixed(g, 32)


def test_bad_dtype_and_format_refused():
    with pytest.raises(ShapeError):
        to_fixed(np.zeros(3, np.float64), 32)
    with pytest.raises(ShapeError):
        from_fixed(np.zeros(3, np.int32), 32, 1)
    for bad_bits in (-1, 63, 2.5, True):
        with pytest.raises(FixedPointFormatError):
            to_fixed(np.zeros(3, np.float32), bad_bits)
    for bad_div in (0, -3, 1.0, True):
        with pytest.raises(FixedPointFormatError):
            from_fixed(np.zeros(3, np.int64), 32, bad_div)


def oracle_from_fixed(total: int, frac_bits: int, divisor: int) -> np.float32:
    # int -> float rounds correctly in Python; / 2**F is exact; / divisor and the float32
    # cast each round once: the same three roundings the contract specifies.
    return np.float32(float(total) / 2.0**frac_bits / float(divisor))


def test_from_fixed_matches_independent_rounding_chain():
    rs = np.random.RandomState(7)
    totals = [0, 1, -1, 2**53 + 1, -(2**53) - 3, 2**62 + 12345, -(2**63), 2**63 - 1]
    totals += [int(x) for x in rs.randint(-(2**62), 2**62, 500, dtype=np.int64)]
    totals += [int(x) for x in rs.randint(-(2**40), 2**40, 500, dtype=np.int64)]
    arr = np.array(totals, np.int64)
    for frac_bits, divisor in ((32, 1), (32, 3), (40, 7), (16, 1024)):
        got = from_fixed(arr, frac_bits, divisor)
        want = np.array([oracle_from_fixed(t, frac_bits, divisor) for t in totals], np.float32)
        assert got.dtype == np.float32
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_round_trip_is_exact_when_representable():
    g = random_grads(2000, seed=3)
    g = g[(np.abs(g) >= 2.0**-8) & (np.abs(g) < 2.0**15)]
    back = from_fixed(to_fixed(g, 32), 32, 1)
    assert np.array_equal(back.view(np.uint32), g.view(np.uint32))


def test_mean_does_not_depend_on_grouping_or_order():
    rs = np.random.RandomState(11)
    micro = [rs.standard_normal(257).astype(np.float32) * 0.05 for _ in range(8)]
    fixed = [to_fixed(g, 32) for g in micro]
    one_peer = sum(fixed[1:], fixed[0].copy())
    # three peers with capacities 1:2:5, each summing its own part, then reduced in reverse
    parts = [fixed[0], fixed[1] + fixed[2], fixed[3] + fixed[4] + fixed[5] + fixed[6] + fixed[7]]
    three_peers = parts[2] + parts[1] + parts[0]
    a = from_fixed(one_peer, 32, 8)
    b = from_fixed(three_peers, 32, 8)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_headroom_check():
    check_headroom(VALUE_BOUND, SAFE_CONTRIBUTIONS - 1)
    check_headroom(0, 10**6)
    with pytest.raises(FixedPointOverflowError, match="wrap"):
        check_headroom(VALUE_BOUND, SAFE_CONTRIBUTIONS)
    with pytest.raises(FixedPointOverflowError):
        check_headroom(2**40, 2**23)
    with pytest.raises(FixedPointFormatError):
        check_headroom(-1, 3)


def test_zero_dim_arrays_stay_arrays():
    q = to_fixed(np.asarray(np.float32(0.75)), 32)
    assert isinstance(q, np.ndarray) and q.shape == () and int(q) == 3 * 2**30
    g = from_fixed(q, 32, 1)
    assert isinstance(g, np.ndarray) and g.shape == () and g.dtype == np.float32


def test_max_abs_handles_int64_min():
    assert max_abs(np.array([3, -(2**63), 5], np.int64)) == 2**63
    assert max_abs(np.array([], np.int64)) == 0
    assert max_abs(np.array([[7, -2]], np.int64)) == 7
