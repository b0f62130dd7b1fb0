"""The kernel probe (core/probe.py): a fixed GEMM through the live backend, hashed."""

from __future__ import annotations

import numpy as np

from pynode.core.gemm.numpy_int import NumpyIntBackend
from pynode.core.probe import PROBE_SHAPE, probe_hash, probe_operands


class Scribbles(NumpyIntBackend):
    """Right products, but it writes into its operands afterwards (a dirty buffer)."""

    name = "scribbles"

    def matmul(self, a, b):
        out = super().matmul(a, b)
        a[...] = 1
        b[...] = 1
        return out


def test_kept_operands_hash_as_fresh_ones_step_after_step():
    kept = probe_operands()
    first = probe_hash(NumpyIntBackend())
    assert probe_hash(NumpyIntBackend(), kept) == first
    # a backend that scribbles on its inputs gets copies: the kept operands stay the
    # probe's, so the next step's hash is unchanged
    assert probe_hash(Scribbles(), kept) == first
    assert probe_hash(Scribbles(), kept) == first
    a, b = kept
    assert (a.shape, b.shape) == (PROBE_SHAPE[:2], PROBE_SHAPE[1:])
    assert all(np.array_equal(x, y) for x, y in zip(kept, probe_operands(), strict=True))


def test_a_wrong_product_changes_the_hash():
    class OffByOne(NumpyIntBackend):
        def matmul(self, a, b):
            out = super().matmul(a, b)
            out[5, 7] += 1
            return out

    kept = probe_operands()
    assert probe_hash(OffByOne(), kept) != probe_hash(NumpyIntBackend(), kept)
