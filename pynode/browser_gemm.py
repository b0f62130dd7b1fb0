"""The page's fast exact GEMM: WebAssembly SIMD run on numpy's own buffers (Pyodide only).

`pynode/wasm/gemm_i8.wat` is the kernel (layout and exactness argument at its top);
`gemm_i8.wasm` beside it is its build, shipped in the pynode bundle. The module imports
Pyodide's linear memory, so `WasmSimdBackend` hands it the addresses of the numpy operands
and of a fresh int32 output array: one JS call per matmul (or per whole bmm), no copies
between Python and the kernel. Pyodide links it as an Emscripten side module
(`_module.loadWebAssemblyModule`, the loader of its own shared libraries, in
`link_side_module`, which pynode/browser_kernels.py uses too), the one way it offers to share
its memory; a runtime without that loader, or a browser without wasm SIMD,
makes the backend unavailable and the page falls back to `numpy_int`.

Like every backend it is trusted only after the exact gate (pynode/core/gemm/gate.py) and
the live audit, and it lives outside pynode/core because it needs the JS runtime.

Legend: B batch, M rows, K reduction length, N columns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pynode.core.gemm import NO_BLAS_ORDER, BackendUnavailableError, GemmBackend

WASM_PATH = Path(__file__).resolve().parent / "wasm" / "gemm_i8.wasm"
EXPORT = "daisychain_gemm_i8"
WASM_SIMD = "wasm_simd"
# Best first in the page: the SIMD kernel, then what a BLAS-less numpy offers.
PAGE_ORDER = (WASM_SIMD, *NO_BLAS_ORDER)


def address(x: np.ndarray) -> int:
    """Where x's data starts in linear memory (under Pyodide: the wasm address)."""
    return x.__array_interface__["data"][0]


def link_side_module(path: Path, so_name: str) -> Any:
    """Link the wasm module at `path` into Pyodide's memory; returns its exports (JS object).

    BackendUnavailableError when not under Pyodide, when this Pyodide cannot link a side
    module, or when the browser cannot compile the module (no wasm SIMD)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BackendUnavailableError(f"kernel {path.name} missing from the bundle") from exc
    return link_wasm_bytes(data, path.name, so_name)


def link_wasm_bytes(data: bytes, name: str, so_name: str) -> Any:
    """`link_side_module` for a module given as bytes (`name` for messages)."""
    from pynode.platform import IN_PYODIDE

    if not IN_PYODIDE:
        raise BackendUnavailableError(f"{name} runs only under Pyodide (the page)")
    import js  # only in the page
    import pyodide_js
    from pyodide.ffi import to_js

    loader = getattr(pyodide_js._module, "loadWebAssemblyModule", None)
    if loader is None:
        raise BackendUnavailableError("this Pyodide has no side-module loader to share memory")
    try:
        module = js.WebAssembly.Module.new(to_js(memoryview(data)))
        flags = js.Object.fromEntries(to_js({"loadAsync": False, "nodelete": True}))
        return loader(module, flags, so_name, js.Object.new())
    except Exception as exc:  # a JsException: CompileError (no SIMD), LinkError, ...
        raise BackendUnavailableError(f"cannot load {name}: {exc}") from exc


@functools.lru_cache(maxsize=1)
def load_kernel() -> Callable[..., Any]:
    """The GEMM kernel's exported function, linked into Pyodide's memory once per process."""
    return getattr(link_side_module(WASM_PATH, "daisychain_gemm_i8.so"), EXPORT)


class WasmSimdBackend(GemmBackend):
    """Exact int8 GEMM in WebAssembly SIMD (i32x4.dot_i16x8_s), in place on numpy buffers."""

    name = WASM_SIMD

    def __init__(self) -> None:
        self._kernel = load_kernel()
        self._scratch = np.empty(0, np.uint8)  # packed B and A, grown on demand, reused
        self._scratch_at = address(self._scratch)

    def _run(self, a: np.ndarray, b: np.ndarray, bs: int, m: int, k: int, n: int) -> np.ndarray:
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)  # views stay views if they can
        out = np.empty((bs, m, n), np.int32)  # (B, M, N) int32, every cell written
        need = ((n + 7) // 8) * ((k + 1) // 2) * 32 + m * ((k + 1) // 2) * 4  # B, A packed
        if self._scratch.size < need:
            self._scratch = np.empty(need, np.uint8)
            self._scratch_at = address(self._scratch)
        self._kernel(address(a), address(b), address(out), self._scratch_at, bs, m, k, n)
        return out

    def _matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        (m, k), n = a.shape, b.shape[1]
        return self._run(a, b, 1, m, k, n).reshape(m, n)  # (M, N) int32

    def _bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        (bs, m, k), n = a.shape, b.shape[2]
        return self._run(a, b, bs, m, k, n)  # (B, M, N) int32
