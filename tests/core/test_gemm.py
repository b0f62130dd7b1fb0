"""Exact int8 GEMM backends, their gate and the live audit.

The oracle is the LUT reference built from a multiply table made here by integer
arithmetic (the certified Units are checked in the units tests). Every comparison is
bit equality of int32 results. Each deliberately wrong backend below models a real
kernel bug and must be caught by the gate (or, at a live shape, by the audit).
Legend: B batch, M rows, K reduction length, N columns.
"""

from __future__ import annotations

import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from pynode.core.errors import AccumulatorBoundError, GateError, ShapeError
from pynode.core.gemm import (
    MAX_K,
    NO_BLAS_ORDER,
    BackendUnavailableError,
    ExactGate,
    GemmAudit,
    GemmBackend,
    UnknownBackendError,
    make_backend,
    select_gemm,
)
from pynode.core.gemm.blas_exact import CHUNK_K, BlasFloatBackend
from pynode.core.gemm.gate import GRID_BATCHES, gate_cases, grid_shapes
from pynode.core.gemm.numpy_int import NumpyIntBackend
from pynode.core.gemm.reference import ReferenceBackend
from pynode.gemm_backends import build_backend

VALUES = np.arange(-128, 128, dtype=np.int64)
LUT = (VALUES[:, None] * VALUES[None, :]).astype(np.int32)  # (256, 256) int32


class Counter:
    def __init__(self) -> None:
        self.mul = self.requant = self.relu = 0

    def add(self, name: str, n: int) -> None:
        setattr(self, name, getattr(self, name) + n)


@pytest.fixture
def units():
    return SimpleNamespace(mul_lut=LUT, counts=Counter())


@pytest.fixture(scope="module")
def gate():
    return ExactGate(ReferenceBackend(LUT))


def int8(shape, seed):
    return np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)


def exact(a, b):
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


def available(name):
    try:
        return build_backend(name, LUT)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))


REAL = ["blas_float", "torch", "numpy_int", "reference"]


# ---------------------------------------------------------------- real backends


@pytest.mark.parametrize("name", REAL)
def test_real_backend_passes_gate(gate, name):
    report = gate.run(available(name))
    assert report.passed, report
    assert report.cases == 2 * len(gate_cases())


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (64, 96, 192), (33, 3000, 17), (5, 4096, 3)])
def test_real_backend_matches_int64(name, m, k, n):
    backend = available(name)
    a, b = int8((m, k), m + k), int8((k, n), n + k)
    got = backend.matmul(a, b)
    assert got.dtype == np.int32
    assert np.array_equal(got, exact(a, b))
    ab, bb = int8((4, m, k), 1), int8((4, k, n), 2)
    assert np.array_equal(backend.bmm(ab, bb), exact(ab, bb))


def test_blas_result_survives_later_calls():
    backend = BlasFloatBackend()
    a, b = int8((40, 50), 1), int8((50, 60), 2)
    first = backend.matmul(a, b)
    kept = first.copy()
    backend.matmul(int8((40, 50), 3), int8((50, 60), 4))
    backend.matmul(int8((7, 3000), 5), int8((3000, 9), 6))
    assert np.array_equal(first, kept)


def test_blas_scratch_is_per_thread():
    # With one scratch shared by all threads this fails in most runs (measured: 7-12 of
    # the 60 results wrong, every run).
    backend = BlasFloatBackend()
    jobs = [(int8((60 + i, 1100), i), int8((1100, 70 - i), 100 + i)) for i in range(6)]
    want = [exact(a, b) for a, b in jobs]
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda ab: backend.matmul(*ab), jobs * 10))
    for got, w in zip(results, want * 10, strict=True):
        assert np.array_equal(got, w)


def test_chunk_limit_is_exact_for_float32():
    # The bound the blas backend relies on: a full chunk of (-128)^2 is exactly 2**24.
    assert CHUNK_K * 128 * 128 == 2**24
    assert MAX_K * 128 * 128 < 2**31 <= (MAX_K + 1) * 128 * 128


# ---------------------------------------------------------------- operand checks


@pytest.mark.parametrize("name", REAL)
def test_bad_operands_are_refused(name):
    backend = available(name)
    a = int8((4, 5), 1)
    with pytest.raises(ShapeError, match="int8"):
        backend.matmul(a.astype(np.int16), int8((5, 3), 2))
    with pytest.raises(ShapeError, match="inner dims"):
        backend.matmul(a, int8((4, 3), 2))
    with pytest.raises(ShapeError, match="3-d"):
        backend.bmm(a, int8((5, 3), 2))
    with pytest.raises(ShapeError, match="batch or inner"):
        backend.bmm(int8((2, 4, 5), 1), int8((3, 5, 3), 2))
    with pytest.raises(ShapeError):
        backend.matmul([[1]], [[1]])
    with pytest.raises(AccumulatorBoundError, match="131071"):
        backend.matmul(np.zeros((1, MAX_K + 1), np.int8), np.zeros((MAX_K + 1, 1), np.int8))


@pytest.mark.parametrize("name", REAL)
def test_empty_shapes_give_zeros(name):
    backend = available(name)
    assert np.array_equal(backend.matmul(int8((3, 0), 1), int8((0, 2), 2)), np.zeros((3, 2)))
    assert backend.matmul(int8((0, 4), 1), int8((4, 2), 2)).shape == (0, 2)
    assert backend.bmm(int8((0, 3, 4), 1), int8((0, 4, 2), 2)).shape == (0, 3, 2)


# ---------------------------------------------------------------- wrong backends


class LastCellTailBug(BlasFloatBackend):
    """A tail-handling bug: the last cell is off by one when M is not a multiple of 32."""

    name = "last_cell_tail_bug"

    def _matmul(self, a, b):
        out = super()._matmul(a, b)
        if a.shape[0] % 32:
            out[-1, -1] += 1
        return out


class Int16Accumulator(GemmBackend):
    """Accumulates in int16, which wraps once a sum passes 32,767."""

    name = "int16_accumulator"

    def _matmul(self, a, b):
        return np.matmul(a.astype(np.int16), b.astype(np.int16)).astype(np.int32)


class Float32Unchunked(GemmBackend):
    """A 24-bit accumulator: float32 sgemm without splitting K."""

    name = "float32_unchunked"

    def _matmul(self, a, b):
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.int32)


class PooledBuffer(GemmBackend):
    """Accumulates into a buffer pooled by shape and never zeroes it between calls."""

    name = "pooled_buffer"

    def __init__(self) -> None:
        self.pool: dict[tuple[int, ...], np.ndarray] = {}

    def _matmul(self, a, b):
        return self._accumulate(a, b)

    def _bmm(self, a, b):
        return self._accumulate(a, b)

    def _accumulate(self, a, b):
        shape = a.shape[:-1] + b.shape[-1:]
        buf = self.pool.setdefault(shape, np.zeros(shape, np.int32))
        buf += exact(a, b).astype(np.int32)
        return buf.copy()


class Uninitialised(GemmBackend):
    """Accumulates into np.empty memory, trusting the allocator to hand out zeros."""

    name = "uninitialised"

    def _matmul(self, a, b):
        out = np.empty((a.shape[0], b.shape[1]), np.int32)
        for k in range(a.shape[1]):
            out += np.multiply.outer(a[:, k].astype(np.int32), b[k].astype(np.int32))
        return out


class DropsTailChunk(BlasFloatBackend):
    """Chunks K at 1024 but its loop bound forgets the last partial chunk."""

    name = "drops_tail_chunk"

    def _matmul(self, a, b):
        k = a.shape[1]
        out = np.zeros((a.shape[0], b.shape[1]), np.int32)
        for k0 in range(0, k - CHUNK_K + 1 if k > CHUNK_K else 1, CHUNK_K):
            out += super()._matmul(a[:, k0 : k0 + CHUNK_K], b[k0 : k0 + CHUNK_K])
        return out


@pytest.mark.parametrize(
    "backend, failing",
    [
        (LastCellTailBug(), {"tiny_1x1x1"}),
        (Int16Accumulator(), {"odd_tails"}),
        (Float32Unchunked(), {"k1025_extremes"}),
        (PooledBuffer(), {"tiny_1x1x1/dirty"}),
        (DropsTailChunk(), {"k1025_extremes"}),
    ],
    ids=lambda x: getattr(x, "name", ""),
)
def test_gate_catches_wrong_backend(gate, backend, failing):
    report = gate.run(backend)
    assert not report.passed
    assert report.failing_case in failing, report
    assert "expected" in report.detail


def test_gate_catches_uninitialised_output(gate):
    report = gate.run(Uninitialised())
    assert not report.passed and "expected" in report.detail, report


def test_gate_reports_the_failing_cell(gate):
    class OnlyWideTails(BlasFloatBackend):
        name = "only_wide_tails"

        def _matmul(self, a, b):
            out = super()._matmul(a, b)
            if a.shape[0] > 32 and a.shape[0] % 32:
                out[-1, -1] += 1
            return out

    report = gate.run(OnlyWideTails())
    assert report.failing_case == "odd_tails"
    assert "(36, 66)" in report.detail


def test_gate_catches_a_backend_that_writes_its_inputs(gate):
    class Scribbler(BlasFloatBackend):
        name = "scribbler"

        def _matmul(self, a, b):
            out = super()._matmul(a, b)
            if a.flags.writeable:
                a[...] = 0
            return out

    report = gate.run(Scribbler())
    assert not report.passed and "modified" in report.detail
    assert gate.run(BlasFloatBackend()).passed  # the shared cases were restored


def test_gate_treats_an_exception_as_failure(gate):
    class Crashes(GemmBackend):
        name = "crashes"

        def _matmul(self, a, b):
            raise RuntimeError("kernel fault")

    report = gate.run(Crashes())
    assert report.failing_case == "tiny_1x1x1" and "kernel fault" in report.detail


def test_gate_cases_are_deterministic_and_sweeps_differ():
    first, again, dirty = gate_cases(0), gate_cases(0), gate_cases(1, tag="/dirty")
    assert [c.name for c in first] == [c.name for c in again]
    for x, y, z in zip(first, again, dirty, strict=True):
        assert np.array_equal(x.a, y.a) and np.array_equal(x.b, y.b)
        assert x.a.shape == z.a.shape and z.name == x.name + "/dirty"
    assert not np.array_equal(first[1].a, dirty[1].a)


def test_grid_covers_residues_rows_batches_and_square_outputs():
    shapes = [a + b[-1:] for a, b in grid_shapes()]  # (M, K, N) or (B, M, K, N)
    plain = [s for s in shapes if len(s) == 3]
    for dim in range(3):
        sizes = {s[dim] for s in plain}
        assert {x % 8 for x in sizes} == set(range(8)), (dim, sizes)
        for block in (16, 32, 64):
            assert {0, 1, block - 1} <= {x % block for x in sizes}, (dim, block, sizes)
    assert any(m >= 100 and k % 8 for m, k, _ in plain)
    assert any(m == n > 64 for m, _, n in plain) and any(m != n for m, _, n in plain)
    assert {s[0] for s in shapes if len(s) == 4} == set(GRID_BATCHES)
    assert min(GRID_BATCHES) >= 16
    macs = sum(int(np.prod(c.a.shape)) * c.b.shape[-1] for c in gate_cases())
    assert macs < 10_000_000  # the gate runs at every start, in the page too


class WrongWhen(BlasFloatBackend):
    """Right except one interior cell when `when(shape)` holds; shape (B, M, K, N)."""

    def __init__(self, name, when) -> None:
        super().__init__()
        self.name, self.when = name, when

    def _matmul(self, a, b):
        return self._bmm(a[None], b[None])[0]

    def _bmm(self, a, b):
        out = super()._bmm(a, b)
        if self.when((*a.shape, b.shape[-1])):
            out[-1, out.shape[1] // 2, out.shape[2] // 3] += 1
        return out


@pytest.mark.parametrize("backend", [
    WrongWhen("many_rows_k_tail", lambda s: s[1] >= 100 and s[2] % 8),
    WrongWhen("batch_of_16_or_more", lambda s: s[0] >= 16),
    WrongWhen("square_output_past_64", lambda s: s[1] == s[3] > 64),
    WrongWhen("n_one_short_of_16", lambda s: s[3] % 16 == 15),
    WrongWhen("k_at_residue_6_of_8", lambda s: s[2] % 8 == 6 and s[2] < 1024),
], ids=lambda x: x.name)
def test_grid_catches_what_the_fixed_cases_miss(gate, backend):
    fixed = [c for c in gate_cases() if not c.name.startswith("grid_")]
    for case in fixed:
        got = backend.bmm(case.a, case.b) if case.a.ndim == 3 else backend.matmul(case.a, case.b)
        assert np.array_equal(got, exact(case.a, case.b)), case.name  # the old list passes it
    report = gate.run(backend)
    assert not report.passed and report.failing_case.startswith("grid_"), report


# ---------------------------------------------------------------- select_gemm / Gemm


def test_select_gemm_counts_units_and_matches(units):
    gemm = select_gemm(units)
    assert gemm.backend_name == "blas_float" and gemm.gate_report.passed
    a, b = int8((6, 7), 1), int8((7, 5), 2)
    assert np.array_equal(gemm.matmul(a, b), exact(a, b))
    assert units.counts.mul == 6 * 7 * 5
    ab, bb = int8((3, 6, 7), 1), int8((3, 7, 5), 2)
    assert np.array_equal(gemm.bmm(ab, bb), exact(ab, bb))
    assert units.counts.mul == 6 * 7 * 5 * 4


def test_refused_operands_change_no_count(units):
    gemm = select_gemm(units, prefer="numpy_int")
    with pytest.raises(ShapeError):
        gemm.matmul(int8((3, 4), 1), int8((5, 2), 2))
    assert units.counts.mul == 0 and gemm.audit.calls == 0


def test_select_gemm_demotes_failing_backend_with_warning(units, caplog):
    with caplog.at_level(logging.WARNING, logger="pynode.core.gemm.select"):
        gemm = select_gemm(units, order=[Float32Unchunked(), "numpy_int"])
    assert gemm.backend_name == "numpy_int"
    assert "float32_unchunked" in caplog.text and "k1025_extremes" in caplog.text
    assert [r.passed for r in gemm.gate_reports] == [False, True]


def test_select_gemm_prefer(units):
    assert select_gemm(units, prefer="reference").backend_name == "reference"
    with pytest.raises(UnknownBackendError, match="blas_float, numpy_int, reference"):
        select_gemm(units, prefer="cuda")
    with pytest.raises(GateError, match="forced GEMM backend 'int16_accumulator'"):
        select_gemm(units, prefer="int16_accumulator", order=[Int16Accumulator(), "reference"])


def test_missing_torch_is_skipped_or_refused(units, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    order = ["torch", "numpy_int"]
    assert select_gemm(units, order=order, build=build_backend).backend_name == "numpy_int"
    with pytest.raises(BackendUnavailableError, match="torch backend unavailable"):
        select_gemm(units, prefer="torch", order=order, build=build_backend)
    with pytest.raises(UnknownBackendError, match="unknown GEMM backend 'torch'"):
        make_backend("torch", LUT)  # the core builds numpy-only backends alone


def test_no_blas_order_prefers_einsum(units):
    assert select_gemm(units, order=NO_BLAS_ORDER).backend_name == "numpy_int"


def test_no_passing_backend_is_a_gate_error(units):
    with pytest.raises(GateError, match="no GEMM backend passed"):
        select_gemm(units, order=[Int16Accumulator(), DropsTailChunk()])


# ---------------------------------------------------------------- live audit


class WrongAtLiveShape(BlasFloatBackend):
    """Right on every gate shape, wrong in one cell at a shape only training uses."""

    name = "wrong_at_live_shape"

    def __init__(self, cell) -> None:
        super().__init__()
        self.cell = cell

    def _matmul(self, a, b):
        out = super()._matmul(a, b)
        if out.shape == (48, 80):
            out[self.cell] -= 7
        return out


def test_audit_catches_a_structural_cell_at_a_live_shape(units):
    """The audit alone (the per-call check off): it names the wrong cell."""
    gemm = select_gemm(units, order=[WrongAtLiveShape((47, 40)), "numpy_int"], audit_every=1,
                       check=False)
    assert gemm.backend_name == "wrong_at_live_shape"
    a, b = int8((48, 64), 1), int8((64, 80), 2)
    with pytest.raises(GateError, match=r"\(0, 47, 40\).*expected"):
        gemm.matmul(a, b)
    gemm.demote()
    assert gemm.backend_name == "numpy_int"
    assert np.array_equal(gemm.matmul(a, b), exact(a, b))


def test_audit_random_cells_find_an_interior_cell(units):
    gemm = select_gemm(units, order=[WrongAtLiveShape((20, 33))], audit_every=1, check=False)
    gemm.audit.random_cells = 64
    a, b = int8((48, 64), 1), int8((64, 80), 2)
    with pytest.raises(GateError, match=r"\(0, 20, 33\)"):
        for _ in range(400):
            gemm.matmul(a, b)


def test_audit_checks_batched_results():
    audit = GemmAudit(LUT, every=1)
    a, b = int8((3, 10, 20), 1), int8((3, 20, 12), 2)
    out = exact(a, b).astype(np.int32)
    assert audit.check(a, b, out, "x")
    out[2, 9, 0] += 1
    with pytest.raises(GateError, match=r"\(2, 9, 0\)"):
        audit.check(a, b, out, "x")


def test_audit_schedule_is_deterministic():
    a, b = int8((8, 9), 1), int8((9, 7), 2)
    out = exact(a, b).astype(np.int32)
    audit = GemmAudit(LUT, every=4)
    assert [audit.check(a, b, out, "x") for _ in range(9)] == [True, False, False, False] * 2 + [
        True
    ]
    assert audit.audits == 3 and audit.cells_checked > 3 * 9
    one, two = GemmAudit(LUT), GemmAudit(LUT)
    assert [c.tolist() for c in one._cells(5, 2, 30, 40)] == [
        c.tolist() for c in two._cells(5, 2, 30, 40)
    ]


# ---------------------------------------------------------------- benchmark smoke test


def test_bench_reports_every_backend(monkeypatch, capsys):
    import json

    import pynode.unitfiles
    from pynode.bench import gemm as bench

    monkeypatch.setattr(
        pynode.unitfiles, "load_default_units", lambda: SimpleNamespace(mul_lut=LUT)
    )
    monkeypatch.setattr(bench, "SHAPES", (16, 300))
    monkeypatch.setattr(bench, "REFERENCE_MAX", 16)
    monkeypatch.setattr(bench, "AUDIT_SHAPE", 64)
    assert bench.main(["--json", "--repeats", "1"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    timed = {(r["backend"], r["m"]) for r in rows if r["bench"] == "gemm" and "skipped" not in r}
    assert {("blas_float", 300), ("numpy_int", 300), ("reference", 16)} <= timed
    assert ("reference", 300) not in timed
    assert all(
        r["exact"] and r["gops"] > 0 and r["ratio_vs_f32"] > 0 for r in rows[:-1] if "m" in r
    )
    assert rows[-1]["bench"] == "gemm_audit" and rows[-1]["cells"] >= 9


@pytest.mark.parametrize("name", ["blas_float", "torch", "numpy_int", "reference"])
def test_operand_edges_named_errors_or_exact_results(name):
    """Subclasses are refused by name (np.matrix and masked arrays change what indexing and
    products mean); a negative stride on a size-1 axis, which numpy calls contiguous and
    torch refuses, gives the exact product on every backend."""
    from pynode.core.errors import ShapeError
    from pynode.core.gemm import BackendUnavailableError
    from pynode.unitfiles import load_default_units

    try:
        backend = build_backend(name, load_default_units().mul_lut)
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))
    g = np.random.default_rng(7)
    b = g.integers(-128, 128, (5, 3), dtype=np.int8)
    flipped = g.integers(-128, 128, (1, 5), dtype=np.int8)[::-1]
    assert flipped.strides[0] < 0 and flipped.flags.c_contiguous
    want = flipped.astype(np.int64) @ b.astype(np.int64)
    assert np.array_equal(backend.matmul(flipped, b), want)
    assert np.array_equal(backend.bmm(flipped[None], b[None])[0], want)
    plain = g.integers(-128, 128, (4, 5), dtype=np.int8)
    masked = np.ma.masked_array(plain, mask=np.eye(4, 5, dtype=bool))
    for subclass in (masked, np.matrix(plain)):
        with pytest.raises(ShapeError, match="subclass"):
            backend.matmul(subclass, b)


# --- the per-call check (check.py) -------------------------------------------------------------

class WrongAtOneK:
    """Right everywhere except one interior cell, for one inner size K only: a shape bug the
    gate's fixed cases and the audit's sampled cells never meet."""

    name = "wrong_at_one_k"

    def __init__(self, k: int) -> None:
        self.k, self.inner = k, NumpyIntBackend()

    def matmul(self, a, b):
        out = self.inner.matmul(a, b)
        if a.shape[1] == self.k:
            out[out.shape[0] // 3, out.shape[1] // 2] -= 1
        return out

    def bmm(self, a, b):
        out = self.inner.bmm(a, b)
        if a.shape[2] == self.k:
            out[-1, out.shape[1] // 2, 1] += 1 << 20
        return out


def test_every_product_is_checked_and_a_wrong_one_never_returned(units, caplog):
    gemm = select_gemm(units, order=[WrongAtOneK(72), "blas_float"], audit_every=1_000_000)
    assert gemm.backend_name == "wrong_at_one_k"  # the gate never uses K = 72
    a, b = int8((50, 64), 1), int8((64, 30), 2)
    assert np.array_equal(gemm.matmul(a, b), exact(a, b))
    assert gemm.backend_name == "wrong_at_one_k"  # right at K = 64: kept
    a, b = int8((50, 72), 3), int8((72, 30), 4)
    with caplog.at_level("WARNING"):
        assert np.array_equal(gemm.matmul(a, b), exact(a, b))
    assert gemm.backend_name == "blas_float"
    assert "wrong_at_one_k gave a wrong product (50x72x30" in caplog.text
    assert gemm.check.failures == 1 and gemm.check.calls == 3


def test_a_wrong_batched_product_is_recomputed(units):
    gemm = select_gemm(units, order=[WrongAtOneK(9), "numpy_int"], audit_every=1_000_000)
    a, b = int8((4, 6, 9), 5), int8((4, 9, 7), 6)
    assert np.array_equal(gemm.bmm(a, b), exact(a, b))
    assert gemm.backend_name == "numpy_int"


def test_a_wrong_routed_backend_loses_its_routes_not_the_selected_one(units):
    gemm = select_gemm(units, order=["numpy_int"], audit_every=1_000_000)
    wrong = WrongAtOneK(40)
    gemm.routes[("mm", 1, 8, 40, 16)] = wrong
    a, b = int8((8, 40), 7), int8((40, 16), 8)
    assert np.array_equal(gemm.matmul(a, b), exact(a, b))
    assert gemm.routes == {} and gemm.backend_name == "numpy_int"


def _check_kernels():
    from pynode.core.kernels import REFERENCE

    try:
        from pynode.native_kernels import NumbaKernels, available
    except ImportError:
        return [REFERENCE]
    return [REFERENCE, NumbaKernels()] if available() else [REFERENCE]


@pytest.mark.parametrize("kernels", _check_kernels(), ids=lambda k: k.name)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 7, 5), (64, 200, 33), (2, 4096, 3)])
def test_the_check_finds_any_single_wrong_cell(m, k, n, kernels):
    from pynode.core.gemm.check import ProductCheck

    check = ProductCheck(kernels, seed=3)
    a, b = int8((m, k), 11), int8((k, n), 12)
    out = exact(a, b).astype(np.int32)
    assert check.holds(a, b, out)
    cells = np.random.default_rng(5).integers(0, [m, n], size=(25, 2))  # test data only
    for i, j in cells:
        for delta in (1, -1, 1 << 16, 1 << 22, -(1 << 30)):
            wrong = out.copy()
            wrong[i, j] += delta
            assert not check.holds(a, b, wrong), (i, j, delta)
        for extreme in (2**31 - 1, -(2**31)):  # far outside the bound: numba's int64 side
            wrong = out.copy()
            wrong[i, j] = extreme
            assert not check.holds(a, b, wrong), (i, j, extreme)
    assert check.holds(a, b, out)


@pytest.mark.skipif(len(_check_kernels()) < 2, reason="numba not installed")
def test_numba_product_holds_takes_the_reference_path_for_vectors_beyond_its_int_side():
    """The numba kernel multiplies out (int32) by r as int32 in int64; r entries of 2**31
    or more, or a vector summing to 2**32 or more, would not be exact there."""
    from pynode.core.kernels import REFERENCE

    fast = _check_kernels()[1]
    a, b = int8((5, 9), 31), int8((9, 70), 32)
    right = exact(a, b).astype(np.int32)
    wrong = right.copy()
    wrong[2, 3] += 1
    wide = np.full((1, 70), float(2**31))  # each entry too large for int32
    heavy = np.full((1, 70), float(2**27))  # entries fit, the sum does not
    small = np.arange(70, dtype=np.float64)[None] * 7 + 1
    for r in (wide, heavy, small):
        for out in (right, wrong):
            assert fast.product_holds(a, b, out, r) == REFERENCE.product_holds(a, b, out, r)
    assert fast.product_holds(a, b, right, small) and not fast.product_holds(a, b, wrong, small)


@pytest.mark.skipif(len(_check_kernels()) < 2, reason="numba not installed")
@pytest.mark.parametrize("layout", ["rows", "columns"])
@pytest.mark.parametrize("side", ["float64", "int64", "int64 chosen"])
def test_numba_product_holds_is_exact_on_both_sides_of_its_a_product(layout, side):
    """a . (B @ r) runs in float64 while sum |B @ r| * 2**7 stays below 2**53, else in
    int64 (and in int64 always where select_kernels timed it faster): a cell off by one is
    found on either side, in row- and column-major A."""
    from pynode.native_kernels import NumbaKernels

    fast = NumbaKernels()
    fast.check_in_f64 = side != "int64 chosen"
    m, k, n = 7, 300, 200
    a = int8((m, k), 41)
    if layout == "columns":
        a = a.T.copy().T
    b = np.full((k, n), 127, np.int8) if side == "int64" else int8((k, n), 42)
    r = np.full((1, n), float(2**24 if side == "int64" else 2**19))
    bound = np.abs(b.astype(np.int64) @ r[0].astype(np.int64)).sum() * 2**7
    assert (bound >= 2**53) == (side == "int64")
    right = exact(a, b).astype(np.int32)
    assert fast.product_holds(a, b, right, r)
    for i, j in ((0, 0), (m - 1, n - 1), (3, 101)):
        for delta in (1, -1, 2**20):
            wrong = right.copy()
            wrong[i, j] += delta
            assert not fast.product_holds(a, b, wrong, r), (i, j, delta)


needs_fused = pytest.mark.skipif(len(_check_kernels()) < 2, reason="numba not installed")


def _floats(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)  # test data


@needs_fused
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 7, 5), (64, 200, 33), (2, 4096, 3),
                                   (5, 9, 256)])
def test_the_fused_check_finds_any_single_wrong_cell(m, k, n):
    """The check as it rides in numba's passes: B @ r and A @ (B @ r) while the operands
    are quantized, out @ r in the epilogue; any one cell off is found, and a right
    product gives the epilogue's bits."""
    from pynode.core.gemm.check import ProductCheck
    from pynode.core.kernels import REFERENCE

    fast = _check_kernels()[1]
    check = ProductCheck(fast, seed=3)
    r = check.fused_vectors(n)
    assert r.dtype == np.int64 and r.shape == (n,) and 0 <= r.min() and r.max() < 2**20
    qb, sb, br = fast.quantize_dots(_floats((k, n), 1), -2, None, r)
    qa, sa, lhs = fast.quantize_dots(_floats((m, k), 2), -1, (4, 5), br)
    out = exact(qa, qb).astype(np.int32)
    floats, held = fast.epilogue_checked(out, sa, sb, r, lhs)
    assert held and floats.tobytes() == REFERENCE.epilogue(out, sa, sb).tobytes()
    cells = np.random.default_rng(5).integers(0, [m, n], size=(25, 2))  # test data only
    for i, j in cells:
        for delta in (1, -1, 1 << 16, 1 << 22, -(1 << 30)):
            wrong = out.copy()
            wrong[i, j] += delta
            assert not fast.epilogue_checked(wrong, sa, sb, r, lhs)[1], (i, j, delta)
        for extreme in (2**31 - 1, -(2**31)):
            wrong = out.copy()
            wrong[i, j] = extreme
            assert not fast.epilogue_checked(wrong, sa, sb, r, lhs)[1], (i, j, extreme)


def test_fused_vectors_count_calls_and_leave_wide_products_to_holds():
    from pynode.core.gemm.check import DRAW_BLOCK, DRAW_LANES, ProductCheck

    check = ProductCheck(seed=7)
    seen = [check.fused_vectors(5).copy() for _ in range(DRAW_BLOCK + 2)]  # a second block
    assert check.calls == DRAW_BLOCK + 2
    assert len({v.tobytes() for v in seen}) == len(seen)  # a fresh vector each call
    assert check.fused_vectors(0) is None and check.fused_vectors(DRAW_LANES + 1) is None
    assert check.calls == DRAW_BLOCK + 2  # those are not counted: holds will count them
    again = ProductCheck(seed=7)
    assert all(np.array_equal(again.fused_vectors(5), v) for v in seen)  # from the seed


def test_fused_vectors_stay_as_given_across_draws_and_threads():
    """A vector handed out is never overwritten: a peer's recheck on a worker thread may
    still be checking with it while another thread's calls draw the stream anew."""
    from pynode.core.gemm.check import DRAW_LANES, FUSED_LANES, SECURITY_BITS, ProductCheck

    check = ProductCheck(seed=3)
    held = check.fused_vectors(DRAW_LANES)
    kept = held.copy()
    assert held.dtype == np.int64 and 0 <= held.min() and held.max() < 2**SECURITY_BITS
    with ThreadPoolExecutor(2) as pool:  # several draws' worth of calls, on two threads
        got = list(pool.map(lambda _: check.fused_vectors(DRAW_LANES).copy(),
                            range(3 * FUSED_LANES // DRAW_LANES)))
    assert np.array_equal(held, kept)
    assert len({v.tobytes() for v in got}) > len(got) // 2  # fresh lanes, races aside


@needs_fused
def test_a_layer_gets_the_right_product_when_the_fused_check_finds_a_wrong_one(units, caplog):
    from pynode.core.kernels import REFERENCE
    from pynode.core.layers import int8_bmm, int8_matmul

    fast = _check_kernels()[1]
    clean = select_gemm(units, order=["numpy_int"], kernels=REFERENCE, check=False)
    gemm = select_gemm(units, order=[WrongAtOneK(72), "blas_float"], kernels=fast,
                       audit_every=1_000_000)
    assert gemm.backend_name == "wrong_at_one_k"
    x, w = _floats((50, 72), 6), _floats((72, 30), 7)
    with caplog.at_level("WARNING"):
        got = int8_matmul(gemm, x, w, b_key=(1, 2))
    assert got.tobytes() == int8_matmul(clean, x, w, b_key=(1, 2)).tobytes()
    assert gemm.backend_name == "blas_float" and gemm.check.failures == 1
    assert "wrong_at_one_k gave a wrong product (50x72x30" in caplog.text
    gemm = select_gemm(units, order=[WrongAtOneK(72), "numpy_int"], kernels=fast,
                       audit_every=1_000_000)
    xs, ws = _floats((4, 6, 72), 8), _floats((4, 72, 7), 9)
    assert int8_bmm(gemm, xs, ws).tobytes() == int8_bmm(clean, xs, ws).tobytes()
    assert gemm.backend_name == "numpy_int" and gemm.check.failures == 1


def test_the_wrapping_path_for_shapes_beyond_float64():
    from pynode.core.gemm.check import ProductCheck, entry_bits

    assert entry_bits(1 << 17, 1 << 23) == 0  # K and N too large for exact float64 products
    assert entry_bits(1 << 17, 1 << 20) == 2 and entry_bits(128, 128) == 25
    check = ProductCheck()
    a, b = int8((5, 33), 13), int8((33, 6), 14)
    out = exact(a, b).astype(np.int32)
    assert check._holds_mod64(0, a, b, out)
    out[4, 5] -= 3
    assert not check._holds_mod64(1, a, b, out)


@pytest.mark.parametrize("name", REAL)
def test_size1_axes_with_any_stride_give_exact_results(name):
    """numpy ignores a size-1 axis's stride; torch's _int_mm read it as a leading dimension
    and returned garbage for an outer product of transposed views (found by
    tests/core/test_properties.py). The shared normaliser gives such axes C strides."""
    backend = available(name)
    a, b = int8((1, 40), 21).T, int8((30, 1), 22).T  # (40, 1) strides (1, 40); (1, 30) (1, 1)
    assert a.strides == (1, 40) and b.strides == (1, 1)
    for _ in range(3):
        assert np.array_equal(backend.matmul(a, b), exact(a, b))
    assert np.array_equal(backend.bmm(a[None], b[None])[0], exact(a, b))
