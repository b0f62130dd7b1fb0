"""Float32 <-> int8 with one scale per row or per column, and the f32 epilogue.

Format (symmetric, no zero point):
  scale s = absmax / 127 of the row (quantize_rows) or column (quantize_cols), float32;
  an all-zero row gets s = 1.0 (q = 0), and a subnormal absmax whose s underflows to 0
  gets the smallest subnormal instead, so x / s never divides by zero.
  round-to-nearest:  q = clip(rint(x / s), -127, 127)       (ties to even)
  stochastic:        q = clip(floor(x / s + u), -127, 127)  u ~ U[0, 1) from rng.uniform(key)
Both roundings divide by s (one correctly rounded op) rather than multiplying by 1 / s,
so E[q] = x / s for the stochastic one and no double rounding shifts a tie.
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
    bad = x.size - np.count_nonzero(np.isfinite(x))
    if bad:
        raise NonFiniteError(
            f"{what}: {bad} of {x.size} values are NaN or Inf; refusing to quantize"
        )


def _scales(absmax: np.ndarray) -> np.ndarray:
    scale = absmax / np.float32(QMAX)  # (...,) f32
    scale = np.where(absmax == 0, np.float32(1.0), scale)
    return np.where(scale == 0, _TINY, scale).astype(np.float32, copy=False)


def _to_int8(t: np.ndarray) -> np.ndarray:
    # A rounded |x / s| can land just above 127 when s itself was rounded down.
    np.clip(t, -QMAX, QMAX, out=t)
    return t.astype(np.int8)


def _row_ratio(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    absmax = np.max(np.abs(x), axis=-1, initial=np.float32(0))  # (..., M) f32
    scale = _scales(absmax)  # (..., M) f32
    return x / scale[..., :, None], scale  # (..., M, K) f32


def _col_ratio(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    absmax = np.max(np.abs(x), axis=-2, initial=np.float32(0))  # (..., N) f32
    scale = _scales(absmax)  # (..., N) f32
    return x / scale[..., None, :], scale  # (..., K, N) f32


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest int8 with one scale per row.

    x: (..., M, K) float32. Returns q (..., M, K) int8 and scale (..., M) float32,
    with x ~= q * scale[..., None].
    """
    _check_float(x, "quantize_rows")
    t, scale = _row_ratio(x)
    return _to_int8(np.rint(t, out=t)), scale


def quantize_cols(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest int8 with one scale per column.

    x: (..., K, N) float32. Returns q (..., K, N) int8 and scale (..., N) float32,
    with x ~= q * scale[..., None, :].
    """
    _check_float(x, "quantize_cols")
    t, scale = _col_ratio(x)
    return _to_int8(np.rint(t, out=t)), scale


def _stochastic_round(t: np.ndarray, key: tuple[int, ...]) -> np.ndarray:
    t += rng.uniform(key, t.shape)  # (..., R, C) f32, u in [0, 1)
    return _to_int8(np.floor(t, out=t))


def quantize_rows_stochastic(x: np.ndarray, key: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Stochastically rounded int8 with one scale per row; same bits for the same key.

    x: (..., M, K) float32; key: tuple of non-negative ints naming the draw.
    Returns q (..., M, K) int8 and scale (..., M) float32; E[q * scale] = x.
    """
    _check_float(x, "quantize_rows_stochastic")
    t, scale = _row_ratio(x)
    return _stochastic_round(t, key), scale


def quantize_cols_stochastic(x: np.ndarray, key: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Stochastically rounded int8 with one scale per column; same bits for the same key.

    x: (..., K, N) float32; key: tuple of non-negative ints naming the draw.
    Returns q (..., K, N) int8 and scale (..., N) float32; E[q * scale] = x.
    """
    _check_float(x, "quantize_cols_stochastic")
    t, scale = _col_ratio(x)
    return _stochastic_round(t, key), scale


def epilogue(acc: np.ndarray, sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
    """Scale an int32 GEMM result back to float32 in the pinned order (acc * sa) * sb.

    acc: (..., M, N) int32; sa: (..., M) float32 row scales; sb: (..., N) float32
    column scales. Returns (..., M, N) float32.
    """
    if not isinstance(acc, np.ndarray) or acc.dtype != np.int32 or acc.ndim < 2:
        raise ShapeError(f"epilogue: acc must be an int32 array of >= 2 dims, got {_desc(acc)}")
    for name, s, want in (("sa", sa, acc.shape[:-1]), ("sb", sb, acc.shape[:-2] + acc.shape[-1:])):
        if not isinstance(s, np.ndarray) or s.dtype != np.float32 or s.shape != want:
            raise ShapeError(f"epilogue: {name} must be float32 of shape {want}, got {_desc(s)}")
        if not np.isfinite(s).all():
            raise NonFiniteError(f"epilogue: {name} holds NaN or Inf scales")
    y = acc.astype(np.float32)  # (..., M, N) f32; exact below 2**24, else rounded to even
    y *= sa[..., :, None]
    y *= sb[..., None, :]
    return y


def _desc(x: object) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype} {x.shape}"
    return type(x).__name__
