"""Every GEMM backend a peer can build by name, and the order each runtime gates them in.

The core's backends (pynode.core.gemm: blas_float, numpy_int, reference) need numpy alone.
Two more live outside the core because they need more than numpy: `torch` (torch's integer
kernel `torch._int_mm`, natively) and `wasm_simd` (the page's WebAssembly kernel,
pynode.browser_gemm). Like every backend, each is trusted only after its exact gate.

Legend: B batch, M rows, K reduction length, N columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pynode.core.gemm import BackendUnavailableError, GemmBackend, make_backend

# Best first, natively. blas_float is the fast path; torch costs a heavy import (and runs
# at 0.02x float32 without VNNI); numpy_int needs no BLAS; the reference is the oracle.
NATIVE_ORDER = ("blas_float", "torch", "numpy_int", "reference")


def build_backend(name: str, mul_lut: np.ndarray) -> GemmBackend:
    """The backend called `name`; BackendUnavailableError if it cannot run here,
    UnknownBackendError if there is no such backend."""
    if name == TorchBackend.name:
        return TorchBackend()
    from pynode.browser_gemm import WASM_SIMD, WasmSimdBackend

    if name == WASM_SIMD:
        return WasmSimdBackend()
    return make_backend(name, mul_lut)


def available_backends(
    names: Sequence[str], mul_lut: np.ndarray
) -> tuple[list[GemmBackend], list[tuple[str, str]]]:
    """The backends of `names` that can run here, in order, and (name, why not) for the rest."""
    backends, skipped = [], []
    for name in names:
        try:
            backends.append(build_backend(name, mul_lut))
        except BackendUnavailableError as exc:
            skipped.append((name, str(exc)))
    return backends, skipped


def backend_order() -> tuple[str, ...]:
    """GEMM backends to gate here, best first: the page puts its wasm SIMD kernel first."""
    from pynode.browser_gemm import PAGE_ORDER
    from pynode.platform import IN_PYODIDE

    return PAGE_ORDER if IN_PYODIDE else NATIVE_ORDER


# ----------------------------------------------------------------------------- torch
# torch is imported lazily, only when this backend is built, so `import pynode` works where
# torch is absent (Pyodide). On x86 CPUs `_int_mm` runs oneDNN's VNNI/AMX int8 kernels; it
# is private API, so the backend exists only if the function does.


def import_torch() -> Any:
    """Return the torch module, or raise BackendUnavailableError saying why it is unusable."""
    try:
        import torch
    except Exception as exc:  # a broken install raises more than ImportError
        raise BackendUnavailableError(f"torch backend unavailable: {exc!r}") from exc
    if not hasattr(torch, "_int_mm"):
        raise BackendUnavailableError(
            f"torch backend unavailable: torch {torch.__version__} has no _int_mm"
        )
    return torch


def _tensor(torch: Any, x: np.ndarray) -> Any:
    # torch.from_numpy refuses negative strides; a contiguous copy costs one int8 pass.
    if any(s < 0 for s in x.strides):
        x = np.ascontiguousarray(x)
    return torch.from_numpy(x)


class TorchBackend(GemmBackend):
    """torch._int_mm per matrix; a batch is a loop over its matrices."""

    name = "torch"

    def __init__(self) -> None:
        self._torch = import_torch()
        # One intra-op thread. torch's OpenMP pool spins after each op; beside numpy's
        # OpenBLAS pool on the same cores the two starved each other: the default config
        # stepped 0.16-0.25 s with both pools, 0.059 s like this, width 256 0.75 s vs 0.20 s
        # (2-core AMD EPYC with VNNI, `bench train`). The GEMM tuner still measures every
        # backend per shape and routes each to the fastest (pynode/gemm_tuning.py).
        self._torch.set_num_threads(1)

    def _matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        torch = self._torch
        c = torch._int_mm(_tensor(torch, a), _tensor(torch, b))  # (M, N) int32
        return c.numpy()
