"""fastmath's stated bounds, measured against detmath's fdlibm kernels (< 1 ulp in float64,
themselves checked against exact oracles in test_detmath.py), and its special values."""

from __future__ import annotations

import numpy as np
import pytest

from pynode.core import detmath, fastmath
from pynode.core.errors import ShapeError

F32 = np.float32


def _draws(seed: int) -> np.ndarray:
    g = np.random.default_rng(seed)
    return np.concatenate([
        g.standard_normal(200_000) * 3, g.uniform(-14, 14, 200_000),
        np.linspace(-1, -0.5, 100_001), g.standard_normal(20_000) * 1e-20,
    ]).astype(F32)


def _ulps(got: np.ndarray, want64: np.ndarray) -> np.ndarray:
    spacing = np.spacing(np.abs(want64.astype(F32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - want64) / spacing


def test_gelu_within_one_ulp_for_normal_results():
    x = _draws(1)
    y, _ = fastmath.gelu_with_grad(x)
    want = detmath._gelu64(x.astype(np.float64))
    normal = np.abs(want) >= 2.0**-126
    assert _ulps(y, want)[normal].max() <= 1.0
    assert np.abs(y[~normal].astype(np.float64) - want[~normal]).max() <= 2.0**-149


def test_gelu_gradient_within_one_ulp_plus_2_to_minus_29():
    x = _draws(2)
    _, dy = fastmath.gelu_with_grad(x)
    want = detmath._gelu_grad64(x.astype(np.float64))
    err = np.abs(dy.astype(np.float64) - want)
    spacing = np.spacing(np.abs(want.astype(F32))).astype(np.float64)
    assert np.all(err <= spacing + 2.0**-29)
    # the absolute term is needed only near the zero of the gradient (x = -0.7518)
    far = np.abs(x + 0.7518) > 0.3
    assert _ulps(dy, want)[far & (np.abs(want) >= 2.0**-126)].max() <= 1.0


def test_gelu_specials_follow_the_limits():
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 40.0, -40.0], F32)
    y, dy = fastmath.gelu_with_grad(x)
    assert y[0] == np.inf and y[1] == 0 and np.signbit(y[1]) and np.isnan(y[2])
    assert dy[0] == 1 and dy[1] == 0 and np.isnan(dy[2])
    assert y.view(np.uint32)[2] == 0x7FC00000  # the canonical NaN
    assert y[3] == 0 and y[5] == 40 and y[6] == 0 and dy[5] == 1


def test_softmax_within_one_ulp():
    g = np.random.default_rng(3)
    x = (g.standard_normal((2048, 257)) * g.uniform(0.01, 40, (2048, 1))).astype(F32)
    p = fastmath.softmax_rows(x)
    want = detmath._softmax_rows(x.astype(np.float64))
    normal = want >= 2.0**-126
    assert _ulps(p, want)[normal].max() <= 1.0
    assert np.abs(p[~normal] - want[~normal]).max() <= 2.0**-149


def test_log_softmax_parts_match_softmax_and_bound_logsumexp():
    g = np.random.default_rng(4)
    x = (g.standard_normal((2048, 256)) * g.uniform(0.01, 40, (2048, 1))).astype(F32)
    probs, lse = fastmath.log_softmax_parts(x)
    assert np.array_equal(probs, fastmath.softmax_rows(x))
    want = detmath._logsumexp_rows(x.astype(np.float64))[:, 0]
    err = np.abs(lse.astype(np.float64) - want)
    assert np.all(err <= np.spacing(np.abs(want.astype(F32))) + 2.0**-50)


def test_logsumexp_near_a_zero_result_needs_and_keeps_the_absolute_term():
    """lse = log(1 + tiny): against mpmath, the error is ~2**-53 absolute, millions of ulps
    of the result, so the bound is 1 ulp + 2**-50 and no ulp bound alone could hold."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    g = np.random.default_rng(6)
    x = np.full((200, 16), F32(-30))
    x[:, 1:] = -g.uniform(30, 40, (200, 15)).astype(F32)  # lse of rows with max 0: ~1e-14
    x[:, 0] = g.choice(np.array([0.0, -1e-3, 1e-5, -1e-30], F32), 200)
    _, lse = fastmath.log_softmax_parts(x)
    worst_ulps = 0.0
    for row, got in zip(x, lse, strict=True):
        exact = mpmath.log(mpmath.fsum(mpmath.exp(mpmath.mpf(float(v))) for v in row))
        err = abs(float(got) - float(exact))
        ulp = float(np.spacing(np.abs(F32(float(exact)))))
        assert err <= ulp + 2.0**-50
        worst_ulps = max(worst_ulps, err / ulp)
    assert worst_ulps > 1e3  # the absolute term is really needed


def test_causal_mask_keeps_later_keys_out():
    g = np.random.default_rng(5)
    s = g.standard_normal((3, 9, 9)).astype(F32)
    mask = np.tri(9, dtype=bool)
    p = fastmath.softmax_rows(s, mask)
    assert np.all(p[:, ~mask] == 0)
    changed = s.copy()
    changed[:, :, 6:] = 1e4  # later keys, huge: rows 0..5 must not move a bit
    assert np.array_equal(fastmath.softmax_rows(changed, mask)[:, :6], p[:, :6])


def test_softmax_rows_with_inf_or_nan_give_nan():
    p = fastmath.softmax_rows(np.array([[0.0, np.inf, 1.0], [0.0, np.nan, 1.0]], F32))
    assert np.isnan(p).all()
    p = fastmath.softmax_rows(np.array([[0.0, -np.inf, 1.0]], F32))
    assert p[0, 1] == 0 and np.isfinite(p).all()


@pytest.mark.parametrize("bad", [np.zeros(3, np.float64), [1.0, 2.0], np.zeros((2, 0), F32)])
def test_bad_inputs_are_refused_by_name(bad):
    with pytest.raises(ShapeError):
        fastmath.softmax_rows(bad)
    if not (isinstance(bad, np.ndarray) and bad.dtype == F32):
        with pytest.raises(ShapeError):
            fastmath.gelu_with_grad(bad)
