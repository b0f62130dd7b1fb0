"""`python -m pynode verify`: the chain of trust, checked and printed as a table.

unit network == lookup table == native integer op == each fast GEMM backend
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pynode.gemm_backends import backend_order


@dataclass(frozen=True)
class CheckRow:
    check: str        # what was checked ("unit mul8", "gate blas_float", ...)
    domain: str       # how much of the input space it covered
    result: str       # "pass" or the reason it failed
    backend: str      # GEMM backend concerned, "-" for units
    seconds: float    # wall time of the check

    @property
    def passed(self) -> bool:
        return self.result == "pass"

    @property
    def skipped(self) -> bool:
        """Not run because it cannot run here (a backend this platform lacks): no failure."""
        return self.result.startswith("skipped")


def run_checks() -> list[CheckRow]:
    """Every start-up check a peer runs, as rows; never raises for a failed check."""
    rows: list[CheckRow] = []
    units = unit_checks(rows)
    if units is not None:
        rows.extend(gate_rows(units))
        rows.extend(route_rows())
    return rows


def unit_checks(rows: list[CheckRow]):
    """Append the float-environment, unit and LUT rows; the Units if all passed, else None."""
    from pynode.core.detmath import check_float_environment
    from pynode.core.errors import DaisyError
    from pynode.core.rng import check_bit_generator
    from pynode.core.units import certify_luts
    from pynode.unitfiles import load_default_units

    checks = [("IEEE-754 environment", "rounding, subnormals", check_float_environment),
              ("bit generator", "numpy Philox4x64 == pynode's", check_bit_generator),
              ("units", "full domains", load_default_units)]
    units = None
    for name, domain, check in checks:
        started = time.perf_counter()
        try:
            units = check() or units
        except DaisyError as exc:
            rows.append(CheckRow(name, domain, f"FAIL: {exc}", "-", time.perf_counter() - started))
            return None
        if name != "units":
            rows.append(CheckRow(name, domain, "pass", "-", time.perf_counter() - started))
    for unit, domain, result, seconds in units.verify_report():
        rows.append(CheckRow(f"unit {unit}", f"{domain:,} inputs", result, "-", seconds))
    started = time.perf_counter()
    try:
        certify_luts(units)
        lut_result = "pass"
    except DaisyError as exc:
        lut_result = f"FAIL: {exc}"
    rows.append(CheckRow("LUT == integer op", "65,536 + 65,536 + 256 cells", lut_result, "-",
                         time.perf_counter() - started))
    return units if lut_result == "pass" else None


def gate_rows(units) -> list[CheckRow]:
    """Gate every backend this platform has against the LUT reference, best first."""
    from pynode.core.gemm import BackendUnavailableError, ExactGate
    from pynode.core.gemm.reference import ReferenceBackend
    from pynode.gemm_backends import build_backend

    gate = ExactGate(ReferenceBackend(units.mul_lut))
    rows = []
    for name in backend_order():
        try:
            backend = build_backend(name, units.mul_lut)
        except BackendUnavailableError as exc:
            rows.append(CheckRow("exact gate", "-", f"skipped: {exc}", name, 0.0))
            continue
        report = gate.run(backend)
        result = "pass" if report.passed else f"FAIL at {report.failing_case}: {report.detail}"
        rows.append(CheckRow("exact gate", f"{report.cases // 2} cases x2", result, name,
                             report.seconds))
    return rows + kernel_rows()


def route_rows() -> list[CheckRow]:
    """Which gated backend computes each GEMM shape of the default model, as measured here
    (the same tuning a training run does; exact backends, so speed is all it decides)."""
    from pynode.config import RunConfig
    from pynode.core.errors import DaisyError
    from pynode.gemm_tuning import model_shapes, tune_gemm
    from pynode.run.assemble import build_trainer

    try:
        trainer = build_trainer(RunConfig(), backend=backend_order()[0])  # untuned
        routes = tune_gemm(trainer.gemm, model_shapes(trainer))
    except DaisyError as exc:
        return [CheckRow("backend per shape", "default model", f"FAIL: {exc}", "-", 0.0)]
    rows = []
    for r in routes:
        kind, bs, m, k, n = r.shape
        shape = (f"bmm BxMxKxN {bs}x{m}x{k}x{n}" if kind == "bmm"
                 else f"mm MxKxN {m}x{k}x{n}")
        times = " < ".join(f"{name} {t * 1e3:.3f} ms" for name, t in sorted(r.times.items(),
                                                                             key=lambda x: x[1]))
        rows.append(CheckRow("backend per shape", f"{shape}: {times}", "measured", r.backend,
                             r.times[r.backend]))
    return rows


def kernel_rows() -> list[CheckRow]:
    """The gate of this platform's fast hot kernels against the numpy reference, and
    whether they check every GEMM product."""
    ops, rows = kernel_gate()
    return [*rows, product_check_row(ops)]


def product_check_row(ops: Any) -> CheckRow:
    """The per-call product check (pynode.core.gemm.check, `--check-products`) on the
    kernels `ops`: a right product must pass and one with a single wrong cell must not."""
    import numpy as np

    from pynode.core.gemm.check import SECURITY_BITS, ProductCheck

    domain = f"--check-products: a wrong product passes with p <= 2^-{SECURITY_BITS}"
    started = time.perf_counter()
    a = (np.arange(37 * 131) % 255 - 128).astype(np.int8).reshape(37, 131)
    b = (np.arange(131 * 29) * 7 % 256 - 128).astype(np.int8).reshape(131, 29)
    right = np.matmul(a.astype(np.int32), b.astype(np.int32))
    wrong = right.copy()
    wrong[18, 14] += 1
    check = ProductCheck(ops)
    works = check.holds(a, b, right) and not check.holds(a, b, wrong)
    return CheckRow("product check", domain, "pass" if works else "FAIL: it missed a wrong "
                    "cell or refused a right product", ops.name, time.perf_counter() - started)


def kernel_gate(wrap: Callable[[Any], Any] | None = None) -> tuple[Any, list[CheckRow]]:
    """This platform's fast hot kernels (wasm SIMD in the page, numba natively) if they pass
    `gate_kernels`, else the numpy reference; and the "kernel gate" row that says which.
    `wrap` (a test hook) replaces the candidate before its gate."""
    from pynode.core.kernels import REFERENCE, gate_kernels
    from pynode.platform import IN_PYODIDE

    if IN_PYODIDE:
        from pynode.browser_kernels import WasmKernels
        from pynode.core.gemm import BackendUnavailableError

        try:
            candidate = WasmKernels()
        except BackendUnavailableError as exc:
            return REFERENCE, [CheckRow("kernel gate", "-", f"skipped: {exc} (the numpy "
                                        "reference serves)", WasmKernels.name, 0.0)]
    else:
        from pynode import native_kernels

        if not native_kernels.available():
            return REFERENCE, [CheckRow("kernel gate", "-", "skipped: numba is not installed "
                                        "(the numpy reference serves; pip install "
                                        "'daisychain[fast]')", "numba", 0.0)]
        candidate = native_kernels.NumbaKernels()
    if wrap is not None:
        candidate = wrap(candidate)
    started = time.perf_counter()
    report = gate_kernels(candidate)
    result = "pass" if report.passed else f"FAIL at {report.failing_case} (the numpy " \
        "reference serves)"
    row = CheckRow("kernel gate", f"{report.cases // 2} cases x2 == numpy", result, report.kernels,
                   time.perf_counter() - started)
    return (candidate if report.passed else REFERENCE), [row]


def verify_command(json_rows: bool = False) -> int:
    rows = run_checks()
    if json_rows:
        for row in rows:
            # a timing (measured) or a check that cannot run here (skipped) is no failure:
            # "passed" null, so that all(passed is not False) holds on a healthy machine
            # (it was false for every timing row of a verify that passed)
            ran = row.result != "measured" and not row.skipped
            print(json.dumps({**row.__dict__, "passed": row.passed if ran else None}))
    else:
        print_table(rows)
    measured = [r for r in rows if r.result == "measured"]  # timings, not checks
    checks = [r for r in rows if r.result != "measured"]
    failed = [r for r in checks if not (r.passed or r.skipped)]
    usable = [r for r in checks if r.check == "exact gate" and r.passed]
    if failed or not usable:
        print(f"\nverify FAILED: {len(failed)} check(s) failed; this peer must not train")
        return 1
    routed = sorted({r.backend for r in measured} - {usable[0].backend})
    print(f"\nverify passed: {len(checks)} checks; GEMM backend {usable[0].backend}"
          + (f", with {', '.join(routed)} on the shapes where it measured faster (timings "
             "vary with load; each run measures again)" if routed else ""))
    return 0


def print_table(rows: list[CheckRow]) -> None:
    header = ("check", "domain", "result", "backend", "time")
    cells = [(r.check, r.domain, r.result, r.backend, f"{r.seconds * 1000:.1f} ms") for r in rows]
    widths = [max(len(str(c[i])) for c in [header, *cells]) for i in range(len(header))]
    for line in [header, tuple("-" * w for w in widths), *cells]:
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
