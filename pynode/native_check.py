"""numba's Freivalds check of a GEMM product (Kernels.product_holds, used by the per-call
check of pynode/core/gemm/check.py): each row's identity as one wrapping int64 sum.

NumbaKernels.product_holds calls these; `gate_kernels` compares them with the reference
at every start, on right and wrong products. Where numba is missing the reference serves.

Legend: B batch, M rows, K reduction length, N columns, V random vectors.
"""

from __future__ import annotations

import functools

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
    # mod 2**64 exactly when it is 0. One row loop, one reduction per row; each product
    # runs along memory: row- or column-major operands alike.
    # Two forms of multiply, for the CPU's sake (the arithmetic is exact either way):
    # - the entries of r fit int32, and are multiplied as such (out . r, B @ r): a 32 x 32
    #   -> 64-bit multiply, one instruction where a full 64-bit one is three on Intel cores;
    # - a_i . (B @ r) in float64 where every partial sum is an integer below 2**53, in any
    #   order (sum_k |(B @ r)_k| * 2**7 < 2**53, tested a vector), then taken to int64
    #   exactly; else in int64. Which is faster depends on the CPU (float64 was on an Intel
    #   Xeon, int64 on an AMD EPYC in an earlier form): `f64` says, timed at start
    #   (faster_a_side); both give the same answer.
    _FREIVALDS = dict(nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
    _EXACT_F64_BR = 2**46  # sum |B @ r| below this: a . (B @ r) stays below 2**53

    @numba.njit(inline="always", **_FREIVALDS)
    def _lane(x):
        """x, an int64 known to fit int32, as a 32 x 32 -> 64-bit multiply takes it."""
        return np.int64(np.int32(x))

    @numba.njit(inline="always", **_FREIVALDS)
    def _out_dot_r(out, i, r, q):
        t = np.int64(0)
        for j in range(out.shape[1]):
            t += np.int64(out[i, j]) * _lane(r[q, j])
        return t

    @numba.njit(inline="always", **_FREIVALDS)
    def _holds_2d(a, b, out, r, br, brf, lhs, lhsf, f64):
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
                        s += np.int64(b[kk, j]) * _lane(r[q, j])
                    br[kk] = s
            else:
                br[:] = 0
                for j in range(n):
                    rj = _lane(r[q, j])
                    for kk in range(k):
                        br[kk] += np.int64(b[kk, j]) * rj
            bound = np.int64(0)
            for kk in range(k):
                bound += abs(br[kk])
                brf[kk] = np.float64(br[kk])
            in_f64 = f64 and bound < _EXACT_F64_BR
            if a_rows and in_f64:
                for i in range(m):
                    tf = 0.0
                    for kk in range(k):
                        tf += np.float64(a[i, kk]) * brf[kk]
                    if np.int64(tf) != _out_dot_r(out, i, r, q):
                        return False
            elif a_rows:
                for i in range(m):
                    t = np.int64(0)
                    for kk in range(k):
                        t += np.int64(a[i, kk]) * br[kk]
                    if t != _out_dot_r(out, i, r, q):
                        return False
            else:
                if in_f64:
                    lhsf[:] = 0.0
                    for kk in range(k):
                        bk = brf[kk]
                        for i in range(m):
                            lhsf[i] += np.float64(a[i, kk]) * bk
                    for i in range(m):
                        lhs[i] = np.int64(lhsf[i])
                else:
                    lhs[:] = 0
                    for kk in range(k):
                        bk = br[kk]
                        for i in range(m):
                            lhs[i] += np.int64(a[i, kk]) * bk
                for i in range(m):
                    if lhs[i] != _out_dot_r(out, i, r, q):
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
    def product_holds_2d(a, b, out, r, f64):
        """1: out == a @ b; 0: not; -1: r outside the integer side's range. f64: the A side
        in float64 where that is exact."""
        r64 = _int_vectors(r)
        if r64.size != r.size:
            return -1
        k, m = a.shape[1], a.shape[0]
        br, brf = np.empty(k, np.int64), np.empty(k, np.float64)
        lhs, lhsf = np.empty(m, np.int64), np.empty(m, np.float64)
        return 1 if _holds_2d(a, b, out, r64, br, brf, lhs, lhsf, f64) else 0

    @numba.njit(cache=True, **_FREIVALDS)
    def product_holds_3d(a, b, out, r, f64):
        if b.shape[0] != a.shape[0] or out.shape[0] != a.shape[0]:
            raise ValueError("product check: batch sizes do not match")
        r64 = _int_vectors(r)
        if r64.size != r.size:
            return -1
        k, m = a.shape[2], a.shape[1]
        br, brf = np.empty(k, np.int64), np.empty(k, np.float64)
        lhs, lhsf = np.empty(m, np.int64), np.empty(m, np.float64)
        for t in range(a.shape[0]):
            if not _holds_2d(a[t], b[t], out[t], r64, br, brf, lhs, lhsf, f64):
                return 0
        return 1


# Products of the default model's kinds (B, M, K, N; A column-major where True) that
# faster_a_side times: a row-major 2-d product, a weight gradient's, an attention's.
_TIMED = ((1, 512, 64, 256, False), (1, 64, 512, 256, True), (32, 64, 64, 16, False))


@functools.cache
def faster_a_side(rounds: int = 15) -> bool:
    """Whether the check's A side runs faster in float64 than in int64 here: each form's
    best of `rounds` on _TIMED, random operands (a few milliseconds), timed once a process
    (select_kernels runs for every trainer: a room's runs, a failover's)."""
    import time

    rng = np.random.default_rng(0)  # timing data only
    cases = []
    for bs, m, k, n, by_columns in _TIMED:
        a = rng.integers(-128, 128, (bs, m, k), dtype=np.int8)
        if by_columns:
            a = a.transpose(0, 2, 1).copy().transpose(0, 2, 1)
        b = rng.integers(-128, 128, (bs, k, n), dtype=np.int8)
        out = np.matmul(a.astype(np.int32), b.astype(np.int32))
        r = rng.integers(0, 1 << 20, (1, n)).astype(np.float64)
        cases.append((a if bs > 1 else a[0], b if bs > 1 else b[0], out if bs > 1 else out[0], r))
    best = {True: float("inf"), False: float("inf")}
    for _ in range(rounds):
        for f64 in (True, False):
            started = time.perf_counter()
            for a, b, out, r in cases:
                (product_holds_2d if a.ndim == 2 else product_holds_3d)(a, b, out, r, f64)
            best[f64] = min(best[f64], time.perf_counter() - started)
    return best[True] <= best[False]
