"""Float32 <-> int8 with one scale per row or per column, and the f32 epilogue.

Format (symmetric, no zero point):
  scale s = absmax / 127 of the row (quantize_rows) or column (quantize_cols), float32;
  an all-zero row gets s = 1.0 (q = 0), and a subnormal absmax whose s underflows to 0
  gets the smallest subnormal instead, so x / s never divides by zero.
  round-to-nearest:  q = rint(clip(x / s, -127, 127))       (ties to even)
  stochastic:        q = floor(clip(x / s, -127, 127) + u)  u ~ U[0, 1) from rng.uniform16(key)
Both roundings divide by s (one correctly rounded op) rather than multiplying by 1 / s,
so E[q] = x / s for the stochastic one and no double rounding shifts a tie. Clipping
before rounding gives the same q as after (127 is an integer, |u| < 1), and keeps the
rounded value inside int8 so it is written there directly. u is a multiple of 2**-16,
so the stochastic rounding resolves x / s to 1/65536 of a step.
epilogue: y = (float32(acc) * sa[:, None]) * sb[None, :], in that order.

Every function accepts leading batch dims: (..., M, K) in, (..., M) scales out.
A NaN or Inf anywhere in the input raises NonFiniteError; inputs are never modified.

Legend: M rows, K reduction length, N columns, ... leading batch dims.
"""

from __future__ import annotations

import numpy as np

from pynode.core import rng
from pynode.core.errors import NonFiniteError, ShapeError

QMAX = 127
_TINY = np.float32(np.finfo(np.float32).smallest_subnormal)


def _check_float(x: np.ndarray, what: str) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        got = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise ShapeError(f"{what}: expected a float32 array, got {got}")
    if x.ndim < 2:
        raise ShapeError(f"{what}: expected at least 2 dims (..., M, K), got shape {x.shape}")


def _absmax(x: np.ndarray, axis: int, what: str) -> np.ndarray:
    """max |x| along `axis`, (...,) f32; NonFiniteError if x holds a NaN or an Inf.

    max(max(x), -min(x)) is max(|x|) without an |x| temporary, and a NaN or Inf anywhere
    along the axis makes that row's result non-finite: one check covers the input.
    """
    if x.shape[axis] == 0:
        return np.zeros(x.shape[:axis % x.ndim] + x.shape[axis % x.ndim + 1 :], np.float32)
    absmax = np.maximum(np.max(x, axis=axis), -np.min(x, axis=axis))  # (...,) f32
    if not np.isfinite(absmax).all():
        bad = x.size - np.count_nonzero(np.isfinite(x))
        raise NonFiniteError(
            f"{what}: {bad} of {x.size} values are NaN or Inf; refusing to quantize"
        )
    return absmax


def _scales(absmax: np.ndarray) -> np.ndarray:
    scale = absmax / np.float32(QMAX)  # (...,) f32
    scale = np.where(absmax == 0, np.float32(1.0), scale)
    return np.where(scale == 0, _TINY, scale).astype(np.float32, copy=False)


def _row_ratio(x: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    scale = _scales(_absmax(x, -1, what))  # (..., M) f32
    t = np.divide(x, scale[..., :, None])  # (..., M, K) f32
    # A rounded |x / s| can land just above 127 when s itself was rounded down.
    return np.clip(t, -QMAX, QMAX, out=t), scale


def _col_ratio(x: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    scale = _scales(_absmax(x, -2, what))  # (..., N) f32
    t = np.divide(x, scale[..., None, :])  # (..., K, N) f32
    return np.clip(t, -QMAX, QMAX, out=t), scale


def _round_into_int8(fn: np.ufunc, t: np.ndarray) -> np.ndarray:
    q = np.empty(t.shape, np.int8)  # t is integral after fn and within [-127, 127]
    fn(t, out=q, casting="unsafe")
    return q


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest int8 with one scale per row.

    x: (..., M, K) float32. Returns q (..., M, K) int8 and scale (..., M) float32,
    with x ~= q * scale[..., None].
    """
    _check_float(x, "quantize_rows")
    t, scale = _row_ratio(x, "quantize_rows")
    return _round_into_int8(np.rint, t), scale


def quantize_cols(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest int8 with one scale per column.

    x: (..., K, N) float32. Returns q (..., K, N) int8 and scale (..., N) float32,
    with x ~= q * scale[..., None, :].
    """
    _check_float(x, "quantize_cols")
    t, scale = _col_ratio(x, "quantize_cols")
    return _round_into_int8(np.rint, t), scale


def _stochastic_round(t: np.ndarray, key: tuple[int, ...]) -> np.ndarray:
    t += rng.uniform16(key, t.shape)  # (..., R, C) f32, u in [0, 1)
    return _round_into_int8(np.floor, t)


def quantize_rows_stochastic(x: np.ndarray, key: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Stochastically rounded int8 with one scale per row; same bits for the same key.

    x: (..., M, K) float32; key: tuple of non-negative ints naming the draw.
    Returns q (..., M, K) int8 and scale (..., M) float32; E[q * scale] = x.
    """
    _check_float(x, "quantize_rows_stochastic")
    t, scale = _row_ratio(x, "quantize_rows_stochastic")
    return _stochastic_round(t, key), scale


def quantize_cols_stochastic(x: np.ndarray, key: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Stochastically rounded int8 with one scale per column; same bits for the same key.

    x: (..., K, N) float32; key: tuple of non-negative ints naming the draw.
    Returns q (..., K, N) int8 and scale (..., N) float32; E[q * scale] = x.
    """
    _check_float(x, "quantize_cols_stochastic")
    t, scale = _col_ratio(x, "quantize_cols_stochastic")
    return _stochastic_round(t, key), scale


def epilogue(acc: np.ndarray, sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """Scale an int32 GEMM result back to float32 in the pinned order (acc * sa) * sb.

    acc: (..., M, N) int32; sa: (..., M) float32 row scales; sb: (..., N) float32
    column scales. Returns (..., M, N) float32.
    """
    if not isinstance(acc, np.ndarray) or acc.dtype != np.int32 or acc.ndim < 2:
        raise ShapeError(f"epilogue: acc must be an int32 array of >= 2 dims, got {describe(acc)}")
    for name, s, want in (("sa", sa, acc.shape[:-1]), ("sb", sb, acc.shape[:-2] + acc.shape[-1:])):
        if not isinstance(s, np.ndarray) or s.dtype != np.float32 or s.shape != want:
            raise ShapeError(f"epilogue: {name} must be float32 of shape {want}, got {describe(s)}")
        if not np.isfinite(s).all():
            raise NonFiniteError(f"epilogue: {name} holds NaN or Inf scales")
    y = acc.astype(np.float32)  # (..., M, N) f32; exact below 2**24, else rounded to even
    y *= sa[..., :, None]
    y *= sb[..., None, :]
    return y


def describe(x: object) -> str:
    """An operand in an error message: its dtype and shape, or its type."""
    if isinstance(x, np.ndarray):
        return f"{x.dtype} {x.shape}"
    return type(x).__name__
