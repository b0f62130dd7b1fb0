"""Pick the best backend that passes its exact gate, and wrap it for the model.

`select_gemm(units)` tries the backends best first, gates each against the LUT
reference built from the verified units, demotes (with a warning naming the failing
case) any that mismatch, and returns a `Gemm`: the same matmul/bmm, plus unit counting
(`units.counts.add("mul", M*N*K)`) on every call and the sampled audit (audit.py).

Legend: B batch, M rows, K reduction length, N columns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pynode.core.errors import GateError
from pynode.core.gemm.audit import AUDIT_EVERY, GemmAudit
from pynode.core.gemm.base import BackendUnavailableError, GemmBackend, UnknownBackendError
from pynode.core.gemm.blas_exact import BlasFloatBackend
from pynode.core.gemm.check import ProductCheck
from pynode.core.gemm.gate import ExactGate, GateReport
from pynode.core.gemm.numpy_int import NumpyIntBackend
from pynode.core.gemm.reference import ReferenceBackend
from pynode.core.kernels import REFERENCE, Kernels

log = logging.getLogger(__name__)

# The core's backends, best first. blas_float is the fast native path; numpy_int needs no
# BLAS (the fast one under Pyodide); the reference is the oracle itself. Backends that need
# more than numpy (torch's, the page's WebAssembly SIMD) live outside the core
# (pynode/gemm_backends.py), which builds every backend by name.
BACKEND_ORDER = ("blas_float", "numpy_int", "reference")
# Without BLAS (Pyodide's numpy) float32 matmul is a plain loop: int32 einsum measured
# ~2x faster there (256^3: 15 ms vs 27-36 ms). The page puts its WebAssembly SIMD kernel
# ahead of this order.
NO_BLAS_ORDER = ("numpy_int", "blas_float", "reference")

Candidate = str | GemmBackend
Build = Callable[[str, np.ndarray], GemmBackend]  # (name, mul_lut) -> backend


def make_backend(name: str, mul_lut: np.ndarray) -> GemmBackend:
    """Build the backend called `name`; BackendUnavailableError if it cannot run here."""
    if name == "blas_float":
        return BlasFloatBackend()
    if name == "numpy_int":
        return NumpyIntBackend()
    if name == "reference":
        return ReferenceBackend(mul_lut)
    raise UnknownBackendError(f"unknown GEMM backend {name!r}; valid: {', '.join(BACKEND_ORDER)}")


def _name(c: Candidate) -> str:
    return c if isinstance(c, str) else c.name


class _Chooser:
    """Walks the candidates in order, gating each, until one passes."""

    def __init__(self, gate: ExactGate, mul_lut: np.ndarray, candidates: Sequence[Candidate],
                 build: Build):
        self.gate, self.mul_lut, self.pending = gate, mul_lut, list(candidates)
        self.build = build
        self.reports: list[GateReport] = []

    def gate_one(self, c: Candidate) -> tuple[GemmBackend, GateReport]:
        backend = self.build(c, self.mul_lut) if isinstance(c, str) else c
        report = self.gate.run(backend)
        self.reports.append(report)
        log.info("GEMM gate %s: %s in %.3fs", report.backend, report.passed, report.seconds)
        return backend, report

    def next_passing(self) -> tuple[GemmBackend, GateReport]:
        while self.pending:
            c = self.pending.pop(0)
            try:
                backend, report = self.gate_one(c)
            except BackendUnavailableError as exc:
                log.info("GEMM backend %s skipped: %s", _name(c), exc)
                continue
            if report.passed:
                return backend, report
            log.warning(
                "GEMM backend %s failed its exact gate at case %s (%s); demoted",
                report.backend,
                report.failing_case,
                report.detail,
            )
        failed = "; ".join(f"{r.backend} at {r.failing_case}: {r.detail}" for r in self.reports)
        raise GateError(f"no GEMM backend passed its exact gate ({failed or 'none available'})")


class Gemm:
    """The gated GEMM the model calls: exact int8 matmul/bmm with counting and audit,
    and the gated hot kernels (quantize, epilogue, GELU, softmax) that go with it."""

    def __init__(
        self,
        units: Any,
        backend: GemmBackend,
        gate_report: GateReport,
        chooser: _Chooser,
        audit: GemmAudit,
        kernels: Kernels = REFERENCE,
        check: ProductCheck | None = None,
    ) -> None:
        self._units, self._chooser, self.audit = units, chooser, audit
        self.check = check  # every product's Freivalds check (check.py); None: off
        self.backend, self.gate_report = backend, gate_report
        self.kernels = kernels
        # (kind, B, M, K, N) -> a gated backend measured faster than `backend` there
        self.routes: dict[tuple[str, int, int, int, int], GemmBackend] = {}

    @property
    def units(self) -> Any:
        """The verified units this GEMM was gated against (and counts into)."""
        return self._units

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def gate_reports(self) -> list[GateReport]:
        """Every gate run so far, failed ones included, in order."""
        return list(self._chooser.reports)

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a (M, K) int8 @ b (K, N) int8 -> (M, N) int32, exact."""
        shape = ("mm", 1, *a.shape, b.shape[-1]) if a.ndim == 2 and b.ndim == 2 else None
        backend = self._route(shape)
        out = backend.matmul(a, b)
        (m, k), n = a.shape, b.shape[1]
        while not self._checked(a, b, self._valid(out, (m, n), backend), backend, shape):
            backend = self._route(shape)
            out = backend.matmul(a, b)
        return self._finish(a, b, out, m * n * k, backend.name)

    def bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a (B, M, K) int8 @ b (B, K, N) int8 -> (B, M, N) int32, exact."""
        shape = ("bmm", *a.shape, b.shape[-1]) if a.ndim == 3 and b.ndim == 3 else None
        backend = self._route(shape)
        out = backend.bmm(a, b)
        (bs, m, k), n = a.shape, b.shape[2]
        while not self._checked(a, b, self._valid(out, (bs, m, n), backend), backend, shape):
            backend = self._route(shape)
            out = backend.bmm(a, b)
        return self._finish(a, b, out, bs * m * n * k, backend.name)

    def check_vectors(self, n: int) -> np.ndarray | None:
        """The per-call check's r (N,) int64 for the next product of N columns where the
        check rides in the kernels' own passes (`scaled`), else None: the caller then
        takes matmul or bmm and the epilogue, the product checked on its own."""
        if self.check is None or not self.kernels.fuses_check:
            return None
        return self.check.fused_vectors(n)

    def scaled(self, a: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray,
               r: np.ndarray, lhs: np.ndarray) -> np.ndarray:
        """The epilogue of a @ b (2-d, or batched 3-d), f32, with its product checked in
        the epilogue's pass: each row of a @ b times r against lhs = a @ (b @ r), which
        Kernels.quantize_dots gave with a and b (r from check_vectors). A wrong product
        drops its backend and is recomputed, as in matmul."""
        batched = a.ndim == 3
        if batched:
            shape = ("bmm", *a.shape, b.shape[-1])
            want, muls = (*a.shape[:2], b.shape[2]), a.shape[0] * a.shape[1] * a.shape[2]
        else:
            shape = ("mm", 1, *a.shape, b.shape[-1])
            want, muls = (a.shape[0], b.shape[1]), a.shape[0] * a.shape[1]
        while True:
            backend = self._route(shape)
            out = self._valid(backend.bmm(a, b) if batched else backend.matmul(a, b), want,
                              backend)
            floats, held = self.kernels.epilogue_checked(out, sa, sb, r, lhs)
            if held:
                break
            self.check.failed()  # type: ignore[union-attr]
            self._drop(backend, a, b)
        self._finish(a, b, out, muls * b.shape[-1], backend.name)
        return floats

    def _checked(self, a, b, out, backend: GemmBackend, shape) -> bool:
        """True if the product passed its check; else the backend that made it is dropped
        (its routes, and itself if it is the selected one) so the caller recomputes it."""
        if self.check is None or self.check.holds(a, b, out):
            return True
        self._drop(backend, a, b)
        return False

    def _drop(self, backend: GemmBackend, a, b) -> None:
        log.warning("GEMM backend %s gave a wrong product (%s, call %d of the per-call "
                    "check); recomputing it on another backend", backend.name,
                    "x".join(map(str, (*a.shape, b.shape[-1]))),
                    self.check.calls - 1)  # type: ignore[union-attr]
        for key in [k for k, routed in self.routes.items() if routed is backend]:
            del self.routes[key]
        if backend is self.backend:
            self.demote()

    def _route(self, shape) -> GemmBackend:
        if shape is None:
            return self.backend  # the backend's own checks will name the bad operand
        return self.routes.get(shape, self.backend)

    @staticmethod
    def _valid(out: Any, shape: tuple[int, ...], backend: GemmBackend) -> np.ndarray:
        if not isinstance(out, np.ndarray) or out.dtype != np.int32 or out.shape != shape:
            got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            raise GateError(f"GEMM backend {backend.name!r} returned {got}, not int32 {shape}")
        return out

    def _finish(self, a, b, out, muls: int, name: str) -> np.ndarray:
        self._units.counts.add("mul", muls)
        self.audit.check(a, b, out, name)
        return out

    def alternatives(self) -> list[GemmBackend]:
        """The selected backend and every later one in the order that passes its gate
        (the LUT reference excluded: it is the oracle, never a speed candidate)."""
        passing = [self.backend]
        for c in list(self._chooser.pending):
            if _name(c) == "reference":
                continue
            try:
                backend, report = self._chooser.gate_one(c)
            except BackendUnavailableError:
                continue
            if report.passed:
                passing.append(backend)
        return passing

    def demote(self) -> GateReport:
        """Drop the current backend for the next one in order that passes its gate.

        Returns that backend's gate report; GateError if none is left.
        """
        old = self.backend_name
        self.backend, self.gate_report = self._chooser.next_passing()
        self.routes.clear()
        log.warning("GEMM backend %s demoted; now using %s", old, self.backend_name)
        return self.gate_report


def select_gemm(
    units: Any,
    prefer: str | None = None,
    *,
    order: Sequence[Candidate] = BACKEND_ORDER,
    audit_every: int = AUDIT_EVERY,
    kernels: Kernels = REFERENCE,
    build: Build = make_backend,
    check: bool = True,
) -> Gemm:
    """Gate backends best first against the LUT reference of `units` and wrap the winner.

    units: verified Units (uses .mul_lut (256, 256) and .counts.add).
    prefer: force this backend (a name in `order`); GateError if it fails its gate.
    order: backends to try, best first, as names or backend instances.
    audit_every: audit one call in this many (see audit.py).
    kernels: the hot kernels the model uses with it, already gated (core/kernels.py).
    build: builds a backend named in `order` (pynode.gemm_backends.build_backend knows the
        ones outside the core).
    check: check every product (Freivalds, check.py); a wrong one is recomputed on the
        next backend that passes its gate, so no caller ever sees it.
    """
    names = [_name(c) for c in order]
    if prefer is not None and prefer not in names:
        raise UnknownBackendError(f"unknown GEMM backend {prefer!r}; valid: {', '.join(names)}")
    gate = ExactGate(ReferenceBackend(units.mul_lut))
    audit = GemmAudit(units.mul_lut, every=audit_every)
    product_check = ProductCheck(kernels) if check else None
    if prefer is None:
        chooser = _Chooser(gate, units.mul_lut, order, build)
        return Gemm(units, *chooser.next_passing(), chooser, audit, kernels, product_check)
    at = names.index(prefer)
    chooser = _Chooser(gate, units.mul_lut, order[at + 1 :], build)
    backend, report = chooser.gate_one(order[at])
    if not report.passed:
        raise GateError(
            f"forced GEMM backend {prefer!r} failed its exact gate at case "
            f"{report.failing_case}: {report.detail}"
        )
    return Gemm(units, backend, report, chooser, audit, kernels, product_check)
