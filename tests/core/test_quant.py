"""float32 <-> int8 quantization and the epilogue, against independent oracles.

The round-to-nearest oracle divides in float64 and rounds to float32 (correctly rounded
for float32 operands: 53 >= 2 * 24 + 2), then rounds half to even with Python's round().
Bits are compared with np.array_equal (scales through their uint32 views).
Legend: M rows, K columns of a row-quantized matrix, N columns, G batch.
"""

from __future__ import annotations

import numpy as np
import pytest

from pynode.core import quant
from pynode.core.errors import NonFiniteError, ShapeError

KEY = (11, 2, 0, 5, 1)


def normal(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def bits(x):
    return x.view(np.uint32)


def oracle_rows(x):
    absmax = np.abs(x).max(axis=1)
    scale = np.where(absmax == 0, np.float32(1), absmax / np.float32(127)).astype(np.float32)
    q = np.empty(x.shape, np.int8)
    for i, j in np.ndindex(*x.shape):
        t = float(np.float32(float(x[i, j]) / float(scale[i])))
        q[i, j] = max(-127, min(127, round(t)))
    return q, scale


def test_rows_match_oracle():
    x = normal((17, 33), 0, 3.0)
    x[3] *= 1e-30
    x[5] *= 1e30
    q, s = quant.quantize_rows(x)
    q0, s0 = oracle_rows(x)
    assert q.dtype == np.int8 and s.dtype == np.float32
    assert np.array_equal(q, q0) and np.array_equal(bits(s), bits(s0))


def test_ties_round_half_to_even():
    x = np.array([[127, 0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, 126.5]], np.float32)
    q, s = quant.quantize_rows(x)
    assert s[0] == 1.0
    assert q.tolist() == [[127, 0, 2, 2, 4, 0, -2, -2, 126]]


def test_range_is_symmetric_and_saturates():
    x = normal((64, 100), 1, 50.0)
    q, s = quant.quantize_rows(x)
    assert q.min() >= -127 and q.max() <= 127
    assert np.array_equal(np.abs(q).max(axis=1), np.full(64, 127))
    # each value within half a step of its quantized value
    err = np.abs(q.astype(np.float64) * s[:, None] - x.astype(np.float64))
    assert np.all(err <= s[:, None].astype(np.float64) * (0.5 + 1e-6))


def test_zero_rows_and_subnormal_rows():
    tiny = np.finfo(np.float32).smallest_subnormal
    x = np.zeros((3, 4), np.float32)
    x[1] = [-1.0, 0.25, 0.0, 0.5]
    x[2] = np.float32(tiny) * np.array([1, 3, -63, 0], np.float32)
    with np.errstate(divide="raise", over="raise", invalid="raise"):
        q, s = quant.quantize_rows(x)
    assert s[0] == 1.0 and not q[0].any()
    assert q[1].tolist() == [-127, 32, 0, 64]
    assert q[2].tolist() == [1, 3, -63, 0] and s[2] == tiny
    q, s = quant.quantize_rows(np.zeros((3, 0), np.float32))
    assert q.shape == (3, 0) and s.tolist() == [1.0, 1.0, 1.0]


def test_cols_are_rows_of_the_transpose():
    x = normal((40, 24), 2)
    qc, sc = quant.quantize_cols(x)
    qr, sr = quant.quantize_rows(np.ascontiguousarray(x.T))
    assert np.array_equal(qc, qr.T) and np.array_equal(bits(sc), bits(sr))
    qc, sc = quant.quantize_cols_stochastic(x, KEY)
    assert qc.shape == x.shape and sc.shape == (24,)


def test_batched_equals_per_matrix():
    x = normal((3, 5, 7), 3)
    q, s = quant.quantize_rows(x)
    qc, sc = quant.quantize_cols(x)
    assert q.shape == x.shape and s.shape == (3, 5) and sc.shape == (3, 7)
    for g in range(3):
        q1, s1 = quant.quantize_rows(x[g])
        assert np.array_equal(q[g], q1) and np.array_equal(bits(s[g]), bits(s1))
        q1, s1 = quant.quantize_cols(x[g])
        assert np.array_equal(qc[g], q1) and np.array_equal(bits(sc[g]), bits(s1))


def test_same_input_same_bits():
    x = normal((50, 70), 4)
    for f in (quant.quantize_rows, quant.quantize_cols):
        (q1, s1), (q2, s2) = f(x), f(x.copy())
        assert np.array_equal(q1, q2) and np.array_equal(bits(s1), bits(s2))


def test_stochastic_is_deterministic_by_key():
    x = normal((30, 40), 5)
    q1, s1 = quant.quantize_rows_stochastic(x, KEY)
    q2, s2 = quant.quantize_rows_stochastic(x.copy(), KEY)
    q3, _ = quant.quantize_rows_stochastic(x, KEY[:-1] + (2,))
    assert np.array_equal(q1, q2) and np.array_equal(bits(s1), bits(s2))
    assert not np.array_equal(q1, q3)
    # shares the deterministic scale; each value goes to floor or ceil of x / s
    _, s0 = quant.quantize_rows(x)
    assert np.array_equal(bits(s1), bits(s0))
    t = x / s1[:, None]
    assert np.all((q1 == np.floor(t)) | (q1 == np.ceil(t)))


def test_stochastic_is_unbiased():
    n = 200_000
    x = np.full((1, n), 0.3, np.float32)
    x[0, 0] = 127.0  # pins the scale to 1.0
    q, s = quant.quantize_rows_stochastic(x, KEY)
    assert s[0] == 1.0 and set(np.unique(q[0, 1:]).tolist()) == {0, 1}
    mean = q[0, 1:].astype(np.float64).mean()
    sigma = np.sqrt(0.3 * 0.7 / (n - 1))
    assert abs(mean - 0.3) < 5 * sigma
    qc, _ = quant.quantize_cols_stochastic(np.ascontiguousarray(x.T), KEY)
    assert abs(qc[1:, 0].astype(np.float64).mean() - 0.3) < 5 * sigma


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize(
    "f",
    [
        quant.quantize_rows,
        quant.quantize_cols,
        lambda x: quant.quantize_rows_stochastic(x, KEY),
        lambda x: quant.quantize_cols_stochastic(x, KEY),
    ],
)
def test_non_finite_refused_and_input_unchanged(f, bad):
    x = normal((4, 6), 6)
    x[1, 2] = bad
    x[3, 0] = bad
    before = x.copy()
    with pytest.raises(NonFiniteError, match="2 of 24 values"):
        f(x)
    assert np.array_equal(bits(x), bits(before))


def test_wrong_dtype_or_rank_refused():
    with pytest.raises(ShapeError, match="float32"):
        quant.quantize_rows(np.ones((2, 2), np.float64))
    with pytest.raises(ShapeError, match="2 dims"):
        quant.quantize_cols(np.ones(4, np.float32))


def test_input_is_never_modified():
    x = normal((8, 9), 7)
    before = x.copy()
    quant.quantize_rows(x)
    quant.quantize_cols_stochastic(x, KEY)
    assert np.array_equal(bits(x), bits(before))


def test_epilogue_pinned_order():
    rs = np.random.default_rng(8)
    acc = rs.integers(-(2**30), 2**30, (6, 5)).astype(np.int32)
    sa = normal((6,), 9)
    sb = normal((5,), 10)
    y = quant.epilogue(acc, sa, sb)
    want = np.empty((6, 5), np.float32)
    for i, j in np.ndindex(6, 5):
        want[i, j] = (np.float32(acc[i, j]) * sa[i]) * sb[j]
    assert y.dtype == np.float32 and np.array_equal(bits(y), bits(want))
    yb = quant.epilogue(np.stack([acc, -acc]), np.stack([sa, sa]), np.stack([sb, sb]))
    assert np.array_equal(bits(yb[0]), bits(want)) and np.array_equal(yb[1], -want)


def test_epilogue_refuses_bad_operands():
    acc = np.zeros((3, 4), np.int32)
    sa, sb = np.ones(3, np.float32), np.ones(4, np.float32)
    with pytest.raises(ShapeError, match="int32"):
        quant.epilogue(acc.astype(np.int64), sa, sb)
    with pytest.raises(ShapeError, match="sb"):
        quant.epilogue(acc, sa, np.ones(3, np.float32))
    with pytest.raises(NonFiniteError):
        quant.epilogue(acc, np.array([1, np.nan, 1], np.float32), sb)


def test_round_trip_through_gemm_scales():
    # q_a @ q_b rescaled by the epilogue approximates the float product
    a, b = normal((16, 64), 11), normal((64, 12), 12)
    qa, sa = quant.quantize_rows(a)
    qb, sb = quant.quantize_cols(b)
    acc = (qa.astype(np.int64) @ qb.astype(np.int64)).astype(np.int32)
    y = quant.epilogue(acc, sa, sb).astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 0.02
