"""Kernel probe: a fixed seeded int8 GEMM through the live backend, hashed.

Weight hashes only show that replicas agree on the state; the probe shows that each
peer's arithmetic is still right, so a device that breaks after its start-up gate is
caught at the next step even while the weights still agree.
"""

from __future__ import annotations

import hashlib

import numpy as np

from pynode.core import rng

PROBE_PURPOSE = 0x9_0BE
# Odd sizes so tail rows/columns and a K that is not a multiple of any block are exercised.
PROBE_SHAPE = (37, 131, 29)


def probe_operands() -> tuple[np.ndarray, np.ndarray]:
    """The probe's fixed operands: (M, K) and (K, N) int8 covering -128..127."""
    m, k, n = PROBE_SHAPE
    a = (rng.randint((PROBE_PURPOSE, 0), (m, k), 256) - 128).astype(np.int8)  # (M, K) int8
    b = (rng.randint((PROBE_PURPOSE, 1), (k, n), 256) - 128).astype(np.int8)  # (K, N) int8
    a[-1, :] = -128
    b[:, -1] = -128
    return a, b


def probe_hash(gemm, operands: tuple[np.ndarray, np.ndarray] | None = None) -> str:
    """sha256 (hex, 16 chars) of the probe GEMM through `gemm`, then of its int16-clipped
    result through the live requantize and ReLU units, so every unit is exercised.

    operands: probe_operands(), kept by a caller that probes every step (drawing them
    takes ~0.9 ms natively, the rest of the probe ~0.1 ms); the GEMM gets copies."""
    if gemm is None:
        return "none"
    a, b = (x.copy() for x in operands) if operands is not None else probe_operands()
    out = np.ascontiguousarray(gemm.matmul(a, b), dtype="<i4")  # (M, N) int32
    digest = hashlib.sha256(out.tobytes())
    units = getattr(gemm, "units", None)
    if units is not None:
        wide = np.clip(out, -32768, 32767).astype(np.int16)  # (M, N) int16
        narrow = units.requant_array(wide)  # (M, N) int8
        digest.update(narrow.tobytes())
        digest.update(units.relu_array(narrow).tobytes())
    return digest.hexdigest()[:16]
