"""The exact gate: a backend is trusted only if it matches the LUT reference bit for bit.

The cases aim at where fast kernels break: tail rows/columns past a SIMD or block width,
K exactly at and just past the float32 chunk limit (1024, 1025, 2049), operands at the
int8 extremes whose sums reach the int32 bound (K = 131,071 of (-128)(-128) = 2**31 -
16,384) or land on odd integers just past 2**24, strided, reversed and transposed
operands, batches, and a second sweep of every shape with fresh data after the heap
was filled with junk, which catches kernels that reuse or assume zeroed buffers. Beyond
these fixed cases a small structured grid (`grid_shapes`) puts every dimension on every
residue modulo 8 and on 0 and b - 1 modulo each block width b of 16, 32 and 64, with
row counts up to 191, square and non-square outputs and batches of 16 and more.
Every result is compared again after the last case, so a backend that returns a buffer
it reuses (a later call overwrites an earlier result) fails too. Operands come from
pynode.core.rng, so every peer gates on the same bits. Results are
compared with np.array_equal on int32, never approximately.

Legend: B batch, M rows, K reduction length, N columns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pynode.core import rng
from pynode.core.gemm.base import MAX_K, GemmBackend

GATE_PURPOSE = 0x6A7E
POISON = 0x7F5A7F5A  # as float32 a large finite number, as int32 a large positive one


@dataclass(frozen=True)
class GateCase:
    """One product to check: `a @ b`, batched (3-d operands, bmm) or not (matmul)."""

    name: str
    a: np.ndarray  # (M, K) or (B, M, K) int8
    b: np.ndarray  # (K, N) or (B, K, N) int8


@dataclass(frozen=True)
class GateReport:
    """What a gate found: the first failing case stops it."""

    backend: str  # backend name
    passed: bool  # every case matched the reference bit for bit
    failing_case: str | None  # name of the first case that did not match
    seconds: float  # wall time of the gated backend over the cases (reference excluded)
    cases: int  # cases run (up to and including a failing one)
    detail: str = ""  # why the failing case failed (cell, expected, got; or the exception)


def _random(key: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    return (rng.randint(key, shape, 256) - 128).astype(np.int8)


def _extremes(shape: tuple[int, ...], line_axis: int) -> np.ndarray:
    """int8 extremes, one of three patterns per line (rows of A, columns of B) by index % 3:
    all -128, all 127, and -128 except 127 at the last k. Products of these lines reach the
    int32 bound (+2**14 K), its negative side (-128 * 127 K), and odd sums just past
    2**24 (2**14 (K - 1) + 127**2) that float32 cannot hold unless K is chunked."""
    k_axis = -1 if line_axis == -2 else -2
    out = np.full(shape, -128, np.int8)
    pattern = np.arange(shape[line_axis]) % 3  # (lines,) int
    lines = [slice(None)] * len(shape)
    lines[line_axis] = pattern == 1
    out[tuple(lines)] = 127
    lines[line_axis] = pattern == 2
    lines[k_axis] = -1
    out[tuple(lines)] = 127
    return out


def _case_specs() -> list[tuple[str, str, tuple[int, ...], tuple[int, ...]]]:
    """(name, fill, a shape, b shape); fill 'random' or 'extremes'."""
    return [
        ("tiny_1x1x1", "random", (1, 1), (1, 1)),
        ("odd_tails", "random", (37, 129), (129, 67)),
        ("single_row", "random", (1, 300), (300, 50)),
        ("single_col", "random", (50, 300), (300, 1)),
        ("block_random", "random", (96, 256), (256, 112)),
        ("k1024_extremes", "extremes", (9, 1024), (1024, 11)),
        ("k1025_extremes", "extremes", (9, 1025), (1025, 13)),
        ("k1025_random", "random", (7, 1025), (1025, 13)),
        ("k2049_extremes", "extremes", (6, 2049), (2049, 5)),
        ("k2049_random", "random", (5, 2049), (2049, 6)),
        ("kmax_extremes", "extremes", (3, MAX_K), (MAX_K, 3)),
        ("batched_random", "random", (3, 19, 65), (3, 65, 23)),
        ("batched_k1025_extremes", "extremes", (2, 5, 1025), (2, 1025, 7)),
    ]


# Offsets within a 64-wide block: 9j lies at residue j of 8 in the j-th 8-wide sub-block,
# so the offsets reach every residue mod 8, 0 and b - 1 mod every b in (8, 16, 32, 64),
# and 1 (a one-element tail).
GRID_OFFSETS = (*range(0, 64, 9), 1)
GRID_BATCHES = (16, 17, 33)  # a full 16, one past it, one past 32


def grid_shapes() -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(a shape, b shape) of the structured grid: a Latin rotation of GRID_OFFSETS over
    (M, K, N), so each dimension takes every offset once, on 64-wide block bases that
    give 64-191 rows; every third output is square (64-118); then small batched products."""
    off, count = GRID_OFFSETS, len(GRID_OFFSETS)
    shapes = []
    for i in range(count):
        square = i % 3 == 0
        m = 64 * (1 + (i % 2 and not square)) + off[i]  # squares cost M^2 K: the lower base
        k = (0 if square else 64 * (i // 3 % 2)) + off[(i + 3) % count] or 64
        n = m if square else off[(i + 6) % count] + 64 * (i // 2 % 2) or 64
        shapes.append(((m, k), (k, n)))
    for j, bs in enumerate(GRID_BATCHES):
        m = off[(3 * j + 1) % count] % 32 or 32
        k = off[(3 * j + 2) % count] + 1
        n = off[(3 * j + 4) % count] % 32 or 32
        shapes.append(((bs, m, k), (bs, k, n)))
    return shapes


def _grid_cases(seed: int, tag: str) -> list[GateCase]:
    cases = []
    for i, (a_shape, b_shape) in enumerate(grid_shapes()):
        a = _random((GATE_PURPOSE, seed, 200, i, 0), a_shape)
        b = _random((GATE_PURPOSE, seed, 200, i, 1), b_shape)
        dims = "x".join(map(str, (*a_shape, b_shape[-1])))
        cases.append(GateCase(f"grid_{dims}{tag}", a, b))
    return cases


def _layout_cases(seed: int, tag: str) -> list[GateCase]:
    """Operands that are views: strided, reversed, transposed (matmul and bmm)."""
    k = (GATE_PURPOSE, seed, 100)
    strided_a = _random(k + (0,), (62, 600))[::2, ::3]  # (31, 200) int8, strides (1200, 3)
    fortran_b = _random(k + (1,), (45, 200)).T  # (200, 45) int8, F-order
    reversed_a = _random(k + (2,), (50, 77))[::-1]  # (50, 77) int8, negative row stride
    reversed_b = _random(k + (3,), (77, 40))[:, ::-1]  # (77, 40) int8, negative col stride
    bt_a = _random(k + (4,), (3, 33, 17)).transpose(0, 2, 1)  # (3, 17, 33) int8
    bt_b = _random(k + (5,), (3, 9, 33)).transpose(0, 2, 1)  # (3, 33, 9) int8
    # an outer product of transposed views: the size-1 axes keep their old strides (40, 1),
    # which numpy ignores and torch's _int_mm reads as a leading dimension (garbage)
    outer_a = _random(k + (6,), (1, 40)).T  # (40, 1) int8, strides (1, 40)
    outer_b = _random(k + (7,), (30, 1)).T  # (1, 30) int8, strides (1, 1)
    return [
        GateCase("strided" + tag, strided_a, fortran_b),
        GateCase("reversed" + tag, reversed_a, reversed_b),
        GateCase("batched_transposed" + tag, bt_a, bt_b),
        GateCase("outer_views" + tag, outer_a, outer_b),
    ]


def gate_cases(seed: int = 0, tag: str = "") -> list[GateCase]:
    """The gate's cases for one sweep; a different seed gives the same shapes, new data."""
    cases = []
    for i, (name, fill, a_shape, b_shape) in enumerate(_case_specs()):
        if fill == "extremes":
            a, b = _extremes(a_shape, -2), _extremes(b_shape, -1)
        else:
            a = _random((GATE_PURPOSE, seed, i, 0), a_shape)
            b = _random((GATE_PURPOSE, seed, i, 1), b_shape)
        cases.append(GateCase(name + tag, a, b))
    return cases + _layout_cases(seed, tag) + _grid_cases(seed, tag)


def _product(backend: GemmBackend, case: GateCase) -> np.ndarray:
    if case.a.ndim == 3:
        return backend.bmm(case.a, case.b)
    return backend.matmul(case.a, case.b)


def mismatch(got: object, want: np.ndarray) -> str:
    """'' when got equals want bit for bit, else a readable description of the difference."""
    if not isinstance(got, np.ndarray):
        return f"returned {type(got).__name__}, not an ndarray"
    if got.dtype != np.int32 or got.shape != want.shape:
        return f"returned {got.dtype} {got.shape}, expected int32 {want.shape}"
    if np.array_equal(got, want):
        return ""
    bad = np.argwhere(got != want)
    cell = tuple(int(i) for i in bad[0])
    return f"{len(bad)} cells differ; first {cell}: expected {want[cell]}, got {got[cell]}"


def poison_heap(sizes_bytes: list[int]) -> None:
    """Fill freshly allocated blocks of these sizes with junk and free them again, so the
    allocator hands dirty memory to whatever allocates next."""
    junk = [np.full(max(1, n // 4), POISON, np.int32) for n in sizes_bytes]
    del junk


class ExactGate:
    """Runs the gate cases against any backend; the reference results are computed once,
    up front, so a report's seconds are the gated backend's alone."""

    def __init__(self, reference: GemmBackend, seed: int = 0) -> None:
        t0 = time.perf_counter()
        self._sweeps = [gate_cases(seed), gate_cases(seed + 1, tag="/dirty")]
        self._expected = {c.name: _product(reference, c) for s in self._sweeps for c in s}
        self.reference_seconds = time.perf_counter() - t0  # building cases + reference results

    def _poison_sizes(self, sweep: list[GateCase]) -> list[int]:
        sizes = []
        for c in sweep:
            out = self._expected[c.name].size
            sizes += [4 * c.a.size, 4 * c.b.size, 4 * out, 8 * out]
        return sizes

    def _check(self, backend: GemmBackend, case: GateCase) -> tuple[str, object]:
        """(why the case failed or '', the backend's result)."""
        want = self._expected[case.name]
        a0, b0 = case.a.copy(), case.b.copy()
        try:
            got = _product(backend, case)
        except Exception as exc:  # any exception on valid operands fails the gate
            return f"raised {type(exc).__name__}: {exc}", None
        if not (np.array_equal(case.a, a0) and np.array_equal(case.b, b0)):
            case.a[...], case.b[...] = a0, b0  # the next backend gates on the same operands
            return "modified its input operands", got
        return mismatch(got, want), got

    def run(self, backend: GemmBackend) -> GateReport:
        """Gate `backend`: every case of both sweeps must match the reference exactly, and
        every result must still match once all cases ran (a fresh array, not a reused one)."""
        t0 = time.perf_counter()
        run = 0
        kept: list[tuple[str, object]] = []
        for sweep_index, sweep in enumerate(self._sweeps):
            if sweep_index:
                poison_heap(self._poison_sizes(sweep))
            for case in sweep:
                run += 1
                detail, got = self._check(backend, case)
                if detail:
                    seconds = time.perf_counter() - t0
                    return GateReport(backend.name, False, case.name, seconds, run, detail)
                kept.append((case.name, got))
        for name, got in kept:
            changed = mismatch(got, self._expected[name])
            if changed:
                detail = (f"its result changed after later calls ({changed}): it returns a "
                          "buffer it reuses, not a fresh array")
                return GateReport(backend.name, False, name, time.perf_counter() - t0, run, detail)
        return GateReport(backend.name, True, None, time.perf_counter() - t0, run)
