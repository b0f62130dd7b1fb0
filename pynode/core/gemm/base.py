"""The GEMM backend contract and the operand checks every backend shares.

A backend computes C = A @ B exactly for int8 operands with int32 results. The public
`matmul` / `bmm` of `GemmBackend` refuse bad operands before any work is done, return an
all-zero result for empty shapes, and hand the rest to the backend's `_matmul` / `_bmm`,
which may assume plain int8 ndarrays (no subclass) with 1 <= M, N and 1 <= K <= MAX_K,
no negative stride and C-order strides on size-1 axes (any other strides).

Legend: B batch, M rows, K reduction length, N columns.
"""

from __future__ import annotations

import numpy as np

from pynode.core.errors import AccumulatorBoundError, DaisyError, GateError, ShapeError

# int32 holds K products of at most (-128) * (-128) = 2**14 while K * 2**14 < 2**31.
MAX_K = 131_071


class UnknownBackendError(DaisyError, ValueError):
    """A GEMM backend was asked for by a name that does not exist."""


class BackendUnavailableError(GateError):
    """A GEMM backend exists but cannot run here (e.g. torch does not import)."""


def _desc(x: object) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype} array of shape {x.shape}"
    return type(x).__name__


def _check_int8(what: str, x: object, ndim: int) -> None:
    if isinstance(x, np.ndarray) and type(x) is not np.ndarray:
        # np.matrix and masked arrays redefine indexing and products: a kernel written for
        # plain arrays would compute something else (the LUT reference ignored a mask)
        raise ShapeError(f"{what} must be a plain numpy array, got the subclass "
                         f"{type(x).__name__}; pass np.asarray(x) (masked values included)")
    if not isinstance(x, np.ndarray) or x.dtype != np.int8 or x.ndim != ndim:
        raise ShapeError(f"{what} must be a {ndim}-d int8 array, got {_desc(x)}")


def normalise(x: np.ndarray) -> np.ndarray:
    """x with no negative stride and, on each size-1 axis, the stride a fresh C-order array
    has there (a copy if either is not so), so every backend can take it.

    numpy ignores the stride of a size-1 axis (it calls such an array contiguous, so
    np.ascontiguousarray keeps it): torch.from_numpy refuses a negative one, and torch's
    _int_mm reads a positive one as a leading dimension and returns garbage (a (40, 1)
    transposed view with strides (1, 40))."""
    canonical = x.itemsize
    for size, stride in zip(x.shape[::-1], x.strides[::-1], strict=True):
        if stride < 0 or (size == 1 and stride != canonical):
            return x.copy(order="C")
        canonical *= size
    return x


def _check_k(k: int) -> None:
    if k > MAX_K:
        raise AccumulatorBoundError(
            f"K = {k} exceeds {MAX_K}: an int32 accumulator cannot hold its sum exactly"
        )


def check_matmul(a: np.ndarray, b: np.ndarray) -> tuple[int, int, int]:
    """Validate a (M, K) int8 and b (K, N) int8; return (M, K, N)."""
    _check_int8("matmul operand a", a, 2)
    _check_int8("matmul operand b", b, 2)
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ShapeError(f"matmul: a is {a.shape} but b is {b.shape} (inner dims differ)")
    _check_k(k)
    return m, k, n


def check_bmm(a: np.ndarray, b: np.ndarray) -> tuple[int, int, int, int]:
    """Validate a (B, M, K) int8 and b (B, K, N) int8; return (B, M, K, N)."""
    _check_int8("bmm operand a", a, 3)
    _check_int8("bmm operand b", b, 3)
    (bs, m, k), (bs2, k2, n) = a.shape, b.shape
    if bs != bs2 or k != k2:
        raise ShapeError(f"bmm: a is {a.shape} but b is {b.shape} (batch or inner dims differ)")
    _check_k(k)
    return bs, m, k, n


class GemmBackend:
    """An exact int8 x int8 -> int32 GEMM. Subclasses set `name` and define `_matmul`."""

    name = "abstract"

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a (M, K) int8 @ b (K, N) int8 -> (M, N) int32, a fresh array."""
        m, k, n = check_matmul(a, b)
        if m == 0 or k == 0 or n == 0:
            return np.zeros((m, n), np.int32)
        return self._matmul(normalise(a), normalise(b))

    def bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a (B, M, K) int8 @ b (B, K, N) int8 -> (B, M, N) int32, a fresh array."""
        bs, m, k, n = check_bmm(a, b)
        if bs == 0 or m == 0 or k == 0 or n == 0:
            return np.zeros((bs, m, n), np.int32)
        return self._bmm(normalise(a), normalise(b))

    def _matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.empty((a.shape[0], a.shape[1], b.shape[2]), np.int32)  # (B, M, N) int32
        for i in range(a.shape[0]):
            out[i] = self._matmul(a[i], b[i])
        return out

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
