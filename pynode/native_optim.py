"""Native kernels of the optimizer step (numba): fixed point to float32 and AdamW, each
one pass over the flat state instead of a dozen numpy passes a tensor.

They perform the reference's IEEE operations (fixedpoint.from_fixed,
optim.adamw_elementwise) element by element in the same order; numba compiles without
fast-math, so LLVM neither fuses a multiply and an add nor reorders anything, and
`gate_kernels` compares them with the reference at every start (NumbaKernels.from_fixed,
NumbaKernels.adamw use them). Where numba is missing the reference serves.
"""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:
    numba = None

if numba is not None:
    jit = numba.njit(cache=True, nogil=True, error_model="numpy")

    @jit
    def from_fixed(total, scale, divisor, out):
        """out[i] = float32((hi * 2**32 + lo) * scale / divisor), total (n,) int64 split
        into its signed upper and unsigned lower 32 bits (each exact in float64), `scale`
        the exact power of two 2**-frac_bits: fixedpoint.from_fixed's three roundings."""
        for i in range(total.shape[0]):
            x = total[i]
            whole = np.float64(x >> 32) * 4294967296.0 + np.float64(x & 0xFFFFFFFF)
            out[i] = np.float32((whole * scale) / divisor)

    @jit
    def adamw(p, g, m, v, b1, one_minus_b1, b2, one_minus_b2, step_size, sqrt_bias2, eps,
              decay, scale, clipped, new_p, new_m, new_v):
        """optim.adamw_elementwise on (n,) f32, the gradient first times `scale` where
        `clipped`. Returns False, with the outputs unspecified, where an input is not
        finite (the reference handles those)."""
        for i in range(p.shape[0]):
            gi = g[i]
            if clipped:
                gi = gi * scale
            mi = m[i] * b1
            mi = mi + gi * one_minus_b1
            vi = v[i] * b2
            gg = gi * gi
            gg = gg * one_minus_b2
            vi = vi + gg
            denom = np.sqrt(vi)
            denom = denom / sqrt_bias2
            denom = denom + eps
            update = mi / denom
            update = update * step_size
            pi = p[i] * decay
            new_p[i] = pi - update
            new_m[i] = mi
            new_v[i] = vi
        for i in range(p.shape[0]):
            if not (np.isfinite(p[i]) and np.isfinite(g[i]) and np.isfinite(m[i])
                    and np.isfinite(v[i])):
                return False
        return True
