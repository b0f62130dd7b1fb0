"""numba's Freivalds check of a GEMM product (Kernels.product_holds, used by the per-call
check of pynode/core/gemm/check.py): each row's identity as one wrapping int64 sum.

NumbaKernels.product_holds calls these; `gate_kernels` compares them with the reference
at every start, on right and wrong products. Where numba is missing the reference serves.

Legend: B batch, M rows, K reduction length, N columns, V random vectors.
"""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:
    numba = None

if numba is not None:
    # Freivalds' identity, each row as one int64 sum: t_i = a_i . (B @ r) - out_i . r, in
    # wrapping int64 (mod 2**64), so reassociating, fusing and any overflow leave t_i exact
    # mod 2**64. Its true value is -(D @ r)_i for D = out - A @ B, |D| < 2**32, r entries
    # in [0, 2**31) summing to below 2**32 (checked here): |t_i| < 2**64, so t_i == 0
    # mod 2**64 exactly when it is 0. One row loop, one reduction per row, and no float
    # conversions; each product runs along memory: row- or column-major operands alike.
    _FREIVALDS = dict(nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})

    @numba.njit(inline="always", **_FREIVALDS)
    def _holds_2d(a, b, out, r, br, lhs):
        m, k = a.shape
        n = b.shape[1]
        if b.shape[0] != k or out.shape[0] != m or out.shape[1] != n or r.shape[1] != n:
            raise ValueError("product check: operand shapes do not match")
        a_rows = abs(a.strides[1]) <= abs(a.strides[0])
        b_rows = abs(b.strides[1]) <= abs(b.strides[0])
        for q in range(r.shape[0]):
            if b_rows:
                for kk in range(k):
                    s = np.int64(0)
                    for j in range(n):
                        s += np.int64(b[kk, j]) * r[q, j]
                    br[kk] = s
            else:
                br[:] = 0
                for j in range(n):
                    rj = r[q, j]
                    for kk in range(k):
                        br[kk] += np.int64(b[kk, j]) * rj
            if a_rows:
                for i in range(m):
                    t = np.int64(0)
                    for kk in range(k):
                        t += np.int64(a[i, kk]) * br[kk]
                    for j in range(n):
                        t -= np.int64(out[i, j]) * r[q, j]
                    if t != 0:
                        return False
            else:
                lhs[:] = 0
                for kk in range(k):
                    bk = br[kk]
                    for i in range(m):
                        lhs[i] += np.int64(a[i, kk]) * bk
                for i in range(m):
                    t = lhs[i]
                    for j in range(n):
                        t -= np.int64(out[i, j]) * r[q, j]
                    if t != 0:
                        return False
        return True

    @numba.njit(inline="always", **_FREIVALDS)
    def _int_vectors(r):
        """r as int64, or an empty array where some vector leaves the sums inexact (entries
        not integers in [0, 2**31), or summing to 2**32 or more): the caller then takes
        the reference's path."""
        r64 = np.empty(r.shape, np.int64)
        for q in range(r.shape[0]):
            total = 0.0
            for j in range(r.shape[1]):
                x = r[q, j]
                if not (0.0 <= x < 2.0**31) or x != np.floor(x):
                    return np.empty((0, 0), np.int64)
                r64[q, j] = np.int64(x)
                total += x
            if total >= 2.0**32:
                return np.empty((0, 0), np.int64)
        return r64

    @numba.njit(cache=True, **_FREIVALDS)
    def product_holds_2d(a, b, out, r):
        """1: out == a @ b; 0: not; -1: r outside the integer side's range."""
        r64 = _int_vectors(r)
        if r64.size != r.size:
            return -1
        br, lhs = np.empty(a.shape[1], np.int64), np.empty(a.shape[0], np.int64)
        return 1 if _holds_2d(a, b, out, r64, br, lhs) else 0

    @numba.njit(cache=True, **_FREIVALDS)
    def product_holds_3d(a, b, out, r):
        if b.shape[0] != a.shape[0] or out.shape[0] != a.shape[0]:
            raise ValueError("product check: batch sizes do not match")
        r64 = _int_vectors(r)
        if r64.size != r.size:
            return -1
        br, lhs = np.empty(a.shape[2], np.int64), np.empty(a.shape[1], np.int64)
        for t in range(a.shape[0]):
            if not _holds_2d(a[t], b[t], out[t], r64, br, lhs):
                return 0
        return 1
