"""Integer GEMM in numpy: int8 operands widened to int32, multiplied with einsum.

numpy's integer matmul (`@`) never uses BLAS and runs a plain triple loop; einsum's
sum-of-products kernel is vectorized and measured ~10x faster natively and ~3x faster
under Pyodide. int32 accumulation is exact because K <= MAX_K (see base.py); int16
operands would be faster still, but einsum would accumulate in int16 and wrap.

Legend: B batch, M rows, K reduction length, N columns.
"""

from __future__ import annotations

import numpy as np

from pynode.core.gemm.base import GemmBackend


class NumpyIntBackend(GemmBackend):
    """Exact int32 einsum; no BLAS needed, so it is the fast path where there is none."""

    name = "numpy_int"

    def _matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a32, b32 = a.astype(np.int32), b.astype(np.int32)  # (M, K), (K, N) int32
        return np.einsum("mk,kn->mn", a32, b32, optimize=False)  # (M, N) int32

    def _bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a32, b32 = a.astype(np.int32), b.astype(np.int32)  # (B, M, K), (B, K, N) int32
        return np.einsum("bmk,bkn->bmn", a32, b32, optimize=False)  # (B, M, N) int32
