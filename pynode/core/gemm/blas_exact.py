"""Exact int8 GEMM on float32 BLAS (sgemm), the fast native backend.

Why it is exact: every product of two int8 values has |a * b| <= 2**14, so any partial
sum over at most CHUNK_K = 1024 terms is an integer of magnitude <= 2**24, which float32
represents exactly. Whatever order, blocking, threading or FMA the BLAS uses, each
intermediate is such a partial sum, so sgemm returns the exact integer. K is split
into chunks of <= 1024; each chunk's float32 result converts exactly to int32 and the
chunks add in int32, exact because K <= MAX_K keeps the total below 2**31.

The int8 -> float32 copies go into per-thread scratch buffers that are reused between
calls (fresh 256 KB+ allocations cost page faults comparable to a 256^3 sgemm); every
use overwrites the whole region it reads, and the int32 result is always a new array.

Legend: B batch, M rows, K reduction length, N columns.
"""

from __future__ import annotations

import threading

import numpy as np

from pynode.core.gemm.base import GemmBackend

# 1024 * 2**14 = 2**24, the last integer float32 reaches without a gap.
CHUNK_K = 1024


class _Scratch(threading.local):
    """Float32 buffers owned by one thread; they only ever grow."""

    def __init__(self) -> None:
        self.flat = [np.empty(0, np.float32) for _ in range(3)]

    def view(self, slot: int, shape: tuple[int, ...]) -> np.ndarray:
        size = 1
        for d in shape:
            size *= d
        if self.flat[slot].size < size:
            self.flat[slot] = np.empty(size, np.float32)
        return self.flat[slot][:size].reshape(shape)


class BlasFloatBackend(GemmBackend):
    """sgemm on integer-valued float32 operands, K chunked at 1024."""

    name = "blas_float"

    def __init__(self) -> None:
        self._scratch = _Scratch()

    def _matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._exact(a, b)

    def _bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._exact(a, b)

    def _exact(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a (..., M, K) int8 @ b (..., K, N) int8 -> (..., M, N) int32."""
        k = a.shape[-1]
        out_shape = a.shape[:-1] + b.shape[-1:]
        af = self._scratch.view(0, a.shape)  # (..., M, K) f32
        bf = self._scratch.view(1, b.shape)  # (..., K, N) f32
        cf = self._scratch.view(2, out_shape)  # (..., M, N) f32
        np.copyto(af, a)
        np.copyto(bf, b)
        if k <= CHUNK_K:
            np.matmul(af, bf, out=cf)
            return cf.astype(np.int32)
        out = np.empty(out_shape, np.int32)  # (..., M, N) int32
        for k0 in range(0, k, CHUNK_K):
            np.matmul(af[..., k0 : k0 + CHUNK_K], bf[..., k0 : k0 + CHUNK_K, :], out=cf)
            if k0 == 0:
                np.copyto(out, cf, casting="unsafe")
            else:
                out += cf.astype(np.int32)
        return out
