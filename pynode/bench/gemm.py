"""Exact int8 GEMM throughput of every available backend against numpy float32 matmul.

Every backend this platform gates (`pynode.gemm_backends.backend_order`): natively the
BACKEND_ORDER of pynode/core/gemm, under Pyodide the page's order (wasm_simd first).

    python -m pynode bench gemm [--json] [--repeats N]

For each shape M = K = N in (256, 512, 1024) it times each backend's `matmul` and numpy
float32 `@` on the same machine in the same run, in alternating rounds so that load
from other processes hits both alike, and reports the best of `repeats` rounds:
GOP/s (2 M N K / seconds) and the ratio to float32. Each backend is first gated
against the LUT reference of the verified units; a backend that fails is still timed
but marked exact=false. A last row measures the live audit's cost at 512^3.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np

from pynode.bench import bench_parser
from pynode.bench.machine import machine_info, machine_line
from pynode.core import rng
from pynode.core.gemm import (
    BackendUnavailableError,
    ExactGate,
    GemmBackend,
    make_backend,
)
from pynode.core.gemm.audit import AUDIT_EVERY, GemmAudit
from pynode.core.gemm.reference import ReferenceBackend

BENCH_PURPOSE = 0xBE4C
SHAPES = (256, 512, 1024)
REFERENCE_MAX = 256  # the LUT reference takes seconds per call above this
AUDIT_SHAPE = 512  # M = K = N of the product whose audit is timed


def _best_pair(f: Callable[[], object], g: Callable[[], object], repeats: int):
    """Best wall time of f and of g over `repeats` alternating rounds.

    Alternating spreads other processes' load over both. Each timed call follows an
    untimed call of the same function, so the idle-spinning threads one library leaves
    behind (torch's OpenMP, OpenBLAS) cost the warm-up, not the other's measurement."""
    tf, tg = [], []
    for _ in range(repeats):
        for fn, times in ((f, tf), (g, tg)):
            fn()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return min(tf), min(tg)


def _operands(n: int) -> tuple[np.ndarray, ...]:
    a = (rng.randint((BENCH_PURPOSE, n, 0), (n, n), 256) - 128).astype(np.int8)
    b = (rng.randint((BENCH_PURPOSE, n, 1), (n, n), 256) - 128).astype(np.int8)
    return a, b, a.astype(np.float32), b.astype(np.float32)


def _time_backend(backend: GemmBackend, n: int, repeats: int, exact: bool) -> dict:
    a, b, af, bf = _operands(n)
    seconds, f32_seconds = _best_pair(lambda: backend.matmul(a, b), lambda: af @ bf, repeats)
    ops = 2.0 * n**3
    return {
        "bench": "gemm",
        "backend": backend.name,
        "m": n,
        "k": n,
        "n": n,
        "exact": exact,
        "seconds": seconds,
        "gops": ops / seconds / 1e9,
        "f32_gops": ops / f32_seconds / 1e9,
        "ratio_vs_f32": f32_seconds / seconds,
    }


def _audit_row(mul_lut: np.ndarray, repeats: int) -> dict:
    n = AUDIT_SHAPE
    a, b, af, bf = _operands(n)
    out = make_backend("numpy_int", mul_lut).matmul(a, b)
    audit = GemmAudit(mul_lut, every=1)
    t_audit, t_f32 = _best_pair(lambda: audit.check(a, b, out, "bench"), lambda: af @ bf, repeats)
    return {
        "bench": "gemm_audit",
        "m": n,
        "k": n,
        "n": n,
        "cells": audit.cells_checked // max(1, audit.audits),
        "audit_seconds": t_audit,
        "f32_seconds": t_f32,
        "overhead_every_call": t_audit / t_f32,
        "audit_every": AUDIT_EVERY,
        "overhead_default": t_audit / t_f32 / AUDIT_EVERY,
    }


def run(json_out: bool, repeats: int = 7, shapes: tuple[int, ...] | None = None) -> list[dict]:
    """Time every backend at 256^3, 512^3, 1024^3; print rows (JSON lines or a table)."""
    from pynode.gemm_backends import backend_order, build_backend
    from pynode.unitfiles import load_default_units

    lut = load_default_units().mul_lut
    gate = ExactGate(ReferenceBackend(lut))
    rows: list[dict] = []
    emit = _json_line if json_out else _table_line
    if json_out:
        rows.append({"bench": "machine", **machine_info()})
        emit(rows[-1])
    else:
        print(f"machine: {machine_line()}")
        print(f"numpy {np.__version__}; best of {repeats}; GOP/s = 2*M*N*K / s")
        print(
            f"{'backend':<12} {'M=K=N':>6} {'exact':>5} {'ms':>9} {'GOP/s':>8} {'f32 GOP/s':>9} "
            f"{'vs f32':>6}"
        )
    for name in backend_order():
        try:
            backend = build_backend(name, lut)
        except BackendUnavailableError as exc:
            rows.append({"bench": "gemm", "backend": name, "skipped": str(exc)})
            emit(rows[-1])
            continue
        exact = gate.run(backend).passed
        for n in SHAPES if shapes is None else shapes:
            if name == "reference" and n > REFERENCE_MAX:
                continue
            reps = 1 if name == "reference" else repeats
            rows.append(_time_backend(backend, n, reps, exact))
            emit(rows[-1])
    rows.append(_audit_row(lut, repeats))
    emit(rows[-1])
    return rows


def _json_line(row: dict) -> None:
    print(json.dumps(row, sort_keys=True), flush=True)


def _table_line(row: dict) -> None:
    if "skipped" in row:
        print(f"{row['backend']:<12} skipped: {row['skipped']}")
    elif row["bench"] == "gemm_audit":
        print(
            f"audit at {row['m']}^3: {row['cells']} cells in {row['audit_seconds'] * 1e6:.0f} us "
            f"= {row['overhead_every_call']:.2%} of a float32 GEMM per audited call, "
            f"{row['overhead_default']:.3%} at the default 1 in {row['audit_every']}"
        )
    else:
        print(
            f"{row['backend']:<12} {row['m']:>6} {str(row['exact']).lower():>5} "
            f"{row['seconds'] * 1e3:>9.3f} {row['gops']:>8.1f} {row['f32_gops']:>9.1f} "
            f"{row['ratio_vs_f32']:>6.2f}",
            flush=True,
        )


def main(argv: list[str]) -> int:
    """CLI entry: `python -m pynode bench gemm [--json] [--repeats N]`."""
    parser = bench_parser("gemm", __doc__)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds; the best is kept")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    run(args.json, args.repeats)
    return 0
