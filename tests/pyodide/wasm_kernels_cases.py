"""Runs inside Pyodide (see test_under_pyodide.py): the page's wasm SIMD hot kernels.

They must pass the kernel gate, give the numpy reference's bytes on random shapes, strides,
batches and odd tails (and on special values, through the reference), fail the gate when
broken, and be what the page's start-up checks pick. Skips (with the reason) where the
runtime cannot load them.
"""

import itertools
import unittest

import numpy as np

from pynode.core.errors import NonFiniteError
from pynode.core.gemm import BackendUnavailableError
from pynode.core.kernels import REFERENCE, gate_kernels

SEED = 0x5EED


def kernels():
    from pynode.browser_kernels import WasmKernels

    try:
        return WasmKernels()
    except BackendUnavailableError as exc:
        raise unittest.SkipTest(f"wasm kernels unavailable here: {exc}") from exc


def same(got, want, what) -> None:
    """Equal dtype, shape and raw bytes (so -0.0 and NaN payloads count)."""
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (what, g.dtype, g.shape, w.shape)
        assert g.tobytes() == w.tobytes(), (what, int(np.count_nonzero(
            g.reshape(-1).view(np.uint8) != w.reshape(-1).view(np.uint8))))


def normal(g, shape, spread=6.0):
    """Normal values with a random power-of-ten size per row (1e-spread .. 1e+spread)."""
    size = 10.0 ** g.uniform(-spread, spread, tuple(shape[:-1]) + (1,))
    return (g.standard_normal(shape) * size).astype(np.float32)


def test_wasm_kernels_pass_the_gate():
    report = gate_kernels(kernels())
    assert report.passed, report
    assert report.kernels == "wasm" and report.cases >= 54, report


def test_quantize_equals_the_reference_on_random_shapes_and_views():
    fast, g = kernels(), np.random.default_rng(SEED)
    for i in range(24):
        shape = tuple(int(d) for d in g.integers(1, 40, size=int(g.integers(2, 5))))
        x = normal(g, shape, spread=30)
        x.reshape(-1)[:: max(1, x.size // 5)] = 0.0  # zeros, and all-zero rows of one
        x.reshape(-1)[1 :: max(2, x.size // 3)] = -0.0
        views = [x, np.swapaxes(x, -1, -2), x[..., ::2, :], x[..., ::-1]]
        for v, view in enumerate(views):
            for axis in (-1, -2):
                for key in (None, (i, v, axis + 2)):
                    same(fast.quantize(view, axis, key), REFERENCE.quantize(view, axis, key),
                         ("quantize", view.shape, view.strides, axis, key))
    ties = np.arange(-300, 300, dtype=np.float32).reshape(6, 100) / np.float32(2)
    for axis in (-1, -2):
        same(fast.quantize(ties, axis, None), REFERENCE.quantize(ties, axis, None), "ties")


def test_epilogue_equals_the_reference_on_random_shapes():
    fast, g = kernels(), np.random.default_rng(SEED + 1)
    for _ in range(20):
        lead = tuple(int(d) for d in g.integers(1, 4, size=int(g.integers(0, 3))))
        m, n = (int(d) for d in g.integers(1, 40, size=2))
        acc = g.integers(-(2**31), 2**31, lead + (m, n), dtype=np.int64).astype(np.int32)
        sa, sb = normal(g, lead + (m,)), normal(g, lead + (n,))
        same(fast.epilogue(acc, sa, sb), REFERENCE.epilogue(acc, sa, sb), (lead, m, n))
        view = acc[..., ::-1, :]
        same(fast.epilogue(view, sa, sb), REFERENCE.epilogue(view, sa, sb), "view")


def test_gelu_equals_the_reference_on_random_sizes():
    fast, g = kernels(), np.random.default_rng(SEED + 2)
    sizes = [1, 2, 3, 4, 5, 7, 8, 9, 63, 64, 65, 1023, 20000]
    for n in sizes:
        x = (g.standard_normal(n) * 10.0 ** g.uniform(-3, 1.5)).astype(np.float32)
        same(fast.gelu_with_grad(x), REFERENCE.gelu_with_grad(x), n)
    grid = np.linspace(-16, 16, 64001, dtype=np.float32).reshape(1, 64001)  # every branch
    same(fast.gelu_with_grad(grid), REFERENCE.gelu_with_grad(grid), "grid")
    tiny = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-38, 3e38, -3e38], np.float32)
    same(fast.gelu_with_grad(tiny), REFERENCE.gelu_with_grad(tiny), "extremes")
    x = normal(g, (5, 7, 9))
    same(fast.gelu_with_grad(x[:, ::2]), REFERENCE.gelu_with_grad(x[:, ::2]), "strided")


def test_softmaxes_equal_the_reference_with_and_without_masks():
    fast, g = kernels(), np.random.default_rng(SEED + 3)
    for n in (1, 2, 3, 4, 5, 6, 7, 9, 16, 33, 64, 257):
        x = normal(g, (3, n, n), spread=1.5)
        causal = np.tri(n, dtype=bool)
        same(fast.softmax_rows(x), REFERENCE.softmax_rows(x), ("plain", n))
        same(fast.softmax_rows(x, causal), REFERENCE.softmax_rows(x, causal), ("causal", n))
        same(fast.softmax_rows(x[:, ::-1]), REFERENCE.softmax_rows(x[:, ::-1]), ("view", n))
        keep = g.random((3, n, n)) < 0.6
        keep[..., 0] = True  # every row keeps one entry ...
        same(fast.softmax_rows(x, keep), REFERENCE.softmax_rows(x, keep), ("random", n))
        row_mask = g.random(n) < 0.5
        row_mask[-1] = True
        same(fast.softmax_rows(x, row_mask), REFERENCE.softmax_rows(x, row_mask), ("1-d", n))
        logits = normal(g, (int(g.integers(1, 40)), n), spread=1.5)
        same(fast.log_softmax_parts(logits), REFERENCE.log_softmax_parts(logits), ("lse", n))
    keep[1, 2] = False  # ... but one: its row is 0/0, left to the reference
    same(fast.softmax_rows(x, keep), REFERENCE.softmax_rows(x, keep), "a row with none kept")
    flat = normal(g, (37,))
    same(fast.softmax_rows(flat), REFERENCE.softmax_rows(flat), "1-d input")


def test_psum_rows_equals_the_reference_for_every_input():
    fast, g = kernels(), np.random.default_rng(SEED + 4)
    for dtype in (np.float32, np.float64):
        for n in (1, 2, 3, 4, 5, 7, 8, 9, 31, 64, 129, 1000):
            x = normal(g, (int(g.integers(1, 9)), 3, n)).astype(dtype)
            same(fast.psum_rows(x), REFERENCE.psum_rows(x), (dtype, n))
            same(fast.psum_rows(x[..., ::2]), REFERENCE.psum_rows(x[..., ::2]), "strided")
        big = np.full((4, 9), np.finfo(dtype).max, dtype)
        big[1, 4] = -np.inf  # inf + -inf: NaN, canonical like the reference's
        big[2, 0], big[3] = np.nan, -0.0
        same(fast.psum_rows(big), REFERENCE.psum_rows(big), (dtype, "overflow, inf, nan, -0"))
        vec = normal(g, (11,)).astype(dtype)
        same(fast.psum_rows(vec), REFERENCE.psum_rows(vec), "1-d: a 0-d sum")


def test_product_holds_equals_the_reference_on_right_and_wrong_products():
    """Every layout of every operand (row-major, transposed, strided: copied), 2-d and
    batched, V vectors, odd tails; right products, one wrong cell anywhere, a cell past the
    bound, and the bound's own edge."""
    fast, g = kernels(), np.random.default_rng(SEED + 5)

    def layouts(x):
        return [x, x.swapaxes(-1, -2).copy().swapaxes(-1, -2),
                np.repeat(x, 2, axis=-1)[..., ::2]]  # row-major, its transpose, strided

    def agree(a, b, out, r, what):
        want = REFERENCE.product_holds(a, b, out, r)
        got = fast.product_holds(a, b, out, r)
        assert type(got) is bool and got == want, (what, got, want)
        return want

    verdicts = []
    for i in range(20):
        batch = () if i % 3 == 0 else (int(g.integers(1, 4)),)
        m, k, n = (int(d) for d in g.integers(1, 70, size=3))
        a = g.integers(-128, 128, batch + (m, k)).astype(np.int8)
        b = g.integers(-128, 128, batch + (k, n)).astype(np.int8)
        right = np.matmul(a.astype(np.int32), b.astype(np.int32))
        # entries from 1: a single wrong cell d moves out @ r by d * r_j != 0
        r = g.integers(1, 1 << 16, (int(g.integers(1, 4)), n)).astype(np.float64)
        wrong = right.copy()
        wrong[tuple(int(g.integers(0, d)) for d in wrong.shape)] += int(g.choice([-1, 1, 1000]))
        huge = right.copy()
        huge.reshape(-1)[-1] = -(2**31)
        for what, out in {"right": right, "wrong": wrong, "huge": huge}.items():
            for av, bv, ov in itertools.product(layouts(a), layouts(b), layouts(out)):
                verdicts.append((what, agree(av, bv, ov, r, (i, what, a.shape, b.shape))))
    assert {v for what, v in verdicts if what == "right"} == {True}
    assert {v for what, v in verdicts if what != "right"} == {False}
    # the bound 2**14 * K: a product at the bound passes the bound test, one past it fails
    a = np.full((1, 3), -128, np.int8)
    b = np.full((3, 2), -128, np.int8)
    out = np.matmul(a.astype(np.int32), b.astype(np.int32))  # every cell 3 * 2**14
    r = np.ones((1, 2))
    assert agree(a, b, out, r, "at the bound")
    out[0, 1] += 1
    assert not agree(a, b, out, r, "past the bound")


def test_special_values_get_the_reference_refusals_and_bits():
    fast = kernels()
    x = np.ones((4, 5), np.float32)
    x[2, 3] = np.nan
    for view in (x, x.T):  # x.T: the transposed view goes through the other axis's kernel
        for axis in (-1, -2):
            for key in (None, (1, 2)):
                try:
                    fast.quantize(view, axis, key)
                except NonFiniteError:
                    continue
                raise AssertionError(f"quantize took a NaN ({view.shape}, axis {axis}, key {key})")
    specials = np.array([np.inf, -np.inf, np.nan, 1.0, -2.5], np.float32)
    same(fast.gelu_with_grad(specials), REFERENCE.gelu_with_grad(specials), "gelu specials")
    rows = np.array([[1.0, np.inf, 2.0], [-np.inf, 0.0, 1.0]], np.float32)
    same(fast.softmax_rows(rows), REFERENCE.softmax_rows(rows), "softmax with inf")
    same(fast.log_softmax_parts(rows), REFERENCE.log_softmax_parts(rows), "lse with inf")
    acc = np.ones((2, 3), np.int32)
    try:
        fast.epilogue(acc, np.array([1.0, np.inf], np.float32), np.ones(3, np.float32))
    except NonFiniteError:
        pass
    else:
        raise AssertionError("the epilogue took an Inf scale")
    huge = np.array([[2**31 - 1]], np.int32)
    big = np.array([3e38], np.float32)
    nan_made = (huge, big, np.array([0.0], np.float32))  # inf * 0 inside the kernel
    same(fast.epilogue(*nan_made), REFERENCE.epilogue(*nan_made), "a NaN result")


def test_a_broken_wasm_kernel_fails_the_gate():
    """The gate can fail these kernels: the same wasm fed a shifted input, mask period 1, a
    product check that passes everything or reads a layout wrong."""
    fast = kernels()
    gelu = fast._fn["gelu"]
    fast._fn = {**fast._fn, "gelu": lambda x, y, dy, n: gelu(x + 4, y, dy, n - 1)}
    report = gate_kernels(fast)
    assert not report.passed and report.failing_case == "gelu", report
    fast = kernels()
    softmax = fast._fn["softmax"]
    fast._fn = {**fast._fn, "softmax": lambda x, m, period, *rest: softmax(x, m, 1, *rest)}
    report = gate_kernels(fast)
    assert not report.passed and report.failing_case == "softmax.masked", report
    fast = kernels()
    holds = fast._fn["product_holds"]
    fast._fn = {**fast._fn, "product_holds": lambda *args: 1}  # passes every product
    report = gate_kernels(fast)
    assert not report.passed and report.failing_case == "product_holds.mm.cell", report
    fast._fn = {**fast._fn, "product_holds": lambda a, a_t, *rest: holds(a, 0, *rest)}
    report = gate_kernels(fast)  # a transposed a read as row-major
    assert not report.passed and report.failing_case == "product_holds.mm.transposed.right", report


def test_the_page_checks_pick_the_wasm_kernels():
    from pynode.browser import run_checks

    kernels()  # skips where they cannot load
    checks = run_checks()
    assert checks.ready and checks.kernels == "wasm", checks.to_json()
    assert checks.gemm.kernels.name == "wasm"
    assert checks.gemm.check.kernels.name == "wasm"  # every product checked, by the kernel
    rows = [(r.backend, r.result) for r in checks.rows if r.check == "kernel gate"]
    assert rows == [("wasm", "pass")], rows
    assert '"kernels": "wasm"' in checks.to_json()


def test_a_page_whose_kernels_fail_their_gate_computes_with_the_reference():
    from pynode.browser import run_checks

    kernels()
    checks = run_checks(break_kernels=True)
    assert checks.ready and checks.kernels == "numpy", checks.to_json()
    assert checks.gemm.kernels is REFERENCE and checks.gemm.check.kernels is REFERENCE
    (row,) = [r for r in checks.rows if r.check == "kernel gate"]
    assert row.backend == "wasm" and row.result.startswith("FAIL at gelu"), row
