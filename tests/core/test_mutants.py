"""The mutation score: every deliberately wrong backend of tests/core/gemm_mutants.py is
caught before any wrong product is used, by the start-up gate or by the per-call product
check, and short training runs with each end on the clean run's hashes.

The oracle is an int64 matmul (gemm_mutants.exact) and a clean run on numpy_int.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from gemm_mutants import CheckedOnly, classes, exact, score

from pynode import native_kernels
from pynode.config import RunConfig
from pynode.core.errors import DaisyError
from pynode.core.gemm import ExactGate, GemmAudit, select_gemm
from pynode.core.gemm.reference import ReferenceBackend
from pynode.core.kernels import REFERENCE
from pynode.run.assemble import build_trainer

# 3 steps of a 1-block GPT with tails everywhere: 3 x 45 = 135 rows, width 36 (heads of
# 18), so inner sizes 36, 108, 144 and 45; a fraction of a second a run.
TINY = RunConfig(steps=3, seed=2, width=36, layers=1, heads=2, seq=45, microbatch_size=3,
                 microbatches=2)
NEVER = 10**9  # audit interval: the sampled audit off, so the gate and the check are measured


@pytest.fixture(scope="module")
def units():
    from pynode.unitfiles import load_default_units

    return load_default_units()


@pytest.fixture(scope="module")
def gate(units):
    return ExactGate(ReferenceBackend(units.mul_lut))


def run(gemm, units) -> list[str]:
    trainer = build_trainer(TINY, arithmetic=(units, gemm))

    async def loop() -> list[str]:
        hashes = []
        while trainer.state.step < TINY.steps:
            hashes.append((await trainer.step()).hash)
        return hashes

    return asyncio.run(loop())


@pytest.fixture(scope="module")
def clean(units) -> list[str]:
    return run(select_gemm(units, order=["numpy_int"], kernels=REFERENCE, check=False), units)


def test_the_corpus_is_large_and_every_mutant_really_wrong():
    """Each mutant gives a wrong result, a result that later changes, or changes its
    operands on its own calls: otherwise catching it would prove nothing."""
    names = [cls.name for cls in classes()]
    assert len(names) >= 20 and len(set(names)) == len(names)
    for cls in classes():
        mutant, kept, touched = cls(), [], False
        for a, b in mutant.calls():
            a0, b0 = a.copy(), b.copy()
            got = mutant.bmm(a, b) if a.ndim == 3 else mutant.matmul(a, b)
            touched |= not (np.array_equal(a, a0) and np.array_equal(b, b0))
            kept.append((got, exact(a0, b0)))
        assert touched or any(not np.array_equal(g, w) for g, w in kept), cls.name


@pytest.mark.parametrize("cls", classes(), ids=lambda c: c.name)
def test_every_mutant_is_caught_before_its_product_is_used(units, gate, cls):
    result = score(cls, units, gate)
    assert result.check, result


@pytest.mark.skipif(not native_kernels.available(), reason="numba not installed")
@pytest.mark.parametrize("cls", classes(), ids=lambda c: c.name)
def test_the_fused_check_alone_catches_what_the_check_alone_does(units, gate, cls):
    """The check as it rides in numba's quantize and epilogue passes (Gemm.scaled), each
    mutant forced in with no gate: every product the separate check alone catches, and
    the caller gets the exact result."""
    result = score(cls, units, gate, native_kernels.NumbaKernels())
    assert result.fused_alone is not None
    assert result.fused_alone or not result.check_alone, result


def test_the_grid_and_the_check_each_catch_what_the_rest_miss(units, gate):
    results = {cls.name: score(cls, units, gate) for cls in classes()}
    grid_only = {n for n, r in results.items() if r.gate_case.startswith("grid_")}
    assert {"many_rows_k_tail", "batches_of_16_only", "square_output_transposed"} <= grid_only
    past_gate = {n for n, r in results.items() if not r.gate}
    # a stale cache by address meets the gate only where the allocator reuses an address
    assert {"wrong_at_one_k", "wrong_at_k144"} <= past_gate
    assert past_gate <= {"wrong_at_one_k", "wrong_at_k144", "stale_cache_by_address"}
    # the check alone misses what changes after it looked: an aliased result, a written B
    assert {n for n, r in results.items() if not r.check_alone} == {"aliased_result",
                                                                    "writes_into_b"}


def test_checked_only_recomputes_a_wrong_product():
    cls = next(c for c in classes() if c.name == "wrong_at_one_k")
    checked = CheckedOnly(cls(), REFERENCE)
    a, b = next(cls().calls())
    assert np.array_equal(checked.matmul(a, b), exact(a, b)) and checked.check.failures == 1


@pytest.mark.full  # 50 short training runs
def test_training_with_any_mutant_ends_on_the_clean_hashes(units, clean, caplog):
    """Every mutant in front of numpy_int, gated and checked: the run's hashes are the clean
    run's. The same mutants forced in with neither gate nor check change them (those wrong
    at this model's shapes; or the run is refused), so the comparison can fail."""
    forced = select_gemm(units, order=["numpy_int"], kernels=REFERENCE, check=False)
    changed = set()
    kernels = [REFERENCE]  # the check on its own (holds); with numba, fused as well
    if native_kernels.available():
        kernels.append(native_kernels.NumbaKernels())
    with caplog.at_level(logging.ERROR):
        for cls in classes():
            for ops in kernels:
                gemm = select_gemm(units, order=[cls(), "numpy_int"], kernels=ops,
                                   audit_every=NEVER, check=True)
                assert run(gemm, units) == clean, (cls.name, ops.name)
            forced.backend, forced.audit = cls(), GemmAudit(units.mul_lut, every=NEVER)
            forced.audit.calls = 1  # not even the audit's first call
            try:
                if run(forced, units) != clean:
                    changed.add(cls.name)
            except DaisyError:  # a refusal (e.g. gradients past the fixed-point bound)
                changed.add(cls.name)
    assert {"wrong_at_k144", "many_rows_k_tail", "stale_cache_by_address"} <= changed, changed
    print(f"{len(changed)} of {len(classes())} mutants change an unguarded run: {sorted(changed)}")
    assert len(changed) >= 12, changed


def test_the_benchmark_prints_every_share(capsys):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "mutation_score.py"
    spec = importlib.util.spec_from_file_location("mutation_score", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--json", "--no-cross-peer"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in rows[:-1]] == [cls.name for cls in classes()]
    assert rows[-1]["mutants"] == len(classes()) and rows[-1]["gate + per-call check"] == 1.0
    assert rows[-1]["gate"] == sum(r["gate"] for r in rows[:-1]) / len(classes())


@pytest.mark.full  # 26 three-tab room runs, about a minute
def test_the_cross_peer_check_alone_lets_no_mutant_change_a_reported_step():
    """Three tabs, one computing with the mutant and no gate, check or audit. No honest tab
    ever reports a step hash other than the clean run's: a mutant wrong at the model's
    shapes is named by the recomputed digests and the others end on the clean hashes; one
    wrong only at the GEMM probe's shape stops the room at the fork; one never wrong there
    moves no hash."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "mutation_score.py"
    spec = importlib.util.spec_from_file_location("mutation_score", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    units = bench.load_default_units()
    reference = bench.reference_hashes(units)
    seen = {cls.name: bench.cross_peer(cls, units, reference) for cls in classes()}
    assert "MISSED" not in seen.values(), seen
    assert sum(v == "caught" for v in seen.values()) >= 10, seen
