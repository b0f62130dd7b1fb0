"""The training step's hot transcendentals: GELU with its gradient, and the softmaxes.

Same rules as detmath (IEEE basic operations, each its own numpy call, so the same bits
on every platform), but built for speed rather than correct rounding (DESIGN section 2):
each kernel evaluates in float64 with lean polynomials, on chunks small enough that its
temporaries stay in cache, and rounds once to float32. Measured and tested bounds
(tests/core/test_fastmath.py, against detmath's fdlibm kernels and mpmath):

    gelu_with_grad   gelu within 1 ulp; the gradient within 1 ulp + 2**-30 absolute
                     (it crosses zero near x = -0.75, where no relative bound holds)
    softmax_rows     within 1 ulp + 2**-149 absolute (results below 2**-126 lose bits)
    log_softmax_parts  probabilities as softmax_rows; logsumexp within 1 ulp + 2**-50
                       absolute (no ulp bound holds near a zero result: rounding the
                       float64 sum 1 + tiny costs ~2**-53 absolute, millions of ulps)

detmath's correctly rounded functions stay the oracles. Inputs are float32 arrays;
NaN in gives the canonical NaN out; +-inf follow the limits (gelu(-inf) = -0.0).

Legend: (n,) flattened elements, (r, n) rows of a softmax; f64 float64.
"""

from __future__ import annotations

import math

import numpy as np

from . import detmath
from .errors import ShapeError

_CHUNK = 16384  # f64 elements a kernel works on at once: 128 KB a temporary, in L2 (measured best)
_LN2_HI = 6.93147180369123816490e-01  # 21 trailing zero bits: k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
_EXP_FLOOR = -110.0  # exp below e**-110 is < 2**-158: zero once rounded to float32
# exp(r) on |r| <= ln2 / 2 by its Taylor series to r**8 / 8!: relative error < 2e-10.
_EXP_TAYLOR = tuple(1.0 / math.factorial(i) for i in range(9))
# erfcx(b) = exp(b*b) erfc(b) for b >= 0 as a polynomial in u = t - _ERFCX_T0, where
# t = 1 / (1 + _ERFCX_P b) runs over (0, 1]: relative error < 6e-9 on b in [0, 14]
# (fitted with mpmath by benchmarks/fit_erfcx.py; beyond 14 every result is 0 in float32).
_ERFCX_P = 0.4
_ERFCX_T0 = 0.5757575757575757
_ERFCX = (0.27336487884048205, 0.9143783942422475, 1.2566485830126335, 1.1995715805774807,
          0.6710284967800975, 0.039083649605887526, -0.2164488676838597,
          -0.06489697154639869, 0.08704013753596564, 0.027821544842338747,
          -0.032855826106540253)
_SQRT1_2 = 0.70710678118654752440
_INV_SQRT_2PI = 0.39894228040143267794


def _horner(z: np.ndarray, coeffs: tuple[float, ...]) -> np.ndarray:
    """c0 + z*(c1 + z*(...)), innermost first, one rounding per operation, in place."""
    acc = z * coeffs[-1]
    acc += coeffs[-2]
    for c in coeffs[-3::-1]:
        acc *= z
        acc += c
    return acc


def _exp_neg(y: np.ndarray) -> np.ndarray:
    """e**y for finite f64 y <= 0 (or NaN), y below -110 taken as -110. (c,) f64."""
    y = np.maximum(y, _EXP_FLOOR)  # NaN stays NaN
    k = np.rint(y * _INV_LN2)
    r = y - k * _LN2_HI  # exact (Sterbenz)
    r -= k * _LN2_LO
    with np.errstate(invalid="ignore"):  # NaN -> int64 is garbage, and NaN times it is NaN
        scale = ((k.astype(np.int64) + 1023) << 52).view(np.float64)  # 2**k, k >= -159
    return _horner(r, _EXP_TAYLOR) * scale


def _float32_input(x: np.ndarray, name: str) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        got = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise ShapeError(f"fastmath.{name} takes a float32 array, got {got}")
    return np.ascontiguousarray(x)


def _canonical_nan(y: np.ndarray) -> np.ndarray:
    bad = np.isnan(y)
    if bad.any():
        y.view(np.uint32)[bad] = 0x7FC00000
    return y


# ---------------------------------------------------------------- GELU


def _gelu_chunk(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gelu(x), gelu'(x)) of finite f64 x, (c,) each, from one exp and one erfcx."""
    half_sq = x * x
    half_sq *= -0.5  # -x*x/2, exact: x came from float32
    e = _exp_neg(half_sq)  # exp(-x*x/2)
    b = np.abs(x)
    b *= _SQRT1_2
    t = b * _ERFCX_P
    t += 1.0
    np.divide(1.0, t, out=t)
    t -= _ERFCX_T0
    tail = _horner(t, _ERFCX)  # erfcx(|x| / sqrt 2)
    tail *= e
    tail *= 0.5  # Phi(-|x|) = erfc(|x| / sqrt 2) / 2
    cdf = np.where(x > 0.0, 1.0 - tail, tail)  # Phi(x)
    e *= _INV_SQRT_2PI  # the normal density
    e *= x
    e += cdf  # Phi(x) + x phi(x)
    cdf *= x
    return cdf, e


def gelu_with_grad(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact (erf) GELU of float32 x and its derivative, both float32 of x's shape.

    One pass computes both (they share exp(-x*x/2) and Phi(x)), so the backward of a
    GELU layer is a single product with the cached gradient.
    """
    a = _float32_input(x, "gelu_with_grad")
    flat = a.reshape(-1)  # (n,) f32
    finite = bool(np.isfinite(flat).all())
    src = flat if finite else np.where(np.isfinite(flat), flat, np.float32(0))
    y, dy = np.empty_like(flat), np.empty_like(flat)
    for lo in range(0, flat.size, _CHUNK):
        g, d = _gelu_chunk(src[lo : lo + _CHUNK].astype(np.float64))
        y[lo : lo + _CHUNK] = g  # the one rounding to float32
        dy[lo : lo + _CHUNK] = d
    if not finite:
        y = np.where(flat == np.inf, flat, np.where(flat == -np.inf, np.float32(-0.0), y))
        dy = np.where(flat == np.inf, np.float32(1), np.where(flat == -np.inf, np.float32(0), dy))
        y, dy = np.where(np.isnan(flat), flat, y), np.where(np.isnan(flat), flat, dy)
    return _canonical_nan(y).reshape(a.shape), _canonical_nan(dy).reshape(a.shape)


# ---------------------------------------------------------------- softmax


def _rows_of(x: np.ndarray, name: str) -> np.ndarray:
    a = _float32_input(x, name)
    if a.ndim < 1 or a.shape[-1] == 0:
        raise ShapeError(f"fastmath.{name} needs a non-empty last axis, got shape {a.shape}")
    return a.reshape(-1, a.shape[-1])  # (r, n) f32


def _exp_shifted(rows: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """e = exp(x - max) over each row's unmasked entries (masked: exactly 0), and the
    pinned row sums of e. rows (r, n) f32 -> (r, n) f64, (r, 1) f64."""
    with np.errstate(invalid="ignore"):  # inf - inf: a row holding +inf gives NaN
        if mask is None:
            top = np.max(rows, axis=-1, keepdims=True)  # (r, 1) f32; a NaN propagates
            z = rows.astype(np.float64) - top
        else:
            top = np.max(np.where(mask, rows, np.float32(-np.inf)), axis=-1, keepdims=True)
            z = np.where(mask, rows.astype(np.float64) - top, 0.0)
        e = _exp_neg(z)
    if mask is not None:
        e = np.where(mask, e, 0.0)
    return e, detmath.psum(e, -1, keepdims=True)


def softmax_rows(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Softmax of float32 x over its last axis -> float32 of x's shape.

    mask (n, n) bool, optional, for x (..., n, n): entries where it is False are left out
    (exactly 0 in the result) and never enter a reduction with a value of their own, so
    with a causal mask the weights of query t do not depend on later keys.
    """
    rows = _rows_of(x, "softmax_rows")
    n = rows.shape[1]
    out = np.empty(rows.shape, np.float32)
    step = max(1, _CHUNK // n)
    if mask is not None:
        mask = np.broadcast_to(mask, x.shape).reshape(-1, n)
    for lo in range(0, rows.shape[0], step):
        part = None if mask is None else mask[lo : lo + step]
        e, total = _exp_shifted(rows[lo : lo + step], part)
        out[lo : lo + step] = e / total
    return _canonical_nan(out).reshape(x.shape)


def log_softmax_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(softmax, logsumexp) of float32 x (r, n) over its last axis: (r, n), (r,) float32.

    One exp pass serves the loss (logsumexp) and its gradient (the probabilities).
    """
    rows = _rows_of(x, "log_softmax_parts")
    n = rows.shape[1]
    probs = np.empty(rows.shape, np.float32)
    lse = np.empty(rows.shape[0], np.float64)
    step = max(1, _CHUNK // n)
    for lo in range(0, rows.shape[0], step):
        chunk = rows[lo : lo + step]
        e, total = _exp_shifted(chunk, None)
        probs[lo : lo + step] = e / total
        lse[lo : lo + step] = detmath.log(total[:, 0]) + np.max(chunk, axis=-1)
    with np.errstate(invalid="ignore"):
        return _canonical_nan(probs).reshape(x.shape), _canonical_nan(lse.astype(np.float32))
