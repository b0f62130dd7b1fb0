"""Runs inside Pyodide (see test_under_pyodide.py): generation from a checkpoint must give the
bytes that the native run of the same checkpoint, prompts and samplings wrote to the
expectation file, through the page's arithmetic (the wasm SIMD GEMM and kernels).
"""

import json
from pathlib import Path

from pynode.run.generate import Sampling, load_generator

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = ROOT / "artifacts" / "pyodide_generate_expected.json"


def test_generated_bytes_match_native():
    expected = json.loads(EXPECTED.read_text())
    generator = load_generator((ROOT / expected["checkpoint"]).read_bytes())
    for case in expected["cases"]:
        prompt = bytes.fromhex(case["prompt"])
        got = bytes(generator.generate(prompt, Sampling(**case["sampling"]))).hex()
        assert got == case["bytes"], f"{case}: wasm gave {got}"
    assert generator.decoder.model.gemm.backend_name == expected["wasm_backend"]
    assert generator.decoder.model.ops.name == expected["wasm_kernels"]
