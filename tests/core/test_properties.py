"""Metamorphic properties of every GEMM backend this runtime has, and of detmath.

Each property relates two computations that must agree bit for bit, so no oracle is
needed: a transposed product, K split into blocks, permuted rows, columns and K, zero and
identity operands, batches against single products, views against copies; detmath's
symmetries (odd functions, sqrt(x * x) = |x|, power-of-four scaling of rsqrt), exact sums
of integers, pmax under any order, softmax under an exact shift and its monotonicity.

The test functions are plain (seeded loops, no fixtures), so tests/pyodide runs this module
on wasm too, the page's wasm_simd backend included. Natively, hypothesis drives the same
checks over drawn shapes and values as well (skipped where it is not installed).

Legend: B batch, M rows, K reduction length, N columns.
"""

from __future__ import annotations

import os
import unittest

import numpy as np

from pynode.core import detmath
from pynode.core.gemm.numpy_int import NumpyIntBackend
from pynode.gemm_backends import available_backends, backend_order

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # Pyodide: the seeded loops below run alone
    given = None

VALUES = np.arange(-128, 128, dtype=np.int64)
LUT = (VALUES[:, None] * VALUES[None, :]).astype(np.int32)  # (256, 256) int32
SHAPES = 12  # seeded shapes per property in the plain tests
# hypothesis examples: all in the full suite (PYNODE_FULL_SUITE=1 or CI), a quarter otherwise
FULL_SUITE = os.environ.get("PYNODE_FULL_SUITE") == "1" or os.environ.get("CI") == "true"


def examples(full: int) -> int:
    return full if FULL_SUITE else max(5, full // 4)


def backends() -> list:
    """Every backend this runtime can build (torch natively if it imports, wasm_simd in
    the page), in gate order."""
    names = tuple(dict.fromkeys(("blas_float", "torch", "numpy_int", "reference",
                                 *backend_order())))
    found, _ = available_backends(names, LUT)
    if not found:
        raise unittest.SkipTest("no GEMM backend can run here")
    return found


def int8(g: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return g.integers(-128, 128, shape).astype(np.int8)


def shapes(seed: int, count: int = SHAPES) -> list[tuple[int, int, int]]:
    """Seeded (M, K, N), tails and 1s included."""
    g = np.random.default_rng(seed)
    return [tuple(int(x) for x in g.integers(1, 40, 3)) for _ in range(count)]


# ---------------------------------------------------------------- GEMM properties


def check_gemm_properties(backend, a: np.ndarray, b: np.ndarray, g: np.random.Generator) -> None:
    """Every metamorphic relation on a (M, K) int8 @ b (K, N) int8, bit for bit."""
    (m, k), n = a.shape, b.shape[1]
    c = backend.matmul(a, b)  # (M, N) int32
    name = f"{backend.name} {m}x{k}x{n}"
    assert c.dtype == np.int32 and c.shape == (m, n), name
    assert np.array_equal(backend.matmul(b.T, a.T), c.T), f"transpose: {name}"
    cut = int(g.integers(0, k + 1))
    if 0 < cut < k:
        split = backend.matmul(a[:, :cut], b[:cut]) + backend.matmul(a[:, cut:], b[cut:])
        assert np.array_equal(split, c), f"K split at {cut}: {name}"
    rows, cols, inner = g.permutation(m), g.permutation(n), g.permutation(k)
    assert np.array_equal(backend.matmul(a[rows], b), c[rows]), f"row permutation: {name}"
    assert np.array_equal(backend.matmul(a, b[:, cols]), c[:, cols]), f"col permutation: {name}"
    assert np.array_equal(backend.matmul(a[:, inner], b[inner]), c), f"K permutation: {name}"
    zero = a.copy()
    zero[m // 2] = 0
    zc = backend.matmul(zero, b)
    assert not zc[m // 2].any() and np.array_equal(np.delete(zc, m // 2, 0),
                                                   np.delete(c, m // 2, 0)), f"zero row: {name}"
    eye_k = np.eye(k, dtype=np.int8)
    assert np.array_equal(backend.matmul(a, eye_k), a.astype(np.int32)), f"A @ I: {name}"
    assert np.array_equal(backend.matmul(eye_k, b), b.astype(np.int32)), f"I @ B: {name}"
    no_min = np.maximum(a, -127)  # -(-128) is not an int8
    assert np.array_equal(backend.matmul(-no_min, b), -backend.matmul(no_min, b)), f"-A: {name}"
    stacked = backend.matmul(np.concatenate([a, a[::-1]]), b)
    assert np.array_equal(stacked, np.concatenate([c, c[::-1]])), f"row stacking: {name}"
    views = [(np.asfortranarray(a), b), (a, np.asfortranarray(b)), (a[::-1], b)]
    wants = [c, c, c[::-1]]
    for (va, vb), want in zip(views, wants, strict=True):
        assert np.array_equal(backend.matmul(va, vb), want), f"views: {name}"


def check_bmm_properties(backend, a: np.ndarray, b: np.ndarray, g: np.random.Generator) -> None:
    """a (B, M, K) int8, b (B, K, N) int8: a batch equals its matrices, in any order."""
    c = backend.bmm(a, b)  # (B, M, N) int32
    name = f"{backend.name} bmm {a.shape} {b.shape}"
    for i in range(a.shape[0]):
        assert np.array_equal(c[i], backend.matmul(a[i], b[i])), f"batch {i}: {name}"
    order = g.permutation(a.shape[0])
    assert np.array_equal(backend.bmm(a[order], b[order]), c[order]), f"batch order: {name}"
    swapped = backend.bmm(b.transpose(0, 2, 1), a.transpose(0, 2, 1))
    assert np.array_equal(swapped, c.transpose(0, 2, 1)), f"batched transpose: {name}"


def test_gemm_metamorphic_properties_on_seeded_shapes():
    for backend in backends():
        g = np.random.default_rng(11)
        for m, k, n in shapes(1):
            check_gemm_properties(backend, int8(g, (m, k)), int8(g, (k, n)), g)


def test_bmm_metamorphic_properties_on_seeded_shapes():
    for backend in backends():
        g = np.random.default_rng(12)
        for m, k, n in shapes(2, 6):
            bs = int(g.integers(1, 18))
            check_bmm_properties(backend, int8(g, (bs, m, k)), int8(g, (bs, k, n)), g)


def test_gemm_extremes_keep_the_properties():
    """All -128 and all 127 operands: the largest sums, where a narrow accumulator wraps."""
    g = np.random.default_rng(13)
    for backend in backends():
        for k in (1, 255, 1025):
            a = np.full((3, k), -128, np.int8)
            a[1] = 127
            b = np.full((k, 2), -128, np.int8)
            check_gemm_properties(backend, a, b, g)


class _DropsKTail(NumpyIntBackend):
    """Wrong: a K loop in steps of 8 that forgets the K % 8 tail."""

    name = "drops_k_tail"

    def _matmul(self, a, b):
        k = a.shape[1] - a.shape[1] % 8 if a.shape[1] > 8 else a.shape[1]
        return super()._matmul(np.ascontiguousarray(a[:, :k]), np.ascontiguousarray(b[:k]))


class _LastRowTail(NumpyIntBackend):
    """Wrong: the last row off by one when M is not a multiple of 4."""

    name = "last_row_tail"

    def _matmul(self, a, b):
        out = super()._matmul(a, b)
        if a.shape[0] % 4:
            out[-1] += 1
        return out


def test_the_properties_catch_wrong_backends_without_an_oracle():
    for wrong in (_DropsKTail(), _LastRowTail()):
        g = np.random.default_rng(17)
        failed = 0
        for m, k, n in shapes(1):
            try:
                check_gemm_properties(wrong, int8(g, (m, k)), int8(g, (k, n)), g)
            except AssertionError:
                failed += 1
        assert failed >= SHAPES // 2, (wrong.name, failed)


# ---------------------------------------------------------------- detmath properties

def finite(g: np.random.Generator, n: int, dtype, scale: float = 30.0) -> np.ndarray:
    """Values of all magnitudes: scaled normals, some tiny, some integers, zeros."""
    x = g.standard_normal(n) * scale
    x[::7] *= 1e-30
    x[::11] = np.rint(x[::11])
    x[::13] = 0.0
    return x.astype(dtype)


def check_detmath_properties(x: np.ndarray) -> None:
    """Symmetries and identities that hold bit for bit (x finite, float32 or float64)."""
    dt = x.dtype
    for fn in (detmath.tanh, detmath.erf, detmath.sinpi):
        assert np.array_equal(fn(-x), -fn(x)), (fn.__name__, dt)
    assert np.array_equal(detmath.cospi(-x), detmath.cospi(x)), dt
    small = np.abs(x) < (np.sqrt(np.finfo(dt).max) / 2)
    tiny = np.abs(x) > np.sqrt(np.finfo(dt).smallest_normal) * 4
    ok = x[small & tiny]
    assert np.array_equal(detmath.sqrt(ok * ok), np.abs(ok)), dt  # a correctly rounded sqrt
    pos = np.abs(ok)
    assert np.array_equal(detmath.rsqrt(pos * dt.type(4)), detmath.rsqrt(pos) / dt.type(2)), dt
    ints = np.rint(np.clip(x, -1e4, 1e4))  # small integers: every partial sum exact
    assert detmath.psum(ints) == dt.type(int(np.sum(ints.astype(np.int64)))), dt
    assert detmath.psum(-x) == -detmath.psum(x), dt
    assert detmath.psum(x * dt.type(2)) == detmath.psum(x) * dt.type(2), dt
    g = np.random.default_rng(len(x))
    assert detmath.pmax(x[g.permutation(len(x))]) == detmath.pmax(x), dt


def check_softmax_properties(rows: np.ndarray, shift: float) -> None:
    """rows (r, n) integer-valued: an integer shift is exact, so softmax does not move by a
    bit; softmax is monotone along a row, and logsumexp of one value is that value."""
    dt = rows.dtype
    moved = rows + dt.type(shift)
    assert np.array_equal(detmath.softmax(moved), detmath.softmax(rows)), dt
    p = detmath.softmax(rows)
    order = np.argsort(rows, axis=1, kind="stable")
    assert np.all(np.diff(np.take_along_axis(p, order, 1), axis=1) >= 0), dt
    assert np.array_equal(detmath.logsumexp(rows[:, :1]), rows[:, 0]), dt
    assert np.all(detmath.softmax(rows[:, :1]) == 1), dt


def test_detmath_symmetries_and_exact_identities():
    g = np.random.default_rng(14)
    for dtype in (np.float32, np.float64):
        for scale in (0.5, 30.0, 1e6):
            check_detmath_properties(finite(g, 501, dtype, scale))


def test_detmath_elementwise_functions_are_monotone_in_float32():
    """Correctly rounded results (float32, docs/VERIFICATION.md) never step backwards."""
    g = np.random.default_rng(15)
    x = np.sort(finite(g, 4001, np.float32, 8.0))
    for fn in (detmath.exp, detmath.expm1, detmath.tanh, detmath.erf):
        assert np.all(np.diff(fn(x)) >= 0), fn.__name__
    assert np.all(np.diff(detmath.erfc(x)) <= 0)
    assert np.all(np.diff(detmath.gelu(x[x > -0.75])) >= 0)  # its minimum is near -0.7518
    positive = np.sort(np.abs(x[x != 0]))
    assert np.all(np.diff(detmath.log(positive)) >= 0)
    assert np.all(np.diff(detmath.rsqrt(positive)) <= 0)


def test_softmax_moves_with_an_exact_shift_and_is_monotone():
    g = np.random.default_rng(16)
    for dtype in (np.float32, np.float64):
        rows = np.rint(g.standard_normal((9, 23)) * 20).astype(dtype)
        for shift in (-1000.0, -3.0, 5.0, 64.0):
            check_softmax_properties(rows, shift)


# ---------------------------------------------------------------- hypothesis (natively)

if given is not None:
    DIMS = st.integers(1, 40)

    @settings(max_examples=examples(40), deadline=None, database=None)
    @given(DIMS, DIMS, DIMS, st.integers(0, 2**32 - 1))
    def test_gemm_properties_hold_for_drawn_shapes(m, k, n, seed):
        g = np.random.default_rng(seed)
        a, b = int8(g, (m, k)), int8(g, (k, n))
        for backend in backends():
            check_gemm_properties(backend, a, b, g)

    @settings(max_examples=examples(25), deadline=None, database=None)
    @given(st.integers(1, 20), DIMS, DIMS, DIMS, st.integers(0, 2**32 - 1))
    def test_bmm_properties_hold_for_drawn_shapes(bs, m, k, n, seed):
        g = np.random.default_rng(seed)
        for backend in backends():
            check_bmm_properties(backend, int8(g, (bs, m, k)), int8(g, (bs, k, n)), g)

    @settings(max_examples=examples(60), deadline=None, database=None)
    @given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1,
                    max_size=50), st.sampled_from([np.float32, np.float64]))
    def test_detmath_properties_hold_for_drawn_values(values, dtype):
        check_detmath_properties(np.array(values, dtype))

    @settings(max_examples=examples(40), deadline=None, database=None)
    @given(st.lists(st.integers(-200, 200), min_size=1, max_size=40),
           st.integers(-1000, 1000), st.sampled_from([np.float32, np.float64]))
    def test_softmax_properties_hold_for_drawn_rows(values, shift, dtype):
        check_softmax_properties(np.array([values], dtype), float(shift))


