"""Exact int8 GEMM through torch's integer kernel `torch._int_mm` (int8 x int8 -> int32).

torch is imported lazily, only when this backend is built, so `import pynode` works
where torch is absent (Pyodide). On x86 CPUs `_int_mm` runs oneDNN's VNNI/AMX int8
kernels; it is private API, so the backend exists only if the function does, and like
every backend it is trusted only after its exact gate.

Legend: B batch, M rows, K reduction length, N columns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pynode.core.gemm.base import BackendUnavailableError, GemmBackend


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

    def _matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        torch = self._torch
        c = torch._int_mm(_tensor(torch, a), _tensor(torch, b))  # (M, N) int32
        return c.numpy()
