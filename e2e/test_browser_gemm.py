"""The page's wasm SIMD GEMM in real Chromium: exact gate and bit equality with the reference.

A Web Worker on the server's origin boots Pyodide from /runtime/ and the pynode bundle from
/bundle/, as the page's worker does (pynode.bench.browser.run_python_in_worker), then runs
tests/pyodide/wasm_gemm_cases.py with the plain-function runner of the Node.js tier
(tests/pyodide/harness.py). Every case must pass in the browser: none may skip.
"""

from __future__ import annotations

import json

import pytest
from browser_helpers import REPO

from pynode.bench.browser import run_python_in_worker

pytestmark = [pytest.mark.slow, pytest.mark.netns]

HARNESS, CASES = "tests/pyodide/harness.py", "tests/pyodide/wasm_gemm_cases.py"
RUN = f"""
exec(open("/repo/{HARNESS}").read())
run_modules("/home/pyodide/bundle", ["/repo/{CASES}"])
"""


def test_wasm_simd_is_exact_in_chromium(browser, server_url):
    files = {f"/repo/{rel}": (REPO / rel).read_text() for rel in (HARNESS, CASES)}
    context = browser.new_context()
    try:
        results = json.loads(run_python_in_worker(context, server_url, RUN, files))
    finally:
        context.close()
    outcome = {r["test"]: r["status"] for r in results}
    details = "\n".join(r["detail"] for r in results if r["status"] != "passed")
    assert len(outcome) == 6 and set(outcome.values()) == {"passed"}, f"{outcome}\n{details}"
