"""Per-shape backend routing (pynode/gemm_tuning.py): which backend computes a shape is
decided by measurement, never changes a bit, and every routed call is still counted and
audited by the gated Gemm."""

from __future__ import annotations

import time

import numpy as np

from pynode import gemm_tuning
from pynode.core.gemm import select_gemm
from pynode.core.gemm.numpy_int import NumpyIntBackend
from pynode.unitfiles import load_default_units


class Sleepy(NumpyIntBackend):
    """Exact, and 20 ms slower than anything else on every call (which it counts)."""

    name = "sleepy"
    calls = 0

    def _matmul(self, a, b):
        Sleepy.calls += 1
        time.sleep(0.02)
        return super()._matmul(a, b)

    def _bmm(self, a, b):
        Sleepy.calls += 1
        time.sleep(0.02)
        return super()._bmm(a, b)


class Quick(NumpyIntBackend):
    name = "quick"


def test_routes_each_shape_to_the_fastest_gated_backend_and_stays_exact():
    units = load_default_units()
    gemm = select_gemm(units, order=[Sleepy(), Quick(), "reference"])
    assert gemm.backend_name == "sleepy"  # first in order: the default before tuning
    shapes = {("mm", 1, 9, 33, 7), ("bmm", 3, 5, 17, 4)}
    routes = gemm_tuning.tune_gemm(gemm, shapes)
    assert {r.backend for r in routes} == {"quick"}
    assert all("reference" not in r.times for r in routes)  # the oracle is never a candidate
    assert set(gemm.routes) == shapes
    g = np.random.default_rng(1)
    a = g.integers(-128, 128, (9, 33), dtype=np.int8)
    b = g.integers(-128, 128, (33, 7), dtype=np.int8)
    before, sleepy_calls = units.counts.snapshot()["mul"], Sleepy.calls
    out = gemm.matmul(a, b)
    assert Sleepy.calls == sleepy_calls  # computed by "quick", not "sleepy" (untimed: a
    # loaded machine can hold a process off its core for longer than the 20 ms sleep)
    assert np.array_equal(out, a.astype(np.int64) @ b.astype(np.int64))
    assert units.counts.snapshot()["mul"] == before + 9 * 33 * 7


def test_a_near_tie_keeps_the_selected_backend():
    units = load_default_units()
    gemm = select_gemm(units, order=[Quick(), NumpyIntBackend(), "reference"])
    routes = gemm_tuning.tune_gemm(gemm, {("mm", 1, 8, 8, 8)}, margin=0.0)
    assert gemm.routes == {} and routes[0].backend == "quick"


def test_summary_names_the_routed_shapes():
    units = load_default_units()
    gemm = select_gemm(units, order=[Sleepy(), Quick()])
    gemm_tuning.tune_gemm(gemm, {("mm", 1, 4, 4, 4), ("mm", 1, 5, 5, 5)})
    assert gemm_tuning.summary(gemm) == "sleepy (quick on 2 shapes: faster there, measured)"
