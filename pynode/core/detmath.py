"""Transcendentals and float reductions that give the same bits on every platform.

numpy's exp/log/tanh and its float sums change with the CPU, the SIMD width and the
version, so a peer computes them here from operations IEEE-754 rounds correctly
everywhere: + - * / sqrt, floor, rint, casts, comparisons and bit manipulation, each
its own numpy call, so no fused multiply-add can form (DESIGN section 2).

Inputs are float32 or float64 and keep their dtype. Every function evaluates in
float64 and rounds once at the end, so float32 results are within 1 ulp (almost
always correctly rounded). exp, expm1, log, erf, erfc and tanh follow Sun's fdlibm
(freely distributable), whose float64 error is below 1 ulp. NaN outputs are the one
canonical quiet NaN, because wasm may set NaN payload bits freely. Measured error
bounds: docs/VERIFICATION.md.

Legend: (...) any shape, (n,) flattened; f64 float64; "dtype" the caller's dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike

from .errors import DaisyError, ShapeError

_M32 = np.uint64(0xFFFFFFFF)
_QNAN_BITS = {np.dtype(np.float32): (np.uint32, 0x7FC00000),
              np.dtype(np.float64): (np.uint64, 0x7FF8000000000000)}
_TINY = 2.2250738585072014e-308  # smallest normal float64
_LN2_HI = 6.93147180369123816490e-01  # 21 trailing zero bits: k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
_EXP_HI = 7.09782712893383973096e02  # above: exp overflows
_EXP_LO = -7.45133219101941108420e02  # below: exp underflows to 0
_EXP_P = (1.66666666666666019037e-01, -2.77777777770155933842e-03, 6.61375632143793436117e-05,
          -1.65339022054652515390e-06, 4.13813679705723846039e-08)
_EXPM1_Q = (-3.33333333333331316428e-02, 1.58730158725481460165e-03,
            -7.93650757867487942473e-05, 4.00821782732936239552e-06,
            -2.01099218183624371326e-07)
_LG_ODD = (6.666666666666735130e-01, 2.857142874366239149e-01, 1.818357216161805012e-01,
           1.479819860511658591e-01)  # Lg1, Lg3, Lg5, Lg7
_LG_EVEN = (3.999999999940941908e-01, 2.222219843214978396e-01, 1.531383769920937332e-01)
_ERX = 8.45062911510467529297e-01
_EFX8 = 1.02703333676410069053e00
_ERF_PP = (1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
           -5.77027029648944159157e-03, -2.37630166566501626084e-05)
_ERF_QQ = (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02,
           5.08130628187576562776e-03, 1.32494738004321644526e-04, -3.96022827877536812320e-06)
_ERF_PA = (-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
           3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02,
           -2.16637559486879084300e-03)
_ERF_QA = (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01,
           7.18286544141962662868e-02, 1.26171219808761642112e-01, 1.36370839120290507362e-02,
           1.19844998467991074170e-02)
_ERFC_RA = (-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e01,
            -6.23753324503260060396e01, -1.62396669462573470355e02, -1.84605092906711035994e02,
            -8.12874355063065934246e01, -9.81432934416914548592e00)
_ERFC_SA = (1.0, 1.96512716674392571292e01, 1.37657754143519042600e02, 4.34565877475229228821e02,
            6.45387271733267880336e02, 4.29008140027567833386e02, 1.08635005541779435134e02,
            6.57024977031928170135e00, -6.04244152148580987438e-02)
_ERFC_RB = (-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e01,
            -1.60636384855821916062e02, -6.37566443368389627722e02, -1.02509513161107724954e03,
            -4.83519191608651397019e02)
_ERFC_SB = (1.0, 3.03380607434824582924e01, 3.25792512996573918826e02, 1.53672958608443695994e03,
            3.19985821950859553908e03, 2.55305040643316442583e03, 4.74528541206955367215e02,
            -2.24409524465858183362e01)
# Taylor coefficients of sin(pi r), cos(pi r) in r; |r| <= 1/4 keeps the tail below 1e-19.
_SINPI = (3.141592653589793, -5.16771278004997, 2.5501640398773455, -0.5992645293207921,
          0.08214588661112823, -0.0073704309457143504, 0.00046630280576761255,
          -2.1915353447830217e-05, 7.952054001475513e-07)
_COSPI = (1.0, -4.934802200544679, 4.0587121264167685, -1.3352627688545895, 0.2353306303588932,
          -0.02580689139001406, 0.0019295743094039231, -0.0001046381049248457,
          4.303069587032947e-06, -1.3878952462213771e-07)
_SQRT1_2 = 0.7071067811865476
_CHUNK = 16384  # elements per kernel pass; whole-array float64 temporaries spill the cache
_INV_SQRT_2PI = 0.3989422804014327


class FloatEnvironmentError(DaisyError):
    """The CPU flushes subnormals or does not round to nearest-even; results would fork."""


def _horner(z: np.ndarray, coeffs: tuple[float, ...]) -> np.ndarray:
    """c0 + z*(c1 + z*(c2 + ...)), innermost first, one rounding per operation."""
    acc = np.full_like(z, coeffs[-1])
    for c in coeffs[-2::-1]:
        acc = c + z * acc
    return acc


def _pow2(k: np.ndarray) -> np.ndarray:
    """2**k for integer-valued f64 k in [-1022, 1023], built from the exponent bits."""
    return ((k.astype(np.int64) + 1023) << 52).view(np.float64)


def _scale(y: np.ndarray, k: np.ndarray) -> np.ndarray:
    """y * 2**k for k in [-1080, 1024] with a single rounding (y near 1)."""
    k1 = np.floor(k * 0.5)
    return (y * _pow2(k1)) * _pow2(k - k1)  # first product is exact: it stays normal


def _float_array(x: ArrayLike, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != np.float32 and a.dtype != np.float64:
        raise ShapeError(f"detmath.{name} takes float32 or float64, got {a.dtype}; cast first")
    return a


def _canonical_nan(y: np.ndarray) -> np.ndarray:
    bad = np.isnan(y)
    if bad.any():
        uint, bits = _QNAN_BITS[y.dtype]
        y.view(uint)[bad] = bits
    return y


def _apply(kernel: Callable[[np.ndarray], np.ndarray], x: ArrayLike, name: str) -> np.ndarray:
    """Run a float64 kernel, (c,) -> (..., c), over x in chunks; round once to x's dtype.

    Chunks keep a kernel's many float64 temporaries in cache (2-4x faster than one pass);
    every kernel is elementwise, so chunking cannot change a bit.
    """
    a = _float_array(x, name)
    flat = a.reshape(-1)  # (n,) dtype
    out = None
    with np.errstate(all="ignore"):
        for start in range(0, max(flat.size, 1), _CHUNK):
            y = kernel(flat[start : start + _CHUNK].astype(np.float64))  # (..., c) f64
            if out is None:
                out = np.empty(y.shape[:-1] + flat.shape, a.dtype)
            out[..., start : start + _CHUNK] = y  # the one rounding to dtype
    return _canonical_nan(out.reshape(out.shape[:-1] + a.shape))


def _exp64(x: np.ndarray) -> np.ndarray:
    xs = np.where((x >= _EXP_LO) & (x <= _EXP_HI), x, 0.0)  # (n,) f64, specials patched below
    k = np.rint(xs * _INV_LN2)
    hi = xs - k * _LN2_HI  # exact (Sterbenz)
    lo = k * _LN2_LO
    r = hi - lo  # |r| <= ln2/2
    t = r * r
    c = r - t * _horner(t, _EXP_P)
    y = _scale(1.0 - ((lo - (r * c) / (2.0 - c)) - hi), k)
    y = np.where(x > _EXP_HI, np.inf, np.where(x < _EXP_LO, 0.0, y))
    return np.where(np.isnan(x), np.nan, y)


def _expm1_64(x: np.ndarray) -> np.ndarray:
    xs = np.where(np.abs(x) <= _EXP_HI, x, 0.0)  # (n,) f64
    k = np.rint(xs * _INV_LN2)
    hi = xs - k * _LN2_HI
    lo = k * _LN2_LO
    r = hi - lo
    c = (hi - r) - lo  # what the rounding of r lost
    hfx = 0.5 * r
    hxs = r * hfx
    r1 = 1.0 + hxs * _horner(hxs, _EXPM1_Q)
    t = 3.0 - r1 * hfx
    e = hxs * ((r1 - t) / (6.0 - r * t))
    y_k0 = r - (r * e - hxs)
    e = (r * (e - c) - c) - hxs
    y_km1 = 0.5 * (r - e) - 0.5
    y_k1 = np.where(r < -0.25, -2.0 * (e - (r + 0.5)), 1.0 + 2.0 * (r - e))
    two_mk = _pow2(-np.clip(k, -60.0, 60.0))  # 2**-k where 2 <= k <= 56 uses it
    y_far = _scale(1.0 - (e - r), k) - 1.0
    y_mid = _scale((1.0 - two_mk) - (e - r), k)
    y_big = _scale((r - (e + two_mk)) + 1.0, k)
    y = np.where((k <= -2) | (k > 56), y_far, np.where(k < 20, y_mid, y_big))
    y = np.where(k == 1, y_k1, np.where(k == -1, y_km1, np.where(k == 0, y_k0, y)))
    y = np.where(x > _EXP_HI, np.inf, np.where(x < -_EXP_HI, -1.0, y))
    return np.where((x == 0.0) | np.isnan(x), x, y)  # keeps the sign of zero


def _log64(x: np.ndarray) -> np.ndarray:
    xs = np.where((x > 0.0) & (x < np.inf), x, 1.0)  # (n,) f64
    sub = xs < _TINY
    xs = np.where(sub, xs * 18014398509481984.0, xs)  # subnormals: scale by 2**54
    bits = xs.view(np.uint64)
    hx = (bits >> np.uint64(32)).astype(np.int64)
    k = (hx >> 20) - 1023 - np.where(sub, 54, 0)
    hx &= 0xFFFFF
    i = (hx + 0x95F64) & 0x100000  # picks x or x/2 so that 1+f lies in [sqrt(2)/2, sqrt(2))
    k += i >> 20
    high = (hx | (i ^ 0x3FF00000)).astype(np.uint64) << np.uint64(32)
    f = (high | (bits & _M32)).view(np.float64) - 1.0
    dk = k.astype(np.float64)
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    big_r = z * _horner(w, _LG_ODD) + w * _horner(w, _LG_EVEN)
    hfsq = 0.5 * f * f
    y_far = dk * _LN2_HI - ((hfsq - (s * (hfsq + big_r) + dk * _LN2_LO)) - f)
    y_near = dk * _LN2_HI - ((s * (f - big_r) - dk * _LN2_LO) - f)
    y = np.where(((hx - 0x6147A) | (0x6B851 - hx)) > 0, y_far, y_near)
    y = np.where(x == 0.0, -np.inf, np.where(x < 0.0, np.nan, y))
    return np.where(x == np.inf, np.inf, np.where(np.isnan(x), np.nan, y))


def _erf_small_ratio(x: np.ndarray) -> np.ndarray:
    """(erf(x) - x) / x for |x| < 0.84375, a rational function of x^2."""
    z = x * x
    return _horner(z, _ERF_PP) / _horner(z, _ERF_QQ)


def _erf_mid(ax: np.ndarray) -> np.ndarray:
    """erf(|x|) - erx for |x| in [0.84375, 1.25), a rational function of |x| - 1."""
    s = ax - 1.0
    return _horner(s, _ERF_PA) / _horner(s, _ERF_QA)


def _erfc_tail(ax: np.ndarray) -> np.ndarray:
    """erfc(|x|) for |x| in [1.25, 28): exp(-x^2 - 0.5625 + R/S) / |x|."""
    s = 1.0 / (ax * ax)
    near = ax < 1.0 / 0.35
    big_r = np.where(near, _horner(s, _ERFC_RA), _horner(s, _ERFC_RB))
    big_s = np.where(near, _horner(s, _ERFC_SA), _horner(s, _ERFC_SB))
    z = (ax.view(np.uint64) & ~_M32).view(np.float64)  # z*z is exact
    return _exp64(-z * z - 0.5625) * _exp64((z - ax) * (z + ax) + big_r / big_s) / ax


def _erf64(x: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    y = np.copysign(np.ones_like(x), x)  # |x| >= 6 rounds to +-1
    small, mid, tail = ax < 0.84375, (ax >= 0.84375) & (ax < 1.25), (ax >= 1.25) & (ax < 6.0)
    xs = x[small]
    y[small] = np.where(ax[small] < _TINY, 0.125 * (8.0 * xs + _EFX8 * xs),  # avoids underflow
                        xs + xs * _erf_small_ratio(xs))
    y[mid] = np.copysign(_ERX + _erf_mid(ax[mid]), x[mid])
    y[tail] = np.copysign(1.0 - _erfc_tail(ax[tail]), x[tail])
    return np.where(np.isnan(x), np.nan, y)


def _erfc64(x: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    y = np.where(x < 0.0, 2.0, 0.0)  # |x| >= 28
    small, mid, tail = ax < 0.84375, (ax >= 0.84375) & (ax < 1.25), (ax >= 1.25) & (ax < 28.0)
    xs = x[small]
    xy = xs * _erf_small_ratio(xs)
    y[small] = np.where(xs < 0.25, 1.0 - (xs + xy), 0.5 - (xy + (xs - 0.5)))
    pq = _erf_mid(ax[mid])
    y[mid] = np.where(x[mid] > 0.0, (1.0 - _ERX) - pq, 1.0 + (_ERX + pq))
    t = _erfc_tail(ax[tail])
    y[tail] = np.where(x[tail] > 0.0, t, 2.0 - t)
    return np.where(np.isnan(x), np.nan, y)


def _tanh64(x: np.ndarray) -> np.ndarray:
    ax = np.abs(x)
    big = ax >= 1.0
    t = _expm1_64(np.where(big, 2.0 * ax, -2.0 * ax))
    z = np.where(big, 1.0 - 2.0 / (t + 2.0), -t / (t + 2.0))
    z = np.where(ax >= 22.0, 1.0, z)
    return np.where(np.isnan(x), np.nan, np.copysign(z, x))


def _gelu64(x: np.ndarray) -> np.ndarray:
    # erfc(-x/sqrt2) is 1 + erf(x/sqrt2) without the cancellation for negative x.
    y = (0.5 * x) * _erfc64(x * -_SQRT1_2)
    return np.where(x == -np.inf, -0.0, y)


def _gelu_grad64(x: np.ndarray) -> np.ndarray:
    cdf = 0.5 * _erfc64(x * -_SQRT1_2)
    pdf = _exp64(-0.5 * x * x) * _INV_SQRT_2PI
    y = cdf + x * pdf
    return np.where(x == np.inf, 1.0, np.where(x == -np.inf, 0.0, y))


def _sincospi64(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sin(pi x), cos(pi x)); the reduction x = r + n/2 is exact for every float."""
    xs = np.where(np.abs(x) < 2.0**53, x, 0.0)  # larger floats are even integers
    n = np.rint(2.0 * xs)
    r = xs - 0.5 * n  # (n,) f64, |r| <= 1/4
    q = n - 4.0 * np.floor(n * 0.25)  # quadrant 0..3
    z = r * r
    s = r * _horner(z, _SINPI)
    c = _horner(z, _COSPI)
    sin = np.where(q == 0, s, np.where(q == 1, c, np.where(q == 2, -s, -c)))
    cos = np.where(q == 0, c, np.where(q == 1, -s, np.where(q == 2, -c, s)))
    bad = ~np.isfinite(x)
    sin = np.where(sin == 0.0, x * 0.0, sin)  # IEEE sinPi: exact zeros take the sign of x
    return np.where(bad, np.nan, sin), np.where(bad, np.nan, cos + 0.0)  # cosPi zeros are +0


def exp(x: ArrayLike) -> np.ndarray:
    """e**x; float32 within 1 ulp, float64 below 1 ulp (fdlibm)."""
    return _apply(_exp64, x, "exp")


def expm1(x: ArrayLike) -> np.ndarray:
    """e**x - 1, accurate for tiny x."""
    return _apply(_expm1_64, x, "expm1")


def log(x: ArrayLike) -> np.ndarray:
    """Natural log; log(0) = -inf, log(negative) = nan."""
    return _apply(_log64, x, "log")


def tanh(x: ArrayLike) -> np.ndarray:
    """Hyperbolic tangent."""
    return _apply(_tanh64, x, "tanh")


def erf(x: ArrayLike) -> np.ndarray:
    """Error function."""
    return _apply(_erf64, x, "erf")


def erfc(x: ArrayLike) -> np.ndarray:
    """1 - erf(x) without cancellation: relative accuracy down to the subnormal range."""
    return _apply(_erfc64, x, "erfc")


def gelu(x: ArrayLike) -> np.ndarray:
    """Exact GELU, x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))."""
    return _apply(_gelu64, x, "gelu")


def gelu_grad(x: ArrayLike) -> np.ndarray:
    """d gelu / dx = Phi(x) + x * phi(x)."""
    return _apply(_gelu_grad64, x, "gelu_grad")


def sinpi(x: ArrayLike) -> np.ndarray:
    """sin(pi * x) with an exact argument reduction."""
    return _apply(lambda v: _sincospi64(v)[0], x, "sinpi")


def cospi(x: ArrayLike) -> np.ndarray:
    """cos(pi * x) with an exact argument reduction."""
    return _apply(lambda v: _sincospi64(v)[1], x, "cospi")


def sincospi(x: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(sinpi(x), cospi(x)) from one reduction."""
    pair = _apply(lambda v: np.stack(_sincospi64(v)), x, "sincospi")  # (2, ...) dtype
    return pair[0], pair[1]


def sqrt(x: ArrayLike) -> np.ndarray:
    """Square root (IEEE correctly rounded in every dtype); sqrt(negative) = nan."""
    a = _float_array(x, "sqrt")
    with np.errstate(all="ignore"):
        return _canonical_nan(np.array(np.sqrt(a), dtype=a.dtype))


def rsqrt(x: ArrayLike) -> np.ndarray:
    """1 / sqrt(x); rsqrt(+-0) = +-inf, rsqrt(inf) = 0, rsqrt(negative) = nan."""
    return _apply(lambda v: 1.0 / np.sqrt(v), x, "rsqrt")


def _axis_of(a: np.ndarray, axis: int, name: str) -> int:
    if not isinstance(axis, (int, np.integer)) or not -a.ndim <= axis < a.ndim:
        raise ShapeError(f"detmath.{name}: axis {axis!r} is invalid for shape {a.shape}")
    return int(axis) % a.ndim


def psum(x: ArrayLike, axis: int | None = -1, keepdims: bool = False) -> np.ndarray:
    """Sum along `axis` (None: all elements) by one fixed tree of elementwise adds.

    Each level adds element i to element i + ceil(n/2); when n is odd the middle element
    passes through. The tree depends on n alone, so the bits depend on neither numpy's
    version nor the SIMD width nor the memory layout. Sums in the input dtype; an empty
    axis sums to +0.
    """
    a = _float_array(x, "psum")
    if axis is None:
        a, ax = a.reshape(-1), 0
    else:
        ax = _axis_of(a, axis, "psum")
    terms = np.moveaxis(a, ax, 0)  # (n, ...) dtype
    n = terms.shape[0]
    with np.errstate(all="ignore"):
        if n == 0:
            total = np.zeros(terms.shape[1:], a.dtype)
        while n > 1:
            half = (n + 1) // 2
            if n % 2 == 0:
                terms = terms[:half] + terms[half:]
            else:
                nxt = terms[:half].copy()
                nxt[: n - half] += terms[half:]
                terms = nxt
            n = half
        if n == 1:
            total = np.array(terms[0], dtype=a.dtype)  # (...) dtype
    if keepdims:
        total = total.reshape((1,) * np.ndim(x)) if axis is None else np.expand_dims(total, ax)
    return _canonical_nan(total)


def pmax(x: ArrayLike, axis: int | None = -1, keepdims: bool = False) -> np.ndarray:
    """Maximum along `axis` (None: all elements); NaN propagates, +0 counts as above -0.

    A maximum is exact, but which zero or which NaN payload numpy returns varies with
    the SIMD path; both are pinned here.
    """
    a = _float_array(x, "pmax")
    if axis is not None:
        _axis_of(a, axis, "pmax")
    if a.size == 0 or (axis is not None and a.shape[axis] == 0):
        raise ShapeError(f"detmath.pmax of an empty axis (shape {a.shape})")
    top = np.array(np.max(a, axis=axis, keepdims=keepdims), dtype=a.dtype)
    zero = top == 0
    if zero.any():
        plus_zero = np.any((a == 0) & ~np.signbit(a), axis=axis, keepdims=keepdims)
        np.copyto(top, np.where(plus_zero, 0.0, -0.0), where=zero)
    return _canonical_nan(top)


def _over_rows(a: np.ndarray, axis: int, row_fn: Callable[[np.ndarray], np.ndarray],
               width: int | None) -> np.ndarray:
    """Apply row_fn, (r, n) f64 -> (r, width or n) f64, to the slices along `axis`, a few
    rows at a time so the float64 temporaries stay in cache; round once to a's dtype."""
    rows = np.moveaxis(a, axis, -1)  # (..., n) dtype
    flat = rows.reshape(-1, rows.shape[-1])  # (r, n) dtype
    out = np.empty((flat.shape[0], flat.shape[1] if width is None else width), a.dtype)
    step = max(1, _CHUNK // max(1, flat.shape[1]))
    with np.errstate(all="ignore"):
        for lo in range(0, flat.shape[0], step):
            out[lo : lo + step] = row_fn(flat[lo : lo + step].astype(np.float64))
    shaped = np.moveaxis(out.reshape(rows.shape[:-1] + out.shape[-1:]), -1, axis)
    return _canonical_nan(np.ascontiguousarray(shaped))


def _exp_shifted(x: np.ndarray, top: np.ndarray) -> np.ndarray:
    """exp(x - top), (r, n) f64, with the rounding error of x - top put back.

    Rounding d = x - top costs up to |d| / 2 ulps of d, which exp turns into |d| ulps of
    its result; TwoSum (Knuth) gives the exact error, x - top = d + err, and exp(d + err)
    = exp(d) (1 + err) to within err**2. Where the subtraction was exact (err == 0: float32
    inputs almost always) the result is exp(d) itself."""
    d = x - top
    back = d - x
    err = (x - (d - back)) - (top + back)  # (r, n) f64
    e = _exp64(d)
    fix = (err != 0) & np.isfinite(err)
    return np.where(fix, e + e * err, e)


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    e = _exp_shifted(x, pmax(x, -1, keepdims=True))  # (r, n) f64
    return e / psum(e, -1, keepdims=True)


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    top = pmax(x, -1, keepdims=True)  # (r, 1) f64
    shift = np.where(np.isfinite(top), top, 0.0)
    return _log64(psum(_exp_shifted(x, shift), -1, keepdims=True)) + shift


def softmax(x: ArrayLike, axis: int = -1) -> np.ndarray:
    """exp(x - max) / psum(exp(x - max)) along `axis`, evaluated in float64.

    A slice that is all -inf, or holds +inf or NaN, gives NaN (as torch does).
    """
    a = _float_array(x, "softmax")
    return _over_rows(a, _axis_of(a, axis, "softmax"), _softmax_rows, None)


def logsumexp(x: ArrayLike, axis: int = -1, keepdims: bool = False) -> np.ndarray:
    """log(psum(exp(x))) along `axis` without overflow, evaluated in float64.

    All -inf gives -inf; any +inf gives +inf; any NaN gives NaN.
    """
    a = _float_array(x, "logsumexp")
    ax = _axis_of(a, axis, "logsumexp")
    out = _over_rows(a, ax, _logsumexp_rows, 1)
    return out if keepdims else np.squeeze(out, axis=ax)


def check_float_environment() -> None:
    """Raise FloatEnvironmentError unless arithmetic rounds to nearest-even with subnormals.

    A native library built with fast-math can switch the CPU to flush-to-zero when it is
    loaded; every result here would then fork from other peers. Call at start-up.
    """
    with np.errstate(all="ignore"):
        for dt in (np.float32, np.float64):
            info = np.finfo(dt)
            tiny = np.full(4, info.smallest_normal, dt)
            half_tiny = tiny * dt(0.5)
            one = np.ones(4, dt)
            eps = dt(info.eps)
            checks = {
                "subnormal results (flush-to-zero)": bool(np.all(half_tiny > 0)),
                "subnormal operands (denormals-are-zero)": np.array_equal(half_tiny * dt(2), tiny),
                "round to nearest": bool(np.all(one + eps / dt(4) == one))
                and bool(np.all(-one - eps / dt(4) == -one)),
                "ties to even": bool(np.all(one + eps / dt(2) == one))
                and bool(np.all((one + eps) + eps / dt(2) == one + dt(2) * eps)),
            }
            failed = [name for name, ok in checks.items() if not ok]
            if failed:
                raise FloatEnvironmentError(f"{np.dtype(dt).name} arithmetic fails: {failed}")
