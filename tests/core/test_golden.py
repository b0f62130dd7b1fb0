"""Golden vectors: every runtime must reproduce tests/golden/golden_v2.npz bit for bit.

The same module runs under pytest natively and unchanged inside Pyodide
(tests/pyodide/run_tests.mjs), so it uses plain functions, plain asserts and no pytest import;
a skip is `unittest.SkipTest`. The file is written by tests/golden/make_golden.py, which
evaluates the cases with `run_case` below, so a case means the same thing to both.

File format: an npz whose entry `header` is b"DCGOLD" + uint32 LE version, whose entry
`index` is UTF-8 JSON listing the cases, and whose other entries are the cases' arrays.
A case is a call (`module:function` or `units:<lut>` on the default units, or a `gemm:`
method run on every backend) with arguments that are literals, tuples or npz arrays, and
either expected output arrays or the name of the error it must raise.
"""

import functools
import importlib
import json
import os
import struct
import subprocess
import sys
import unittest
from pathlib import Path

import numpy as np

GOLDEN_PATH = Path(__file__).resolve().parent.parent / "golden" / "golden_v2.npz"
MAGIC = b"DCGOLD"
VERSION = 2
FAMILIES = ("numpy", "units", "detmath", "rng", "fastmath", "quant", "gemm")


def load_golden(path: Path | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """(index, arrays) of a golden file (default GOLDEN_PATH), after checking magic and version."""
    path = GOLDEN_PATH if path is None else path
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    header = arrays.pop("header").tobytes()
    assert header[: len(MAGIC)] == MAGIC, f"{path.name}: bad magic {header[:6]!r}"
    (version,) = struct.unpack("<I", header[len(MAGIC) :])
    assert version == VERSION, f"{path.name}: version {version}, this test reads {VERSION}"
    index = json.loads(arrays.pop("index").tobytes().decode("utf-8"))
    return index, arrays


def decode_arg(arg, arrays: dict[str, np.ndarray]):
    if isinstance(arg, dict) and "npz" in arg:
        return arrays[arg["npz"]].copy()  # a function that wrote into it cannot spoil the next
    if isinstance(arg, dict) and "tuple" in arg:
        return tuple(arg["tuple"])
    return arg


def resolve(call: str, context: dict):
    """The callable a case names. `units:` and `gemm:` calls need objects built once per run."""
    prefix, _, attr = call.partition(":")
    if prefix == "units":
        lut = getattr(context["units"](), attr)
        return lambda *index: lut[index]
    if prefix == "gemm":
        return getattr(context["gemm"], attr)
    return getattr(importlib.import_module(prefix), attr)


def run_case(case: dict, arrays: dict[str, np.ndarray], context: dict):
    """Outputs of a case as a list of arrays, or the name of the exception it raised."""
    fn = resolve(case["call"], context)
    args = [decode_arg(a, arrays) for a in case.get("args", [])]
    kwargs = {k: decode_arg(v, arrays) for k, v in case.get("kwargs", {}).items()}
    try:
        with np.errstate(all="ignore"):  # overflow to inf is part of what the cases check
            out = fn(*args, **kwargs)
    except Exception as exc:  # the golden file records refusals by class name
        return type(exc).__name__
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bits of an array, so -0.0 differs from 0.0 and NaN payloads count."""
    a = np.array(a, order="C")  # a copy that keeps 0-d shapes
    if a.dtype == np.bool_:
        return a.view(np.uint8)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.kind in "iuf" else a


def same_bits(got: np.ndarray, want: np.ndarray) -> str:
    """'' when identical in dtype, shape and bits, else a short description of the difference."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
    differ = bits(got) != bits(want)
    if not differ.any():
        return ""
    where = tuple(int(i[0]) for i in np.nonzero(differ))
    return f"{int(differ.sum())} cells differ, first at {where}: {got[where]!r} vs {want[where]!r}"


def check_case(case: dict, arrays: dict[str, np.ndarray], context: dict) -> str:
    got = run_case(case, arrays, context)
    if "raises" in case:
        return "" if got == case["raises"] else f"expected {case['raises']}, got {got!r}"
    if isinstance(got, str):
        return f"raised {got}"
    if len(got) != len(case["outputs"]):
        return f"{len(got)} outputs, want {len(case['outputs'])}"
    problems = [same_bits(g, arrays[name]) for g, name in zip(got, case["outputs"], strict=True)]
    return "; ".join(p for p in problems if p)


@functools.cache
def default_units():
    from pynode.unitfiles import load_default_units

    return load_default_units()


def gemm_backends(units) -> list[tuple[str, object]]:
    """(label, gemm) for every backend that can run here, raw, plus the one select_gemm picks."""
    from pynode.core.gemm import BackendUnavailableError, select_gemm
    from pynode.gemm_backends import NATIVE_ORDER, build_backend

    backends = []
    for name in NATIVE_ORDER:
        try:
            backends.append((name, build_backend(name, units.mul_lut)))
        except BackendUnavailableError:
            continue
    selected = select_gemm(units)
    return backends + [(f"selected {selected.backend_name}", selected)]


def check_family(family: str) -> None:
    index, arrays = load_golden()
    cases = [c for c in index["cases"] if c["family"] == family]
    assert cases, f"{GOLDEN_PATH.name} has no {family} cases; regenerate (tests/golden/README.md)"
    contexts = [("", {"units": default_units})]
    if family == "gemm":
        contexts = [
            (f"[{label}] ", {"units": default_units, "gemm": gemm})
            for label, gemm in gemm_backends(default_units())
        ]
    failures = []
    for label, context in contexts:
        for case in cases:
            problem = check_case(case, arrays, context)
            if problem:
                failures.append(f"{label}{case['name']}: {problem}")
    assert not failures, f"{len(failures)} {family} golden cases differ:\n" + "\n".join(failures)


def test_golden_header_and_index():
    index, arrays = load_golden()
    assert sorted(index["families"]) == sorted(FAMILIES), index["families"]
    names = [c["name"] for c in index["cases"]]
    assert len(names) == len(set(names)), "duplicate case names"
    for case in index["cases"]:
        for ref in case.get("outputs", []):
            assert ref in arrays, f"{case['name']}: missing array {ref}"


def test_numpy_basics_golden():
    check_family("numpy")


def test_units_golden():
    check_family("units")


def test_detmath_golden():
    check_family("detmath")


def test_rng_golden():
    check_family("rng")


def test_fastmath_golden():
    check_family("fastmath")


def test_quant_golden():
    check_family("quant")


def test_gemm_golden():
    check_family("gemm")


def test_golden_with_simd_disabled():
    """The whole module again in a fresh interpreter with numpy's SIMD dispatch switched off."""
    if sys.platform == "emscripten":
        raise unittest.SkipTest("needs a subprocess; runs natively only")
    from numpy._core import _multiarray_umath

    targets = " ".join(_multiarray_umath.__cpu_dispatch__)
    if not targets:
        raise unittest.SkipTest("this numpy build dispatches no SIMD targets")
    check = (
        "import sys, pytest\n"
        "from numpy._core import _multiarray_umath as m\n"
        "on = [t for t in m.__cpu_dispatch__ if m.__cpu_features__.get(t)]\n"
        "assert not on, f'NPY_DISABLE_CPU_FEATURES left {on} enabled'\n"
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', {str(Path(__file__))!r},"
        " '-k', 'not simd_disabled']))\n"
    )
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": targets}
    proc = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"with {targets} disabled:\n{proc.stdout}\n{proc.stderr}"
