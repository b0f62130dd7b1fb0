"""Core tests inside Pyodide 0.27.7 (numpy 2.0.2 on wasm32) under Node.js (pyodide_node.py).

Needs node and the fetched runtime (`python -m server.runtime fetch`). Without them these
tests skip with the reason, except under CI=true, where a missing runtime is a failure.
Each Pyodide run boots Pyodide and numpy first (seconds), so every module shares one run
(the runner's self-check among them, whose failures are on purpose) and those tests are
also `slow`; the `*_natively` tests need neither.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pyodide_node import finish_in_pyodide, node_runtime, unavailable
from pyodide_session import (
    GENERATE_CASES,
    PYODIDE_MODULES,
    SELFCHECK,
    STARTED,
    TRAINER_CASES,
    WASM_CASES,
    start,
)


@pytest.fixture(scope="module")
def runtime() -> Path:
    return node_runtime()


@pytest.fixture(scope="module")
def session(runtime, request) -> tuple:
    """Every module in one Pyodide run: booting Pyodide and numpy is most of a run's time.
    Started in the background at collection's end (conftest.py here) or now. Returns the
    runner's process and its report; each test reads its modules' results."""
    started = request.config.stash.get(STARTED, None) or start(runtime)
    proc, report = finish_in_pyodide(started)
    assert report is not None, f"runner gave no results (rc {proc.returncode}):\n{proc.stderr}"
    return proc, report


def results_of(report: dict, modules: list[str]) -> list[dict]:
    """The results of `modules` (repository paths; the runner reports them under /repo)."""
    found = [r for r in report["results"] if any(r["module"].endswith(m) for m in modules)]
    assert found, f"no results for {modules}"
    return found


def failures(results: list[dict]) -> str:
    return "\n".join(f"{r['test']}:\n{r['detail']}" for r in results if r["status"] == "failed")


@pytest.mark.slow
def test_core_modules_pass_under_pyodide(session, record_property):
    proc, report = session
    record_property("pyodide_boot_ms", round(report["timing"]["boot_ms"]))
    record_property("pyodide_numpy_ms", round(report["timing"]["numpy_ms"]))
    results = results_of(report, PYODIDE_MODULES)
    assert not failures(results), f"tests failed under Pyodide:\n{failures(results)}"
    passed = sum(r["status"] == "passed" for r in results)
    assert passed > 0, proc.stdout[-2000:]
    print(f"{passed} core tests passed | boot", round(report["timing"]["boot_ms"]), "ms")


@pytest.mark.slow
def test_runner_reports_failures_and_skips(session):
    proc, report = session
    outcome = {r["test"]: r["status"] for r in results_of(report, [SELFCHECK])}
    assert outcome == {
        "test_runs_on_wasm_numpy": "passed",
        "test_fails_on_purpose": "failed",
        "test_skips_on_purpose": "skipped",
        "test_needs_a_fixture": "failed",
    }
    counts = {s: sum(r["status"] == s for r in report["results"])
              for s in ("passed", "failed", "skipped")}
    assert {s: report[s] for s in counts} == counts
    assert proc.returncode == 1  # the self-check fails on purpose
    assert proc.stdout.splitlines()[-1] == (
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    assert "deliberate failure" in proc.stdout


@pytest.mark.slow
def test_training_steps_match_native_under_pyodide(session):
    """The same 3-step run gives the same per-step hashes natively and on wasm; a config
    too big for a tab is refused there before it grows the heap."""
    results = results_of(session[1], [TRAINER_CASES])
    assert len(results) == 2, results
    for result in results:
        assert result["status"] == "passed", result["detail"]


@pytest.mark.slow
def test_generation_matches_native_under_pyodide(session):
    """The same checkpoint, prompts and samplings give the same bytes natively and on wasm."""
    (result,) = results_of(session[1], [GENERATE_CASES])
    assert result["status"] == "passed", result["detail"]


def check_wasm_cases(session: tuple, which: str) -> None:
    """Every case of one wasm case module passed, all of them (where this runtime cannot
    run wasm SIMD at all, skip, or fail under CI=true)."""
    module, count = WASM_CASES[which]
    results = results_of(session[1], [module])
    assert not failures(results), failures(results)
    skipped = [r for r in results if r["status"] == "skipped"]
    if skipped and len(skipped) == len(results):
        unavailable(skipped[0]["detail"])
    assert [r["status"] for r in results] == ["passed"] * count, results


@pytest.mark.slow
def test_wasm_simd_gemm_under_pyodide(session):
    """The page's wasm SIMD backend: exact gate, bit-equal to the reference, selected."""
    check_wasm_cases(session, "gemm")


@pytest.mark.slow
def test_wasm_kernels_under_pyodide(session):
    """The page's wasm hot kernels: kernel gate, the reference's bytes, broken ones refused,
    selected by the page's checks."""
    check_wasm_cases(session, "kernels")


def test_wasm_kernels_are_unavailable_natively():
    from pynode.browser_kernels import WasmKernels, select_kernels
    from pynode.core.gemm import BackendUnavailableError
    from pynode.core.kernels import REFERENCE

    with pytest.raises(BackendUnavailableError, match="only under Pyodide"):
        WasmKernels()
    assert select_kernels() == (REFERENCE, None)


def test_wasm_simd_is_unavailable_natively():
    from pynode.browser_gemm import PAGE_ORDER, WasmSimdBackend
    from pynode.core.gemm import BackendUnavailableError
    from pynode.gemm_backends import available_backends
    from pynode.unitfiles import load_default_units

    with pytest.raises(BackendUnavailableError, match="only under Pyodide"):
        WasmSimdBackend()
    backends, skipped = available_backends(PAGE_ORDER, load_default_units().mul_lut)
    assert [b.name for b in backends] == list(PAGE_ORDER[1:])
    assert [name for name, _ in skipped] == ["wasm_simd"]


@pytest.mark.slow
def test_wasm_philox_under_pyodide(session, record_property):
    """The page's wasm Philox4x64: numpy's words bit for bit, checked; its speed recorded."""
    check_wasm_cases(session, "philox")
    (line,) = [ln for ln in session[0].stdout.splitlines() if ln.startswith("PHILOX_BENCH ")]
    bench = json.loads(line[len("PHILOX_BENCH "):])
    for name in ("numpy_words_per_s", "wasm_words_per_s"):
        record_property(f"philox_{name}", round(bench[name]))
    print(f"Philox4x64 under Pyodide, {bench['words']} words: numpy "
          f"{bench['numpy_words_per_s'] / 1e6:.1f} M words/s, wasm "
          f"{bench['wasm_words_per_s'] / 1e6:.1f} M words/s")


def test_wasm_philox_falls_back_to_numpy_natively():
    from pynode import browser_philox
    from pynode.core import rng

    assert not browser_philox.available()
    for key, n in [((), 0), ((1, 2), 7), ((2**64 - 1, 2**200), 1001)]:
        assert np.array_equal(browser_philox.raw64_wasm(key, n), rng.raw64(key, n))
    with pytest.raises(browser_philox.PhiloxKernelError, match="only under Pyodide"):
        browser_philox.load_kernel()
