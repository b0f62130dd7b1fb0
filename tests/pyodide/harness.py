"""Runs the `test_*` functions of test modules without pytest; run_tests.mjs loads it in Pyodide.

Conventions a module follows to run here and under pytest alike: tests are plain functions
taking no arguments, they fail by raising (usually `assert`), and skip by raising
`unittest.SkipTest` (which pytest also reports as a skip).
"""

import importlib.util
import inspect
import json
import sys
import time
import traceback
import unittest
from pathlib import Path


def load_module(path: str):
    name = "pyodide_test_" + Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_test(module_path: str, name: str, fn) -> dict:
    result = {"module": module_path, "test": name, "status": "passed", "detail": ""}
    needed = [p.name for p in inspect.signature(fn).parameters.values() if p.default is p.empty]
    start = time.perf_counter()
    try:
        if needed:
            raise TypeError(f"{name} needs pytest fixtures {needed}; it cannot run in Pyodide")
        fn()
    except unittest.SkipTest as exc:
        result.update(status="skipped", detail=str(exc))
    except Exception:
        result.update(status="failed", detail=traceback.format_exc())
    result["seconds"] = time.perf_counter() - start
    return result


def run_modules(bundle_dir: str, module_paths, select: str = "") -> str:
    """Run every selected test of each module; returns the results as a JSON list."""
    if bundle_dir not in sys.path:
        sys.path.insert(0, bundle_dir)
    results = []
    for path in module_paths:
        try:
            module = load_module(path)
        except Exception:
            results.append({"module": path, "test": "<import>", "status": "failed",
                            "detail": traceback.format_exc(), "seconds": 0.0})
            continue
        tests = [(n, f) for n, f in vars(module).items()
                 if n.startswith("test_") and callable(f) and select in n]
        for name, fn in tests:
            result = run_test(path, name, fn)
            print(f"{result['status'].upper():8} {Path(path).name}::{name} "
                  f"({result['seconds']:.2f} s)")
            if result["status"] != "passed":
                print(result["detail"].rstrip())
            results.append(result)
    return json.dumps(results)
