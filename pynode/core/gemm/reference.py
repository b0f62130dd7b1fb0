"""The LUT reference: every product read from the certified multiply table, summed in int64.

Slow by design and obviously right; it is the oracle the gates and the live audit
compare every fast backend against (chain of trust: unit network == LUT == backend).

Legend: B batch, M rows, K reduction length, N columns, C sampled cells.
"""

from __future__ import annotations

import numpy as np

from pynode.core.errors import ShapeError
from pynode.core.gemm.base import GemmBackend

# Cells of the (rows, K, cols) product block gathered at once: caps memory near 24 MB.
BLOCK_ELEMENTS = 1 << 21


def checked_lut(mul_lut: np.ndarray) -> np.ndarray:
    """Return mul_lut as a flat (65536,) int32 copy indexed (a + 128) * 256 + (b + 128)."""
    if not isinstance(mul_lut, np.ndarray) or mul_lut.shape != (256, 256):
        shape = getattr(mul_lut, "shape", None)
        raise ShapeError(f"mul_lut must be a (256, 256) array, got shape {shape}")
    if mul_lut.dtype.kind not in "iu":
        raise ShapeError(f"mul_lut must hold integers, got {mul_lut.dtype}")
    return np.array(mul_lut, dtype=np.int32).reshape(-1)  # (65536,) int32, our own copy


def _index(x: np.ndarray, scale: int) -> np.ndarray:
    return (x.astype(np.intp) + 128) * scale  # same shape, intp


def lut_dot(flat_lut: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Exact dot products of paired vectors through the LUT.

    flat_lut from `checked_lut`; rows (C, K) int8 and cols (C, K) int8.
    Returns (C,) int64: sum_k lut[rows[c, k], cols[c, k]].
    """
    prods = flat_lut[_index(rows, 256) + _index(cols, 1)]  # (C, K) int32
    return prods.sum(axis=1, dtype=np.int64)


class ReferenceBackend(GemmBackend):
    """C[m, n] = sum_k mul_lut[A[m, k] + 128, B[k, n] + 128], blocked to bound memory."""

    name = "reference"

    def __init__(self, mul_lut: np.ndarray) -> None:
        self._lut = checked_lut(mul_lut)

    def _matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        (m, k), n = a.shape, b.shape[1]
        ia = _index(a, 256)  # (M, K) intp
        ib = _index(b, 1)  # (K, N) intp
        cols = min(n, max(1, BLOCK_ELEMENTS // k))
        rows = max(1, BLOCK_ELEMENTS // (k * cols))
        out = np.empty((m, n), np.int32)  # (M, N) int32
        for n0 in range(0, n, cols):
            for m0 in range(0, m, rows):
                idx = ia[m0 : m0 + rows, :, None] + ib[None, :, n0 : n0 + cols]  # (r, K, c) intp
                out[m0 : m0 + rows, n0 : n0 + cols] = self._lut[idx].sum(axis=1, dtype=np.int64)
        return out
