"""Known outcomes for checking the Pyodide runner itself (not collected by pytest).

test_under_pyodide.py runs this module with the others and expects exactly: 1 passed, 2 failed,
1 skipped here.
"""

import sys
import unittest


def test_runs_on_wasm_numpy():
    import numpy as np

    assert sys.platform == "emscripten", sys.platform
    assert np.__version__ == "2.0.2", np.__version__
    a = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)  # (16, 16) int8
    assert int((a.astype(np.int32) * a.astype(np.int32)).sum()) == 1398144


def test_fails_on_purpose():
    assert 1 + 1 == 3, "deliberate failure"


def test_skips_on_purpose():
    raise unittest.SkipTest("deliberate skip")


def test_needs_a_fixture(tmp_path):
    raise AssertionError("never called: Pyodide has no fixtures")
