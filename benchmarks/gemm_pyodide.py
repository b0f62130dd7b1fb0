"""`python -m pynode bench gemm` inside Pyodide (wasm numpy, no BLAS), via the Node runner:

    python -m server.runtime fetch
    python -m server.bundle /tmp/pynode.zip
    node tests/pyodide/run_tests.mjs --runtime "$(python -m server.runtime path)" \\
        --bundle /tmp/pynode.zip --root . --module benchmarks/gemm_pyodide.py

It prints the same table as natively (256^3 and 512^3; 1024^3 takes minutes on wasm).
"""

from pynode.bench.gemm import run
from pynode.platform import IN_PYODIDE


def test_gemm_throughput_table():
    rows = run(json_out=False, repeats=3, shapes=(256, 512))
    timed = [r for r in rows if "gops" in r or "ms" in r]
    assert timed, "no backend was timed"
    assert IN_PYODIDE, "this benchmark is meant to run under Pyodide"
