"""The page's wasm SIMD GEMM and hot kernels in real Chromium: exact gates and bit equality
with the references, and `python -m pynode bench browser` end to end.

A Web Worker on the server's origin boots Pyodide from /runtime/ and the pynode bundle from
/bundle/, as the page's worker does (pynode.bench.browser.run_python_in_worker), then runs
tests/pyodide/wasm_gemm_cases.py (or wasm_kernels_cases.py) with the plain-function runner
of the Node.js tier (tests/pyodide/harness.py). Every case must pass in the browser: none may skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from browser_helpers import REPO, missing_browser_parts

from pynode.bench.browser import run_python_in_worker

pytestmark = [pytest.mark.slow]

HARNESS = "tests/pyodide/harness.py"


def run_cases(browser, server_url, cases: str) -> list[dict]:
    """The test functions of `cases` in a Pyodide worker of the browser: their results."""
    files = {f"/repo/{rel}": (REPO / rel).read_text() for rel in (HARNESS, cases)}
    run = f"""
exec(open("/repo/{HARNESS}").read())
run_modules("/home/pyodide/bundle", ["/repo/{cases}"])
"""
    context = browser.new_context()
    try:
        return json.loads(run_python_in_worker(context, server_url, run, files))
    finally:
        context.close()


def test_wasm_simd_is_exact_in_chromium(browser, server_url):
    results = run_cases(browser, server_url, "tests/pyodide/wasm_gemm_cases.py")
    outcome = {r["test"]: r["status"] for r in results}
    details = "\n".join(r["detail"] for r in results if r["status"] != "passed")
    assert len(outcome) == 6 and set(outcome.values()) == {"passed"}, f"{outcome}\n{details}"


def test_wasm_kernels_are_exact_in_chromium(browser, server_url):
    """The page's wasm hot kernels (tests/pyodide/wasm_kernels_cases.py), in Chromium's V8."""
    results = run_cases(browser, server_url, "tests/pyodide/wasm_kernels_cases.py")
    outcome = {r["test"]: r["status"] for r in results}
    details = "\n".join(r["detail"] for r in results if r["status"] != "passed")
    assert len(outcome) == 11 and set(outcome.values()) == {"passed"}, f"{outcome}\n{details}"


def test_bench_browser_reports_a_tab_and_a_native_step():
    """A tiny config: the tab trains with wasm_simd, natively blas_float, same final hash."""
    reason = missing_browser_parts()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the browser tests must run)")
        pytest.skip(reason)
    config = {"width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
              "microbatches": 2}
    done = subprocess.run([sys.executable, "-m", "pynode", "bench", "browser", "--json",
                           "--steps", "3", "--config", json.dumps(config)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["tab_backend"] == "wasm_simd" and report["same_hash"], report
    assert report["tab_kernels"] == "wasm", report
    assert report["native_backend"] and report["tab_over_native"] > 0
    assert report["threads"]["native_blas"] == 1 and set(report["cpu"]["flags"]) == {
        "avx2", "avx512f", "avx512_vnni", "avx_vnni"}
    assert {tuple(r["shape"]) for r in report["page_gemm"]} >= {(1, 512, 64, 192)}


def test_bench_browser_stops_with_the_reason_when_the_tab_cannot_start(tmp_path):
    """No Pyodide runtime in the cache: the tab's worker cannot load, and the benchmark must
    say so and exit 2 (it used to wait forever on a page that could never start)."""
    reason = missing_browser_parts()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the browser tests must run)")
        pytest.skip(reason)
    env = {**os.environ, "DAISYCHAIN_CACHE": str(tmp_path / "empty-cache")}
    done = subprocess.run([sys.executable, "-m", "pynode", "bench", "browser", "--steps", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-2000:])
    assert "the tab could not start" in done.stderr
    assert "python -m server.runtime fetch" in done.stderr
