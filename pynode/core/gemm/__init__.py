"""Exact int8 x int8 -> int32 GEMM backends, their exact gate and the live audit.

base.py          GemmBackend contract and the shared operand checks (int8, shapes, K bound)
reference.py     LUT reference: every product from the verified multiply table (the oracle)
numpy_int.py     int32 einsum, no BLAS needed
blas_exact.py    float32 sgemm on integer values, K chunked at 1024 (fast native path)
gate.py          discriminating cases, bit-level comparison, GateReport
audit.py         sampled re-check of live results (structural + seeded cells)
select.py        select_gemm: gate best first, demote failures, wrap in Gemm

Backends that need more than numpy (torch, the page's WebAssembly SIMD) are built outside
the core (pynode/gemm_backends.py) and handed to select_gemm as instances or a `build`.
"""

from pynode.core.gemm.audit import GemmAudit
from pynode.core.gemm.base import (
    MAX_K,
    BackendUnavailableError,
    GemmBackend,
    UnknownBackendError,
)
from pynode.core.gemm.gate import ExactGate, GateReport
from pynode.core.gemm.select import (
    BACKEND_ORDER,
    NO_BLAS_ORDER,
    Gemm,
    make_backend,
    select_gemm,
)

__all__ = [
    "BACKEND_ORDER",
    "MAX_K",
    "NO_BLAS_ORDER",
    "BackendUnavailableError",
    "ExactGate",
    "GateReport",
    "Gemm",
    "GemmAudit",
    "GemmBackend",
    "UnknownBackendError",
    "make_backend",
    "select_gemm",
]
