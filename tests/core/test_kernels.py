"""The hot-kernel gate (core/kernels.py) and the numba kernels it admits (native_kernels.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pynode.core import quant
from pynode.core.errors import NonFiniteError, ShapeError
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


class _DotsSkipTheLastRow(Kernels):
    """The check's dots of a transposed view left one row short (a loop bound)."""

    name = "dots-short"

    def quantize_dots(self, x, axis, key, w):
        q, s, dots = super().quantize_dots(x, axis, key, w)
        if not x.flags.c_contiguous:
            dots = dots.copy()
            dots[..., -1] = 0
        return q, s, dots


class _EpilogueAlwaysHolds(Kernels):
    """The epilogue's check side says every product holds."""

    name = "always-holds"

    def epilogue_checked(self, acc, sa, sb, r, lhs):
        return self.epilogue(acc, sa, sb), True


class _DotsInFloat64(Kernels):
    """The check's dots summed in float64: exact for the vectors r's size, not past 2**53."""

    name = "dots-f64"

    def quantize_dots(self, x, axis, key, w):
        q, s = self.quantize(x, axis, key)
        dots = np.matmul(q.astype(np.float64), w.astype(np.float64)[..., None])[..., 0]
        with np.errstate(invalid="ignore"):  # past int64: the cast's own junk
            return q, s, dots.astype(np.int64)


def test_reference_passes_its_own_gate():
    report = gate_kernels(REFERENCE)
    assert report.passed and report.cases >= 40


@pytest.mark.parametrize("bad", [_OffByOneRounding, _OneUlpGelu, _Stateful, _SumsInNumpyOrder,
                                 _FusedAdamW, _FixedPointInFloat32, _DotsSkipTheLastRow,
                                 _EpilogueAlwaysHolds, _DotsInFloat64])
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
@pytest.mark.parametrize("seed", range(6))
def test_numba_quantize_dots_equal_reference_on_random_shapes_and_views(seed):
    """The check's dots ride in the quantize pass: over the kernel's columns, or its rows
    for a transposed view, one vector or one a batch matrix, sums that wrap int64."""
    g = np.random.default_rng(seed)
    fast = numba_kernels.NumbaKernels()
    shape = tuple(int(d) for d in g.integers(1, 70, size=int(g.integers(2, 4))))
    x = (g.standard_normal(shape) * 10.0 ** g.uniform(-30, 30)).astype(np.float32)
    for view in (x, np.swapaxes(x, -1, -2)):
        lead = view.shape[:-2] if view.ndim == 3 else ()
        for w in (g.integers(0, 1 << 20, view.shape[-1]),
                  g.integers(-(2**62), 2**62, lead + view.shape[-1:])):
            for axis in (-1, -2):
                for key in (None, (seed, 1, 2)):
                    want = REFERENCE.quantize_dots(view, axis, key, w)
                    got = fast.quantize_dots(view, axis, key, w)
                    assert all(np.array_equal(a, b) and a.dtype == b.dtype
                               for a, b in zip(got, want, strict=True)), (view.shape, axis, key)


@needs_numba
def test_numba_epilogue_checked_sees_every_wrong_row_and_keeps_the_epilogues_bits():
    g = np.random.default_rng(3)
    fast = numba_kernels.NumbaKernels()
    acc = g.integers(-(2**31), 2**31, (3, 37, 70), dtype=np.int64).astype(np.int32)
    sa, sb = g.standard_normal((3, 37)).astype(np.float32), g.standard_normal((3, 70)).astype(
        np.float32)
    r = g.integers(0, 1 << 20, 70)
    right = np.matmul(acc.astype(np.int64), r)
    floats, held = fast.epilogue_checked(acc, sa, sb, r, right)
    assert held and floats.tobytes() == REFERENCE.epilogue(acc, sa, sb).tobytes()
    for b, i in ((0, 0), (1, 18), (2, 36)):
        wrong = right.copy()
        wrong[b, i] += 1 << 40
        assert not fast.epilogue_checked(acc, sa, sb, r, wrong)[1], (b, i)
    view = acc.transpose(0, 2, 1).copy().transpose(0, 2, 1)  # column-major memory
    assert fast.epilogue_checked(view, sa, sb, r, right)[1]
    with pytest.raises(NonFiniteError):
        fast.epilogue_checked(acc, np.full_like(sa, np.nan), sb, r, right)


@pytest.mark.parametrize("kernels", ["reference", "numba"])
def test_check_sides_name_a_vector_of_the_wrong_shape_or_dtype(kernels):
    """The fused check's vectors come from the check itself; one that does not fit its
    operand is a named ShapeError (never a product taken for wrong), on either kernels."""
    if kernels == "numba" and numba_kernels.numba is None:
        pytest.skip("numba is not installed")
    ops = REFERENCE if kernels == "reference" else numba_kernels.NumbaKernels()
    g = np.random.default_rng(5)
    x = g.standard_normal((2, 6, 5)).astype(np.float32)
    for w in (np.zeros(4, np.int64), np.zeros((3, 5), np.int64), np.zeros(5, np.int32),
              np.zeros((2, 6, 5), np.int64), [0] * 5):
        with pytest.raises(ShapeError, match="quantize_dots: w must be int64"):
            ops.quantize_dots(x, -1, None, w)
        with pytest.raises(ShapeError, match="quantize_dots: w must be int64"):
            ops.quantize_dots(x[0], -2, None, w)
    acc = g.integers(-99, 99, (2, 6, 5)).astype(np.int32)
    sa, sb = np.ones((2, 6), np.float32), np.ones((2, 5), np.float32)
    r, lhs = np.zeros(5, np.int64), np.zeros((2, 6), np.int64)
    for bad_r, bad_lhs in ((np.zeros(6, np.int64), lhs), (r.astype(np.int32), lhs),
                           (r, np.zeros((2, 5), np.int64)), (r, np.zeros(6, np.int64))):
        with pytest.raises(ShapeError, match="epilogue_checked: (r|lhs) must be int64"):
            ops.epilogue_checked(acc, sa, sb, bad_r, bad_lhs)
    with pytest.raises(ShapeError):
        ops.epilogue_checked(acc, sa[:, :5], sb, r, lhs)
    # the 2-d forms of both, as int8_matmul passes them
    q, s, dots = ops.quantize_dots(x[0], -1, None, np.arange(5, dtype=np.int64))
    assert dots.shape == (6,) and np.array_equal(dots, q.astype(np.int64) @ np.arange(5))
    want = acc[1].astype(np.int64) @ np.arange(5)
    out, held = ops.epilogue_checked(acc[1], sa[1], sb[1], np.arange(5, dtype=np.int64), want)
    assert held and out.tobytes() == REFERENCE.epilogue(acc[1], sa[1], sb[1]).tobytes()
    want[3] += 1
    assert not ops.epilogue_checked(acc[1], sa[1], sb[1], np.arange(5, dtype=np.int64), want)[1]


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
