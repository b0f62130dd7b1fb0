"""A corpus of deliberately wrong GEMM backends: the mutation score of the verification.

Each mutant models one real kernel bug (a tail, a block, a batch loop, a stride, a dirty
or aliased buffer, an accumulator too narrow, a wrapped int8, a transposed operand, ...)
and is right everywhere else. `calls()` gives the operand pairs, in order, on which it is
wrong (some bugs need a sequence: a stale cache, an aliased result). A mutant is caught
when the start-up gate refuses it, or when, gated in, the per-call product check
(Gemm(check=True)) flags every wrong product and the caller still gets the exact one.
tests/core/test_mutants.py asserts that for every mutant; benchmarks/mutation_score.py
prints the shares. Plain module, no pytest: the benchmark imports it too.

Legend: B batch, M rows, K reduction length, N columns.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from pynode.core.gemm import ExactGate, select_gemm
from pynode.core.gemm.base import GemmBackend
from pynode.core.gemm.check import ProductCheck
from pynode.core.gemm.numpy_int import NumpyIntBackend
from pynode.core.kernels import REFERENCE, Kernels

Pair = tuple[np.ndarray, np.ndarray]


def exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The oracle: int64 matmul, independent of every backend under test."""
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


def int8(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)


def pair(m: int, k: int, n: int, bs: int = 0, seed: int = 0) -> Pair:
    if bs:
        return int8((bs, m, k), seed), int8((bs, k, n), seed + 1)
    return int8((m, k), seed), int8((k, n), seed + 1)


class Mutant(GemmBackend):
    """Exact (int64 matmul) unless `wrong` changes the result; shape (B, M, K, N)."""

    name = "mutant"
    trigger: tuple[int, ...] = (1, 1, 1, 1)  # (B, M, K, N) where it is wrong; B = 0: matmul

    def _matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._bmm(a[None], b[None])[0]

    def _bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = exact(a, b).astype(np.int32)  # (B, M, N) int32
        self.wrong(a, b, out)
        return out

    def wrong(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        raise NotImplementedError

    def calls(self) -> Iterator[Pair]:
        bs, m, k, n = self.trigger
        yield pair(m, k, n, bs, seed=len(self.name))


# ---------------------------------------------------------------- shape-specific


class LastCellTail(Mutant):
    """The last cell off by one when M is not a multiple of 32 (a tail tile's store)."""

    name, trigger = "last_cell_tail", (0, 37, 64, 64)

    def wrong(self, a, b, out):
        if out.shape[1] % 32:
            out[:, -1, -1] += 1


class LastRowDropsLastK(Mutant):
    """Off by one in the last row: its loop stops one K short when M % 8 == 5."""

    name, trigger = "last_row_drops_last_k", (0, 13, 40, 8)

    def wrong(self, a, b, out):
        if out.shape[1] % 8 == 5:
            out[:, -1] -= (a[:, -1, -1:].astype(np.int32) * b[:, -1, :]).astype(np.int32)


class DropsKTail(Mutant):
    """A SIMD loop over K in steps of 8 that forgets the K % 8 tail."""

    name, trigger = "drops_k_tail", (0, 8, 20, 8)

    def wrong(self, a, b, out):
        k = a.shape[2]
        if k % 8 and k > 8:
            tail = k - k % 8
            out -= exact(a[:, :, tail:], b[:, tail:, :]).astype(np.int32)


class NTailZero(Mutant):
    """Columns past the last multiple of 16 never written (left zero) when N > 16."""

    name, trigger = "n_tail_zero", (0, 8, 8, 31)

    def wrong(self, a, b, out):
        n = out.shape[2]
        if n > 16 and n % 16:
            out[:, :, n - n % 16 :] = 0


class MTailRepeats(Mutant):
    """Rows past the last multiple of 4 get a copy of the row above when M > 64."""

    name, trigger = "m_tail_repeats", (0, 67, 16, 8)

    def wrong(self, a, b, out):
        m = out.shape[1]
        if m > 64 and m % 4:
            out[:, m - m % 4 :] = out[:, m - m % 4 - 1 : m - m % 4]


class ManyRowsKTail(Mutant):
    """Wrong in an interior cell when M >= 100 and K is not a multiple of 8."""

    name, trigger = "many_rows_k_tail", (0, 120, 50, 16)

    def wrong(self, a, b, out):
        if out.shape[1] >= 100 and a.shape[2] % 8:
            out[:, 77, out.shape[2] // 2] += 3


class RowIndexWrapsInt8(Mutant):
    """The row index kept in int8: rows from 128 on get rows 0, 1, ...'s results."""

    name, trigger = "row_index_wraps_int8", (0, 140, 8, 8)

    def wrong(self, a, b, out):
        m = out.shape[1]
        if m > 128:
            out[:, 128:] = out[:, : m - 128]


class SquareOutputTransposed(Mutant):
    """Stores a square output column-major: C.T instead of C when M == N > 1."""

    name, trigger = "square_output_transposed", (0, 48, 20, 48)

    def wrong(self, a, b, out):
        if out.shape[1] == out.shape[2] > 1:
            out[:] = out.transpose(0, 2, 1).copy()


class WrongAtOneK(Mutant):
    """One interior cell wrong for one inner size only (K = 72): issue #11's kernel."""

    name, trigger = "wrong_at_one_k", (0, 50, 72, 30)

    def wrong(self, a, b, out):
        if a.shape[2] == 72:
            out[:, out.shape[1] // 3, out.shape[2] // 2] -= 1


class WrongAtMlpWidth(Mutant):
    """One interior cell wrong when K is 144, the MLP's inner size in a width-36 model
    (tests/core/test_mutants.py's run), which the gate does not use."""

    name, trigger = "wrong_at_k144", (0, 30, 144, 36)

    def wrong(self, a, b, out):
        if a.shape[2] == 144:
            out[:, out.shape[1] // 3, out.shape[2] // 5 + 1] += 3


# ---------------------------------------------------------------- batch-specific


class LastBatchUsesPreviousA(Mutant):
    """A batch pointer off by one: with B >= 10 the last matrix reads the previous A."""

    name, trigger = "last_batch_previous_a", (12, 5, 9, 6)

    def wrong(self, a, b, out):
        if a.shape[0] >= 10:
            out[-1] = exact(a[-2], b[-1]).astype(np.int32)


class BatchesOf16Only(Mutant):
    """A batch loop unrolled by 16: with B > 16 the batches past the last 16 stay zero."""

    name, trigger = "batches_of_16_only", (17, 4, 8, 4)

    def wrong(self, a, b, out):
        bs = a.shape[0]
        if bs > 16 and bs % 16:
            out[bs - bs % 16 :] = 0


# ---------------------------------------------------------------- stride- and layout-specific


class FortranBAsC(Mutant):
    """Transposed-operand confusion: reads a column-major B's memory as if row-major."""

    name = "fortran_b_as_c"

    def _bmm(self, a, b):
        if b.strides[-2] < b.strides[-1]:  # column-major matrices
            b = np.ascontiguousarray(b.transpose(0, 2, 1)).reshape(b.shape)
        return exact(a, b).astype(np.int32)

    def calls(self):
        a, b = pair(6, 10, 10, seed=7)
        yield a, np.asfortranarray(b)


class ColumnStrideIgnored(Mutant):
    """Assumes A's columns are adjacent in memory: a column-strided A reads its neighbours."""

    name = "column_stride_ignored"

    def _bmm(self, a, b):
        if a.strides[2] > 1:
            a = np.lib.stride_tricks.as_strided(a, strides=(*a.strides[:2], 1))
        return exact(a, b).astype(np.int32)

    def calls(self):
        base, b = int8((8, 30), 8), int8((10, 5), 9)
        yield base[:, ::3], b


class TransposedBatchAsContiguous(Mutant):
    """bmm reads a batch of transposed A views as contiguous (B, M, K) memory."""

    name = "transposed_batch_as_contiguous"

    def _bmm(self, a, b):
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a.transpose(0, 2, 1)).reshape(a.shape)
        return exact(a, b).astype(np.int32)

    def calls(self):
        a, b = pair(7, 5, 4, bs=2, seed=10)
        yield np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1), b


# ---------------------------------------------------------------- buffers and aliasing


class PooledBuffer(Mutant):
    """Accumulates into a buffer pooled by shape and never zeroes it between calls."""

    name = "pooled_buffer"

    def __init__(self) -> None:
        self.pool: dict[tuple[int, ...], np.ndarray] = {}

    def _bmm(self, a, b):
        shape = a.shape[:-1] + b.shape[-1:]
        buf = self.pool.setdefault(shape, np.zeros(shape, np.int32))
        buf += exact(a, b).astype(np.int32)
        return buf.copy()

    def calls(self):
        yield pair(5, 6, 7, seed=11)
        yield pair(5, 6, 7, seed=12)


class UninitialisedOutput(Mutant):
    """Accumulates into memory from its own arena, trusting it to be zero: whatever an
    earlier call of any shape left there is added in (np.empty's junk, made repeatable)."""

    name = "uninitialised_output"

    def __init__(self) -> None:
        self.arena = np.zeros(1 << 16, np.int32)

    def _bmm(self, a, b):
        shape = a.shape[:-1] + b.shape[-1:]
        size = int(np.prod(shape))
        if size > self.arena.size:
            self.arena = np.zeros(size, np.int32)
        out = self.arena[:size].reshape(shape)
        for k in range(a.shape[2]):
            out += a[:, :, k, None].astype(np.int32) * b[:, None, k, :].astype(np.int32)
        return out.copy()

    def calls(self):
        yield pair(3, 5, 4, seed=13)
        yield pair(8, 9, 8, seed=14)


class AliasedResult(Mutant):
    """Returns one internal buffer per shape: each result is overwritten by the next call
    of that shape (base.py promises a fresh array)."""

    name = "aliased_result"

    def __init__(self) -> None:
        self.buffers: dict[tuple[int, ...], np.ndarray] = {}

    def _bmm(self, a, b):
        shape = a.shape[:-1] + b.shape[-1:]
        out = self.buffers.setdefault(shape, np.empty(shape, np.int32))
        out[...] = exact(a, b)
        return out

    def _matmul(self, a, b):
        return self._bmm(a[None], b[None]).reshape(a.shape[0], b.shape[1])

    def calls(self):
        yield pair(9, 8, 7, seed=14)
        yield pair(9, 8, 7, seed=15)


class StaleCacheByAddress(Mutant):
    """Memoises results by operand address and shape: new data at a reused address
    (the same buffer refilled) gets the old result."""

    name = "stale_cache_by_address"

    def __init__(self) -> None:
        self.cache: dict[tuple, np.ndarray] = {}

    def _bmm(self, a, b):
        key = (a.__array_interface__["data"][0], b.__array_interface__["data"][0],
               a.shape, b.shape)
        if key not in self.cache:
            self.cache[key] = exact(a, b).astype(np.int32)
        return self.cache[key].copy()

    def calls(self):
        a, b = pair(6, 11, 5, seed=16)
        yield a, b
        a[...] = int8(a.shape, 17)  # the same buffer, refilled
        yield a, b


class WritesIntoB(Mutant):
    """Uses B as its scratch: the product is right, the caller's B is left zeroed."""

    name = "writes_into_b"

    def _bmm(self, a, b):
        out = exact(a, b).astype(np.int32)
        if b.flags.writeable:
            b[...] = 0
        return out

    def calls(self):
        yield pair(4, 6, 5, seed=18)


# ---------------------------------------------------------------- accumulator width / int8


class Int16Accumulator(Mutant):
    """Accumulates in int16, which wraps once a partial sum passes 32,767."""

    name = "int16_accumulator"

    def _bmm(self, a, b):
        return np.matmul(a.astype(np.int16), b.astype(np.int16)).astype(np.int32)

    def calls(self):
        yield np.full((2, 4), -128, np.int8), np.full((4, 3), -128, np.int8)


class Float32Unchunked(Mutant):
    """A 24-bit accumulator: float32 sgemm without splitting K."""

    name = "float32_unchunked"

    def _bmm(self, a, b):
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.int32)

    def calls(self):
        a, b = np.full((2, 1025), -128, np.int8), np.full((1025, 2), -128, np.int8)
        a[:, -1], b[-1] = 127, 127  # 2**24 + 127**2: odd, past float32's integers
        yield a, b


class ChunksSumInFloat32AtLargeK(Mutant):
    """Chunks K at 1024 (exact) but adds the chunks in float32 once K > 8192: wrong only
    at large K with large sums."""

    name = "chunks_sum_in_float32"

    def _bmm(self, a, b):
        k = a.shape[2]
        if k <= 8192:
            return exact(a, b).astype(np.int32)
        total = np.zeros(a.shape[:-1] + b.shape[-1:], np.float32)
        for k0 in range(0, k, 1024):
            total += exact(a[:, :, k0 : k0 + 1024], b[:, k0 : k0 + 1024]).astype(np.float32)
        return total.astype(np.int32)

    def calls(self):
        a, b = np.full((2, 9000), -128, np.int8), np.full((9000, 3), -128, np.int8)
        a[:, ::7], b[::5] = 127, 127  # chunk sums near 2**24, odd totals near 2**27
        yield a, b


class Int8NegationWraps(Mutant):
    """Multiplies |a| by sign-adjusted b with |a| in int8: |-128| wraps to -128."""

    name = "int8_negation_wraps"

    def _bmm(self, a, b):
        mag = np.abs(a)  # int8: np.abs(-128) == -128
        sign = np.where(a < 0, -1, 1).astype(np.int64)
        signed_b = b.astype(np.int64)
        return np.matmul(mag.astype(np.int64) * sign, signed_b).astype(np.int32)

    def calls(self):
        a, b = pair(4, 6, 3, seed=19)
        a[1, 2] = -128
        yield a, b


class SaturatingPairSums(Mutant):
    """vpmaddubsw-style: (a + 128) as uint8 times b, adjacent pairs summed in saturating
    int16, then 128 * colsum(b) subtracted: wrong whenever a pair saturates."""

    name = "saturating_pair_sums"

    def _bmm(self, a, b):
        k = a.shape[2]
        ua = a.astype(np.int32) + 128  # (B, M, K) in [0, 255]
        prods = ua[:, :, :, None] * b.astype(np.int32)[:, None, :, :]  # (B, M, K, N)
        if k % 2:
            prods = np.concatenate([prods, np.zeros_like(prods[:, :, :1])], axis=2)
        pairs = np.clip(prods[:, :, 0::2] + prods[:, :, 1::2], -32768, 32767)
        total = pairs.sum(axis=2, dtype=np.int64)
        return (total - 128 * b.astype(np.int64).sum(axis=1)[:, None, :]).astype(np.int32)

    def calls(self):
        yield np.full((2, 4), 127, np.int8), np.full((4, 3), 127, np.int8)


def corpus() -> list[Mutant]:
    """One fresh instance of every mutant (they keep state: pools, caches)."""
    return [cls() for cls in (
        LastCellTail, LastRowDropsLastK, DropsKTail, NTailZero, MTailRepeats, ManyRowsKTail,
        RowIndexWrapsInt8, SquareOutputTransposed, WrongAtOneK, WrongAtMlpWidth,
        LastBatchUsesPreviousA, BatchesOf16Only, FortranBAsC, ColumnStrideIgnored,
        TransposedBatchAsContiguous, PooledBuffer, UninitialisedOutput, AliasedResult,
        StaleCacheByAddress, WritesIntoB, Int16Accumulator, Float32Unchunked,
        ChunksSumInFloat32AtLargeK, Int8NegationWraps, SaturatingPairSums,
    )]


@dataclass(frozen=True)
class Score:
    """How one mutant fared."""

    name: str
    gate: bool  # the start-up gate refused it
    gate_case: str  # the gate case that refused it ('' if none): grid_* ones are the grid's
    check: bool  # gate + per-call check: every wrong product flagged, every result exact
    check_alone: bool  # the per-call check without the gate in front of it
    detail: str  # the gate's reason, or what the check saw
    # the check as it rides in the kernels' passes (Gemm.scaled), no gate in front of it;
    # None where the kernels do not fuse it (the numpy reference)
    fused_alone: bool | None = None


def run_calls(gemm: Any, mutant: Mutant) -> tuple[bool, int]:
    """(every result of the mutant's calls exact at the end, with each call's operands
    left as they were; products the check flagged)."""
    kept, intact = [], True
    for a, b in mutant.calls():
        a0, b0 = a.copy(), b.copy()
        got = gemm.bmm(a, b) if a.ndim == 3 else gemm.matmul(a, b)
        intact = intact and np.array_equal(a, a0) and np.array_equal(b, b0)
        kept.append((got, exact(a0, b0)))
    right = all(got.dtype == np.int32 and np.array_equal(got, want) for got, want in kept)
    return right and intact, gemm.check.failures


def run_fused_calls(gemm: Any, mutant: Mutant) -> tuple[bool, int]:
    """run_calls through Gemm.scaled, the check fused into the epilogue: A @ (B @ r) from
    the operands (as quantize_dots gives it), unit scales, so each result is its product
    in float32; a product too wide for the fused check takes matmul's path."""
    kept, intact = [], True
    for a, b in mutant.calls():
        a0, b0 = a.copy(), b.copy()
        r = gemm.check_vectors(b.shape[-1])
        if r is None:
            got = (gemm.bmm(a, b) if a.ndim == 3 else gemm.matmul(a, b)).astype(np.float32)
        else:
            lhs = np.matmul(a.astype(np.int64), np.matmul(b.astype(np.int64), r)[..., None])
            got = gemm.scaled(a, b, np.ones(a.shape[:-1], np.float32),
                              np.ones(b.shape[:-2] + b.shape[-1:], np.float32), r, lhs[..., 0])
        intact = intact and np.array_equal(a, a0) and np.array_equal(b, b0)
        kept.append((got, exact(a0, b0).astype(np.float32)))
    right = all(got.tobytes() == want.tobytes() for got, want in kept)
    return right and intact, gemm.check.failures


class CheckedOnly:
    """The per-call check with no gate in front: a product that fails it is recomputed on
    numpy_int, as Gemm does (for the comparison column of the benchmark)."""

    def __init__(self, backend: GemmBackend, kernels: Kernels) -> None:
        self.backend, self.check = backend, ProductCheck(kernels)
        self.fallback = NumpyIntBackend()

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = self.backend.matmul(a, b)
        return out if self.check.holds(a, b, out) else self.fallback.matmul(a, b)

    def bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = self.backend.bmm(a, b)
        return out if self.check.holds(a, b, out) else self.fallback.bmm(a, b)


def score(cls: type[Mutant], units: Any, gate: ExactGate, kernels: Kernels = REFERENCE) -> Score:
    """Run one mutant past the gate, then (if it got in) through Gemm(check=True); and,
    for comparison, through the per-call check with no gate in front of it.

    units: has .mul_lut (256, 256) and .counts.add (verified Units, or a test double).
    gate: an ExactGate on units.mul_lut's reference (built once: it computes its cases)."""
    report = gate.run(cls())
    checked, detail = False, f"gate: {report.failing_case}: {report.detail}"
    if report.passed:
        never = 10**9  # the sampled audit off: it is not what is measured here
        gemm = select_gemm(units, order=[cls(), "numpy_int"], kernels=kernels, audit_every=never)
        right, flagged = run_calls(gemm, gemm.backend)  # the gated-in instance
        checked = right and flagged > 0
        detail = f"passed the gate; the check flagged {flagged} product(s); results exact: {right}"
    right_alone, flagged_alone = run_calls(CheckedOnly(cls(), kernels), cls())
    fused = None
    if kernels.fuses_check:  # the mutant forced in as the selected backend, no gate
        gemm = select_gemm(units, order=["numpy_int", "numpy_int"], kernels=kernels,
                           audit_every=10**9)  # the second: what the demotion falls to
        gemm.backend = mutant = cls()
        gemm.audit.calls = 1  # not even the audit's first call: the check alone
        right_fused, flagged_fused = run_fused_calls(gemm, mutant)
        fused = right_fused and flagged_fused > 0
    return Score(cls.name, not report.passed, report.failing_case or "",
                 not report.passed or checked,
                 right_alone and flagged_alone > 0, detail, fused)


def classes() -> list[type[Mutant]]:
    return [type(m) for m in corpus()]
