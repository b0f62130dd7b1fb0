"""The hot-kernel gate (core/kernels.py) and the numba kernels it admits (native_kernels.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pynode.core import quant
from pynode.core.errors import NonFiniteError
from pynode.core.kernels import REFERENCE, Kernels, gate_kernels


class _OffByOneRounding(Kernels):
    name = "off-by-one"

    def quantize(self, x, axis, key):
        q, s = super().quantize(x, axis, key)
        if key is not None and q.size > 40:
            q = q.copy()
            q.reshape(-1)[37] = np.clip(q.reshape(-1)[37] + 1, -127, 127)
        return q, s


class _OneUlpGelu(Kernels):
    name = "one-ulp-gelu"

    def gelu_with_grad(self, x):
        y, dy = super().gelu_with_grad(x)
        return np.nextafter(y, np.float32(np.inf)), dy


class _Stateful(Kernels):
    """Right the first time, wrong the second (a kernel that keeps a dirty buffer)."""

    name = "stateful"
    calls = 0

    def softmax_rows(self, x, mask=None):
        self.calls += 1
        out = super().softmax_rows(x, mask)
        return out if self.calls % 2 else out * np.float32(1.0000001)


class _SumsInNumpyOrder(Kernels):
    name = "np.sum"

    def psum_rows(self, x):
        return np.sum(x, axis=-1, dtype=x.dtype)


class _FusedAdamW(Kernels):
    """denom = sqrt(v / bias2) + eps: the same formula, one rounding fewer."""

    name = "fused-adamw"

    def adamw(self, p, g, m, v, scalars, scale):
        new_p, new_m, new_v = super().adamw(p, g, m, v, scalars, scale)
        step_size, sqrt_bias2, eps, decay = scalars[4:]
        denom = np.sqrt(new_v / (sqrt_bias2 * sqrt_bias2)) + eps
        return p * decay - (new_m / denom) * step_size, new_m, new_v


class _FixedPointInFloat32(Kernels):
    """int64 rounded to float32 first, then scaled and divided there: two roundings."""

    name = "float32-fixed-point"

    def from_fixed(self, total, frac_bits, divisor):
        return total.astype(np.float32) * np.float32(2.0**-frac_bits) / np.float32(divisor)


def test_reference_passes_its_own_gate():
    report = gate_kernels(REFERENCE)
    assert report.passed and report.cases >= 40


@pytest.mark.parametrize("bad", [_OffByOneRounding, _OneUlpGelu, _Stateful, _SumsInNumpyOrder,
                                 _FusedAdamW, _FixedPointInFloat32])
def test_gate_catches_a_wrong_kernel(bad):
    report = gate_kernels(bad())
    assert not report.passed and report.failing_case


def test_gate_reports_a_crashing_kernel():
    class Crashes(Kernels):
        name = "crashes"

        def epilogue(self, acc, sa, sb):
            raise RuntimeError("boom")

    report = gate_kernels(Crashes())
    assert not report.passed and "boom" in report.failing_case


numba_kernels = pytest.importorskip("pynode.native_kernels")
needs_numba = pytest.mark.skipif(not numba_kernels.available(), reason="numba not installed")


@needs_numba
def test_numba_kernels_pass_the_gate():
    assert gate_kernels(numba_kernels.NumbaKernels()).passed


@needs_numba
def test_numba_raw64_is_numpys_philox_stream_across_tiles():
    """The numba generator makes 256 blocks (1024 words) a tile: every cut of a tile and
    of a block gives numpy's words, and a wrong word fails the gate."""
    from pynode.core import rng

    fast = numba_kernels.NumbaKernels()
    for n in (0, 1, 2, 3, 4, 1023, 1024, 1025, 3 * 1024 + 5):
        for key in ((n,), (1, 2**63 + n), (0xF4E1, 5, 0, n)):
            assert np.array_equal(fast.raw64(key, n), rng.raw64(key, n)), (key, n)

    class OneWordOff(numba_kernels.NumbaKernels):
        def raw64(self, key, n):
            words = super().raw64(key, n).copy()
            if n > 1030:
                words[1030] ^= np.uint64(1 << 40)
            return words

    report = gate_kernels(OneWordOff())
    assert not report.passed and report.failing_case.startswith("raw64."), report


@needs_numba
@pytest.mark.parametrize("seed", range(6))
def test_numba_quantize_equals_reference_on_random_shapes(seed):
    g = np.random.default_rng(seed)
    fast = numba_kernels.NumbaKernels()
    shape = tuple(int(d) for d in g.integers(1, 70, size=int(g.integers(2, 4))))
    x = (g.standard_normal(shape) * 10.0 ** g.uniform(-30, 30)).astype(np.float32)
    x.reshape(-1)[:: max(1, x.size // 7)] = 0.0
    views = [x, np.swapaxes(x, -1, -2)]
    for view in views:
        for axis in (-1, -2):
            for key in (None, (seed, 1, 2)):
                want = REFERENCE.quantize(view, axis, key)
                got = fast.quantize(view, axis, key)
                assert np.array_equal(got[0], want[0]) and got[1].tobytes() == want[1].tobytes()


@needs_numba
def test_numba_refuses_what_the_reference_refuses():
    fast = numba_kernels.NumbaKernels()
    x = np.ones((4, 5), np.float32)
    x[2, 3] = np.nan
    with pytest.raises(NonFiniteError):
        fast.quantize(x, -1, (1,))
    with pytest.raises(NonFiniteError):
        fast.quantize(x, -2, None)
    specials = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
    got, want = fast.gelu_with_grad(specials), REFERENCE.gelu_with_grad(specials)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want, strict=True))


@needs_numba
def test_numba_epilogue_keeps_the_reference_refusals():
    fast = numba_kernels.NumbaKernels()
    acc = np.ones((2, 3), np.int32)
    bad = np.array([1.0, np.inf], np.float32)
    with pytest.raises(NonFiniteError):
        fast.epilogue(acc, bad, np.ones(3, np.float32))
    assert np.array_equal(fast.epilogue(acc, np.ones(2, np.float32), np.ones(3, np.float32)),
                          quant.epilogue(acc, np.ones(2, np.float32), np.ones(3, np.float32)))


@needs_numba
def test_select_kernels_prefers_numba_and_can_be_forced_to_numpy():
    ops, report = numba_kernels.select_kernels()
    assert ops.name == "numba" and report.passed
    ops, report = numba_kernels.select_kernels("numpy")
    assert ops is REFERENCE and report is None


def test_forced_numba_is_an_error_where_it_is_missing_or_fails_its_gate(monkeypatch):
    from pynode.core.errors import GateError
    from pynode.core.gemm import BackendUnavailableError, UnknownBackendError

    with pytest.raises(UnknownBackendError, match="valid: numba, numpy"):
        numba_kernels.select_kernels("numbaa")
    if numba_kernels.available():
        class Broken(numba_kernels.NumbaKernels):
            def gelu_with_grad(self, x):
                return x, x

        monkeypatch.setattr(numba_kernels, "gate_kernels", lambda ops: gate_kernels(Broken()))
        with pytest.raises(GateError, match="forced numba kernels failed"):
            numba_kernels.select_kernels("numba")
        ops, report = numba_kernels.select_kernels()  # not forced: the reference serves
        assert ops is REFERENCE and not report.passed
    monkeypatch.setattr(numba_kernels, "numba", None)
    with pytest.raises(BackendUnavailableError, match="numba is not installed"):
        numba_kernels.select_kernels("numba")
    assert numba_kernels.select_kernels() == (REFERENCE, None)


@needs_numba
def test_training_hashes_equal_with_numba_and_numpy_kernels():
    from pynode.config import RunConfig
    from pynode.run.assemble import build_trainer

    cfg = RunConfig(steps=3, seed=2, width=32, layers=1, heads=2, seq=16, microbatch_size=2,
                    microbatches=3)

    def hashes(kernels: str | None) -> list[str]:
        trainer = build_trainer(cfg, kernels=kernels)
        assert trainer.gemm.kernels.name == (kernels or "numba")

        async def run() -> list[str]:
            return [(await trainer.step()).hash for _ in range(3)]

        return asyncio.run(run())

    assert hashes(None) == hashes("numpy")


@needs_numba
def test_kernel_gate_row_names_the_kernels_in_use_and_a_failure_falls_back():
    """The "kernel gate" check row (verify.py, the page's checks): natively it gates numba;
    broken kernels (the page's test hook) fail it and the reference serves."""
    from pynode.browser import broken_kernels
    from pynode.verify import kernel_gate

    ops, (row,) = kernel_gate()
    assert ops.name == "numba" and (row.check, row.backend, row.result) == (
        "kernel gate", "numba", "pass")
    ops, (row,) = kernel_gate(broken_kernels)
    assert ops is REFERENCE and row.backend == "numba"
    assert row.result.startswith("FAIL at gelu"), row
