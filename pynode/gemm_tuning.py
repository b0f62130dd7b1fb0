"""Which gated GEMM backend is fastest for each GEMM shape a model uses, measured here.

Exact backends give the same bits, so the choice changes speed only. A backend's speed
depends on the CPU (torch's int8 kernel is ~7x float32 sgemm with VNNI and slower than
it without), on the shape and on call overhead, so nothing is assumed: the model's own
shapes are recorded from one microbatch, every backend that passed its exact gate is
timed on each, and `Gemm.routes` sends each shape to the fastest.

Legend: kind "mm" or "bmm", B batch (1 for mm), M rows, K reduction length, N columns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

Shape = tuple[str, int, int, int, int]  # (kind, B, M, K, N)


class _Recorder:
    """Stands in for the Gemm while one microbatch runs: notes shapes, counts nothing."""

    def __init__(self, gemm: Any) -> None:
        self.gemm, self.kernels, self.shapes = gemm, gemm.kernels, set()

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        self.shapes.add(("mm", 1, *a.shape, b.shape[-1]))
        return self.gemm.backend.matmul(a, b)

    def bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        self.shapes.add(("bmm", *a.shape, b.shape[-1]))
        return self.gemm.backend.bmm(a, b)


def model_shapes(trainer: Any) -> set[Shape]:
    """The GEMM shapes of one microbatch of `trainer`'s model (its step-0 microbatch 0)."""
    model, cfg = trainer.model, trainer.cfg
    recorder = _Recorder(trainer.gemm)
    model.gemm = recorder
    try:
        batch = trainer.task.sample(cfg, 0, 0)
        trainer.task.loss(model, trainer.state.params, batch, (cfg.seed, 0, 0))
    finally:
        model.gemm = recorder.gemm
    return recorder.shapes


# Tuning pays for itself only where GEMMs cost something: below this many multiplies per
# microbatch (test-sized models) the selected backend serves every shape.
MIN_MULS = 50_000_000


def macs(shapes: set[Shape]) -> int:
    return sum(bs * m * k * n for _, bs, m, k, n in shapes)


def _operands(shape: Shape) -> tuple[np.ndarray, np.ndarray]:
    _, bs, m, k, n = shape
    g = np.random.default_rng(0)
    return (g.integers(-127, 128, (bs, m, k), dtype=np.int8),
            g.integers(-127, 128, (bs, k, n), dtype=np.int8))


def _call(backend: Any, shape: Shape, a: np.ndarray, b: np.ndarray) -> float:
    started = time.perf_counter()
    if shape[0] == "bmm":
        backend.bmm(a, b)
    else:
        backend.matmul(a[0], b[0])
    return time.perf_counter() - started


def best_times(candidates: list[Any], shape: Shape, rounds: int = 3) -> dict[str, float]:
    """Best call time of each backend on random int8 operands of `shape`, after a warm-up
    call each (first-call allocations, kernel JIT). The candidates take turns round by
    round, so a burst of load from other processes hits them alike; one already 4x
    slower than the first after its first round is not timed further."""
    a, b = _operands(shape)
    for c in candidates:
        _call(c, shape, a, b)
    best = {c.name: _call(c, shape, a, b) for c in candidates}
    alive = [c for c in candidates if best[c.name] <= 4 * best[candidates[0].name]]
    for _ in range(rounds - 1):
        for c in alive:
            best[c.name] = min(best[c.name], _call(c, shape, a, b))
    return best


@dataclass(frozen=True)
class Route:
    shape: Shape
    backend: str  # the fastest
    times: dict[str, float]  # seconds per call, every candidate


def tune_gemm(gemm: Any, shapes: set[Shape], margin: float = 0.9) -> list[Route]:
    """Route each shape to the fastest gated backend (one that beats the selected backend
    by the margin: near-ties stay put). Returns what was measured, largest shapes first."""
    candidates = gemm.alternatives()
    routes = []
    for shape in sorted(shapes, key=lambda s: -s[1] * s[2] * s[3] * s[4]):
        times = best_times(candidates, shape)
        best = min(candidates, key=lambda c: times[c.name])
        if best is not gemm.backend and times[best.name] < margin * times[gemm.backend.name]:
            gemm.routes[shape] = best
        routes.append(Route(shape, gemm.routes.get(shape, gemm.backend).name, times))
    return routes


def tune_trainer(trainer: Any) -> list[Route]:
    """Record the model's GEMM shapes and route each to its fastest backend (nothing for
    models below MIN_MULS a microbatch, or without a gated Gemm)."""
    if not hasattr(trainer.gemm, "alternatives"):
        return []
    shapes = model_shapes(trainer)
    if macs(shapes) < MIN_MULS:
        return []
    return tune_gemm(trainer.gemm, shapes)


def summary(gemm: Any) -> str:
    """One line for a run header: the selected backend and the shapes routed elsewhere."""
    others: dict[str, int] = {}
    for backend in gemm.routes.values():
        others[backend.name] = others.get(backend.name, 0) + 1
    rest = ", ".join(f"{name} on {count} shape{'s' * (count > 1)}"
                     for name, count in sorted(others.items()))
    return gemm.backend_name + (f" ({rest}: faster there, measured)" if rest else "")
