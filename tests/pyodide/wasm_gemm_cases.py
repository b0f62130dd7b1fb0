"""Runs inside Pyodide (see test_under_pyodide.py): the wasm SIMD GEMM backend of the page.

It must pass the exact gate, equal the LUT reference bit for bit on random shapes (K, M and
N tails, batches, views) and be what the page's start-up checks pick. Skips (with the reason)
where the runtime cannot load it.
"""

import unittest

import numpy as np

from pynode.core import rng
from pynode.core.gemm import BackendUnavailableError, ExactGate
from pynode.core.gemm.gate import gate_cases
from pynode.core.gemm.numpy_int import NumpyIntBackend
from pynode.core.gemm.reference import ReferenceBackend
from pynode.unitfiles import load_default_units

PURPOSE = 0x3A5D


def backend():
    from pynode.browser_gemm import WasmSimdBackend

    try:
        return WasmSimdBackend()
    except BackendUnavailableError as exc:
        raise unittest.SkipTest(f"wasm_simd unavailable here: {exc}") from exc


def operand(key, shape):
    return (rng.randint((PURPOSE, *key), shape, 256) - 128).astype(np.int8)


def test_wasm_simd_passes_the_exact_gate():
    units = load_default_units()
    report = ExactGate(ReferenceBackend(units.mul_lut)).run(backend())
    assert report.passed, f"{report.failing_case}: {report.detail}"
    assert report.cases == 2 * len(gate_cases()), report.cases


def test_wasm_simd_equals_the_reference_on_random_shapes():
    wasm, reference = backend(), ReferenceBackend(load_default_units().mul_lut)
    shapes = rng.randint((PURPOSE, 0), (40, 3), 70) + 1  # (40, 3) int64 in 1..70
    for i, (m, k, n) in enumerate(shapes.tolist()):
        a, b = operand((1, i), (m, k)), operand((2, i), (k, n))
        assert np.array_equal(wasm.matmul(a, b), reference.matmul(a, b)), (m, k, n)
    for i, (bs, m, k, n) in enumerate([(1, 3, 5, 7), (4, 17, 33, 9), (7, 64, 16, 64),
                                       (2, 1, 1, 1), (3, 8, 64, 16)]):
        a, b = operand((3, i), (bs, m, k)), operand((4, i), (bs, k, n))
        assert np.array_equal(wasm.bmm(a, b), reference.bmm(a, b)), (bs, m, k, n)
    # transposed and strided views; all -128 at a long K
    a, b = operand((5,), (90, 70)), operand((6,), (90, 45))
    assert np.array_equal(wasm.matmul(a.T[::2], b[:, ::-1]), reference.matmul(a.T[::2], b[:, ::-1]))
    a, b = np.full((5, 4099), -128, np.int8), np.full((4099, 11), -128, np.int8)
    assert np.array_equal(wasm.matmul(a, b), np.full((5, 11), 4099 * 16384, np.int32))


def test_wasm_simd_equals_numpy_int_at_training_shapes():
    wasm, numpy_int = backend(), NumpyIntBackend()
    for i, (m, k, n) in enumerate([(512, 64, 192), (512, 256, 64), (64, 512, 256)]):
        a, b = operand((7, i), (m, k)), operand((8, i), (k, n))
        assert np.array_equal(wasm.matmul(a, b), numpy_int.matmul(a, b)), (m, k, n)


def test_a_wrong_wasm_kernel_fails_the_gate():
    """The gate can fail this backend: the same kernel fed a wrong K drops the K tail."""
    wasm = backend()
    kernel = wasm._kernel
    wasm._kernel = lambda a, b, c, s, bs, m, k, n: kernel(a, b, c, s, bs, m, k & ~1 or k, n)
    report = ExactGate(ReferenceBackend(load_default_units().mul_lut)).run(wasm)
    assert not report.passed and report.failing_case == "odd_tails", report


def test_the_page_checks_pick_wasm_simd():
    from pynode.browser import run_checks

    backend()  # skips where it cannot load
    checks = run_checks()
    assert checks.ready and checks.gemm.backend_name == "wasm_simd", checks.to_json()
    gate_rows = [r for r in checks.rows if r.check == "exact gate"]
    ran = [(r.backend, r.result) for r in gate_rows if not r.skipped]
    assert ran == [("wasm_simd", "pass")], gate_rows
    # WebGPU's row says why it is not there (no adapter: Node, or Chromium without the flag)
    assert [r.backend for r in gate_rows if r.skipped] in ([], ["webgpu"]), gate_rows


def test_a_broken_page_never_selects_wasm_simd():
    """break_gate corrupts every candidate: the page must refuse them all and not train."""
    from pynode.browser import run_checks

    backend()
    checks = run_checks(break_gate=True)
    assert not checks.ready and checks.gemm is None
    assert checks.rows[-1].result.startswith("FAIL") and "wasm_simd" in checks.rows[-1].result
