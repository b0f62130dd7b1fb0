"""Native fused kernels (numba): the numpy reference's bits in one pass instead of many.

Each kernel performs, element by element, the same IEEE operations in the same order as
the numpy reference in pynode/core (quant.py, fastmath.py, detmath.psum), so it gives
the same bits; numba compiles without fast-math, so LLVM may neither fuse a multiply
and an add nor reorder a sum. `gate_kernels` checks this at every start before a peer
uses them. What a kernel does not accelerate, or any input with a NaN or an Inf, goes
to the reference, so refusals and special values are the reference's own.

Optional: `pip install numba` (the `fast` extra); without it peers use the reference.
Compiled code is cached on disk (numba's cache=True), so only the first start pays.

Legend: B batch, R rows, C columns; f32 float32, f64 float64, u16 random lanes.
"""

from __future__ import annotations

import logging

import numpy as np

from pynode import native_check, native_optim
from pynode.core import detmath, fastmath, rng
from pynode.core.errors import GateError
from pynode.core.fixedpoint import MAX_FRAC_BITS
from pynode.core.gemm import BackendUnavailableError, UnknownBackendError
from pynode.core.kernels import REFERENCE, KernelGateReport, Kernels, gate_kernels

__all__ = ["NumbaKernels", "available", "gate_kernels", "select_kernels"]

log = logging.getLogger(__name__)

try:
    import numba
except ImportError:  # the reference serves
    numba = None

if numba is not None:
    # error_model="numpy": IEEE division as the reference does it, without numba's
    # zero-division check, whose branch would keep every loop with a division scalar.
    jit = numba.njit(cache=True, nogil=True, error_model="numpy")
    inline = numba.njit(inline="always", error_model="numpy")  # merged into the caller

    _QMAX = np.float32(127.0)
    _NQMAX = np.float32(-127.0)
    _ONE = np.float32(1.0)
    _TINY = np.float32(np.finfo(np.float32).smallest_subnormal)
    _TWO_M16 = np.float32(2.0**-16)

    _ABS_BITS = np.int32(0x7FFFFFFF)
    _INF_BITS = np.int32(0x7F800000)

    @inline
    def _scale_of(amax):
        """quant._scales of one finite absmax."""
        s = amax / _QMAX
        if amax == 0:
            return _ONE
        if s == 0:
            return _TINY
        return s

    @inline
    def _fill_row(x, lanes, stochastic, b, i, s, q):
        """q[b, i, :] = the reference's rounding of x[b, i, :] / s; separate loops per mode
        so each vectorises."""
        nc = x.shape[2]
        if stochastic:
            for j in range(nc):
                t = min(max(x[b, i, j] / s, _NQMAX), _QMAX)
                q[b, i, j] = np.int8(np.floor(t + np.float32(lanes[b, i, j]) * _TWO_M16))
        else:
            for j in range(nc):
                t = min(max(x[b, i, j] / s, _NQMAX), _QMAX)
                q[b, i, j] = np.int8(np.rint(t))

    @jit
    def _quantize_rows(x, bits, lanes, stochastic, q, scale):
        """x (B, R, C) f32 (bits: the same memory as int32) -> q (B, R, C) int8 and
        scale (B, R); False if x holds a NaN or an Inf. The absmax is an integer max over
        the bit patterns with the sign cleared: monotone in |x| for finite floats, and
        above every finite pattern for Inf and NaN, so one max also finds those."""
        nb, nr, nc = x.shape
        top = np.zeros((nb, nr), np.int32)
        for b in range(nb):
            for i in range(nr):
                m = np.int32(0)
                for j in range(nc):
                    m = max(m, bits[b, i, j] & _ABS_BITS)
                if m >= _INF_BITS:
                    return False
                top[b, i] = m
        amax = top.view(np.float32)
        for b in range(nb):
            for i in range(nr):
                s = _scale_of(amax[b, i])
                scale[b, i] = s
                _fill_row(x, lanes, stochastic, b, i, s, q)
        return True

    @jit
    def _quantize_cols(x, bits, lanes, stochastic, q, scale):
        """As _quantize_rows with one scale per column: scale (B, C)."""
        nb, nr, nc = x.shape
        top = np.zeros(nc, np.int32)
        amax = top.view(np.float32)
        for b in range(nb):
            top[:] = 0
            for i in range(nr):
                for j in range(nc):
                    top[j] = max(top[j], bits[b, i, j] & _ABS_BITS)
            for j in range(nc):
                if top[j] >= _INF_BITS:
                    return False
                scale[b, j] = _scale_of(amax[j])
            for i in range(nr):
                if stochastic:
                    for j in range(nc):
                        t = min(max(x[b, i, j] / scale[b, j], _NQMAX), _QMAX)
                        u = np.float32(lanes[b, i, j]) * _TWO_M16
                        q[b, i, j] = np.int8(np.floor(t + u))
                else:
                    for j in range(nc):
                        t = min(max(x[b, i, j] / scale[b, j], _NQMAX), _QMAX)
                        q[b, i, j] = np.int8(np.rint(t))
        return True

    @inline
    def _row_dots(q, w, dots):
        """The product check's dots (quantize_dots), q just written and still in cache:
        dots[b, i] = q[b, i] . w[b] in wrapping int64, w (1 or B, C) one vector for every
        batch or one each. Four rows a pass share each load of w (up to 1.5x faster on
        rows of 16 and 256, measured alone)."""
        nr, nc = q.shape[1], q.shape[2]
        for b in range(q.shape[0]):
            wr = w[b if w.shape[0] > 1 else 0]
            i = 0
            while i + 4 <= nr:
                q0, q1, q2, q3 = q[b, i], q[b, i + 1], q[b, i + 2], q[b, i + 3]
                t0 = t1 = t2 = t3 = np.int64(0)
                for j in range(nc):
                    wj = wr[j]
                    t0 += np.int64(q0[j]) * wj
                    t1 += np.int64(q1[j]) * wj
                    t2 += np.int64(q2[j]) * wj
                    t3 += np.int64(q3[j]) * wj
                dots[b, i], dots[b, i + 1], dots[b, i + 2], dots[b, i + 3] = t0, t1, t2, t3
                i += 4
            for tail in range(i, nr):
                qi = q[b, tail]
                t = np.int64(0)
                for j in range(nc):
                    t += np.int64(qi[j]) * wr[j]
                dots[b, tail] = t

    @inline
    def _column_dots(q, w, dots):
        """_row_dots down the columns, for a transposed view (its rows are the logical
        columns): dots[b, j] = sum_i q[b, i, j] w[b, i], four rows a pass summed into a
        buffer of this call's own, so each cell of the buffer is loaded and stored once
        per four rows (1.8-2.5x faster than one row a pass, measured alone)."""
        nr, nc = q.shape[1], q.shape[2]
        acc = np.empty(nc, np.int64)
        for b in range(q.shape[0]):
            wr = w[b if w.shape[0] > 1 else 0]
            acc[:] = 0
            i = 0
            while i + 4 <= nr:
                w0, w1, w2, w3 = wr[i], wr[i + 1], wr[i + 2], wr[i + 3]
                q0, q1, q2, q3 = q[b, i], q[b, i + 1], q[b, i + 2], q[b, i + 3]
                for j in range(nc):
                    acc[j] += (np.int64(q0[j]) * w0 + np.int64(q1[j]) * w1
                               + np.int64(q2[j]) * w2 + np.int64(q3[j]) * w3)
                i += 4
            for tail in range(i, nr):
                wi = wr[tail]
                qi = q[b, tail]
                for j in range(nc):
                    acc[j] += np.int64(qi[j]) * wi
            for j in range(nc):
                dots[b, j] = acc[j]

    @jit
    def _quantize_dots(x, bits, lanes, stochastic, q, scale, by_rows, w, dots, swap):
        """_quantize_rows or _quantize_cols, then the check's dots over q just written (one
        call: quantize_dots runs for both operands of every checked product). w (C,) or
        (1 or B, C), dots x's leading shape: 2-d callers pass them as they are, no views
        made in Python. 1: done; 0: x holds a NaN or an Inf; -1: w or dots do not fit."""
        w2 = w[None] if w.ndim == 1 else w
        d2 = dots[None] if dots.ndim == 1 else dots
        nb, nr, nc = q.shape
        length, rows = (nr, nc) if swap else (nc, nr)
        if (w2.shape[1] != length or (w2.shape[0] != 1 and w2.shape[0] != nb)
                or d2.shape[0] != nb or d2.shape[1] != rows):
            return -1
        if by_rows:
            if not _quantize_rows(x, bits, lanes, stochastic, q, scale):
                return 0
        elif not _quantize_cols(x, bits, lanes, stochastic, q, scale):
            return 0
        if swap:
            _column_dots(q, w2, d2)
        else:
            _row_dots(q, w2, d2)
        return 1

    @jit
    def _epilogue_checked(acc, sa, sb, out, r, lhs):
        """_epilogue, and in the same pass the check's C side: each row's acc . r
        (wrapping int64) against lhs. acc, out (R, C) or (B, R, C), sa, sb and lhs
        likewise 1-d or 2-d: as the caller has them, no views made in Python. 1: every
        row equal; 0: some row differs; -1: a scale is NaN or Inf (nothing written);
        -2: the shapes do not fit."""
        if acc.ndim == 2:
            return _epilogue_checked3(acc[None], sa[None], sb[None], out[None], r, lhs[None])
        return _epilogue_checked3(acc, sa, sb, out, r, lhs)

    @inline
    def _epilogue_checked3(acc, sa, sb, out, r, lhs):
        nb, nr, nc = acc.shape
        if (not _fits(acc, sa, sb, out) or r.shape[0] != nc or lhs.shape[0] != nb
                or lhs.shape[1] != nr):
            return -2
        if _bad_scales(sa, sb):
            return -1
        # r's entries as int32 where they all fit (the check's are 20-bit): acc . r is
        # then 32 x 32 -> 64-bit multiplies (vpmuldq), the C side 35-45 % cheaper alone
        r32 = np.empty(nc, np.int32)
        narrow = True
        for j in range(nc):
            narrow &= -(2**31) <= r[j] < 2**31
            r32[j] = np.int32(r[j])
        same = (_epilogue_rows(acc, sa, sb, out, r32, lhs) if narrow
                else _epilogue_rows(acc, sa, sb, out, r, lhs))
        return 1 if same else 0

    @inline
    def _epilogue_rows(acc, sa, sb, out, r, lhs):
        """The epilogue's pass, each row's acc . r (wrapping int64) against lhs."""
        same = True
        for b in range(acc.shape[0]):
            for i in range(acc.shape[1]):
                t = np.int64(0)
                for j in range(acc.shape[2]):
                    x = acc[b, i, j]
                    y = np.float32(x) * sa[b, i]
                    out[b, i, j] = y * sb[b, j]
                    t += np.int64(x) * np.int64(r[j])
                same &= t == lhs[b, i]
        return same

    @jit
    def _epilogue(acc, sa, sb, out):
        """out = (f32(acc) * sa) * sb, acc and out (R, C) or (B, R, C), sa and sb 1-d or
        2-d to match (as the caller has them: no views made in Python). 1: done; -1: a
        scale is NaN or Inf (nothing written); -2: the shapes do not fit."""
        if acc.ndim == 2:
            return _epilogue3(acc[None], sa[None], sb[None], out[None])
        return _epilogue3(acc, sa, sb, out)

    @inline
    def _epilogue3(acc, sa, sb, out):
        if not _fits(acc, sa, sb, out):
            return -2
        if _bad_scales(sa, sb):
            return -1
        for b in range(acc.shape[0]):
            for i in range(acc.shape[1]):
                for j in range(acc.shape[2]):
                    y = np.float32(acc[b, i, j]) * sa[b, i]
                    out[b, i, j] = y * sb[b, j]
        return 1

    @inline
    def _fits(acc, sa, sb, out):
        """Whether sa (B, R), sb (B, C) and out go with acc (B, R, C)."""
        nb, nr, nc = acc.shape
        return (sa.shape[0] == nb and sa.shape[1] == nr and sb.shape[0] == nb
                and sb.shape[1] == nc and out.shape == acc.shape)

    @inline
    def _bad_scales(sa, sb):
        """Whether a scale is NaN or Inf (then s * 0 is NaN)."""
        bad = np.float32(0)
        for b in range(sa.shape[0]):
            for i in range(sa.shape[1]):
                bad += sa[b, i] * np.float32(0)
            for j in range(sb.shape[1]):
                bad += sb[b, j] * np.float32(0)
        return bad != 0

    _BLOCK = 256  # elements per pass of a vectorised loop

    @inline
    def _exp_neg_block(y, r, kbits, out):
        """out[:n] = fastmath._exp_neg(y[:n]) for finite y <= 0, in branch-free loops that
        LLVM vectorises: 2**k is built from its exponent bits, as the reference does."""
        n = y.shape[0]
        for i in range(n):
            v = max(y[i], fastmath._EXP_FLOOR)
            k = np.rint(v * fastmath._INV_LN2)
            t = v - k * fastmath._LN2_HI
            r[i] = t - k * fastmath._LN2_LO
            kbits[i] = (np.int64(k) + 1023) << 52
        scale = kbits.view(np.float64)
        for i in range(n):
            out[i] = _exp_taylor(r[i]) * scale[i]

    # Horner with the coefficients unrolled: a loop over them would be the innermost loop,
    # and LLVM vectorises innermost loops only (here: the one over elements).
    _T = fastmath._EXP_TAYLOR
    _E = fastmath._ERFCX

    @inline
    def _exp_taylor(z):
        acc = z * _T[8]
        acc += _T[7]
        acc *= z
        acc += _T[6]
        acc *= z
        acc += _T[5]
        acc *= z
        acc += _T[4]
        acc *= z
        acc += _T[3]
        acc *= z
        acc += _T[2]
        acc *= z
        acc += _T[1]
        acc *= z
        acc += _T[0]
        return acc

    @inline
    def _erfcx_poly(t):
        acc = t * _E[10]
        acc += _E[9]
        acc *= t
        acc += _E[8]
        acc *= t
        acc += _E[7]
        acc *= t
        acc += _E[6]
        acc *= t
        acc += _E[5]
        acc *= t
        acc += _E[4]
        acc *= t
        acc += _E[3]
        acc *= t
        acc += _E[2]
        acc *= t
        acc += _E[1]
        acc *= t
        acc += _E[0]
        return acc

    @jit
    def _gelu(x, y, dy):
        """fastmath._gelu_chunk over finite x (n,) f32 -> y, dy (n,) f32."""
        n = x.shape[0]
        arg = np.empty(_BLOCK, np.float64)
        e = np.empty(_BLOCK, np.float64)
        r = np.empty(_BLOCK, np.float64)
        kbits = np.empty(_BLOCK, np.int64)
        for lo in range(0, n, _BLOCK):
            m = min(_BLOCK, n - lo)
            # Block slices indexed from 0: numba's negative-index check on x[lo + i]
            # would keep LLVM from vectorising the loops.
            xs, ys, dys, es = x[lo : lo + m], y[lo : lo + m], dy[lo : lo + m], e[:m]
            for i in range(m):
                v = np.float64(xs[i])
                arg[i] = (v * v) * -0.5
            _exp_neg_block(arg[:m], r[:m], kbits[:m], es)
            for i in range(m):
                v = np.float64(xs[i])
                t = (abs(v) * fastmath._SQRT1_2) * fastmath._ERFCX_P
                t += 1.0
                t = 1.0 / t
                t -= fastmath._ERFCX_T0
                tail = _erfcx_poly(t) * es[i]
                tail *= 0.5
                cdf = 1.0 - tail if v > 0.0 else tail
                d = es[i] * fastmath._INV_SQRT_2PI
                d *= v
                d += cdf
                ys[i] = np.float32(cdf * v)
                dys[i] = np.float32(d)

    @inline
    def _psum_inplace(buf, n):
        """detmath.psum's tree over buf[:n] (any float dtype); returns the sum."""
        while n > 1:
            half = (n + 1) // 2
            for i in range(n - half):
                buf[i] = buf[i] + buf[i + half]
            n = half
        return buf[0]

    @jit
    def _softmax(x, mask, use_mask, out, totals, tops):
        """fastmath._exp_shifted + e / total over finite rows x (R, C) f32; mask (R, C)
        bool. Writes out (R, C) f32, totals (R,) f64, tops (R,) f32."""
        nr, nc = x.shape
        z = np.empty(nc, np.float64)
        e = np.empty(nc, np.float64)
        r = np.empty(nc, np.float64)
        kbits = np.empty(nc, np.int64)
        buf = np.empty(nc, np.float64)
        for i in range(nr):
            top = np.float32(-np.inf)
            for j in range(nc):
                v = x[i, j]
                if (not use_mask or mask[i, j]) and v > top:
                    top = v
            for j in range(nc):
                z[j] = np.float64(x[i, j]) - np.float64(top)
                if use_mask and not mask[i, j]:
                    z[j] = 0.0
            _exp_neg_block(z, r, kbits, e)
            for j in range(nc):
                if use_mask and not mask[i, j]:
                    e[j] = 0.0
                buf[j] = e[j]
            total = _psum_inplace(buf, nc)
            for j in range(nc):
                out[i, j] = np.float32(e[j] / total)
            totals[i] = total
            tops[i] = top

    @jit
    def _psum_rows(x, out):
        nr, nc = x.shape
        buf = np.empty(nc, x.dtype)
        for i in range(nr):
            for j in range(nc):
                buf[j] = x[i, j]
            out[i] = _psum_inplace(buf, nc)
        return True


    # numpy's Philox4x64-10 (rng.raw64: counter [i, 0, c2, c3] for blocks i = 1, 2, ...),
    # TILE blocks at a time in four word columns, so the ten rounds vectorise across
    # blocks (numpy's C generator makes one block at a time). 64x64 -> 128-bit products
    # from 32-bit limbs as in rng._mulhi64; uint64 arithmetic wraps as Philox needs.
    _TILE = 256
    _PM0, _PM1 = (np.uint64(m) for m in rng._PHILOX64_M)
    _PW0, _PW1 = (np.uint64(w) for w in rng._PHILOX64_W)

    @numba.njit(inline="always", error_model="numpy")
    def _mulhi64(x, high, low):
        m32, s32 = np.uint64(0xFFFFFFFF), np.uint64(32)
        xh, xl = x >> s32, x & m32
        mid1 = xh * low + ((xl * low) >> s32)
        mid2 = xl * high + (mid1 & m32)
        return xh * high + (mid1 >> s32) + (mid2 >> s32)

    @jit
    def _philox_blocks(k0, k1, c2, c3, out):
        m32, s32 = np.uint64(0xFFFFFFFF), np.uint64(32)
        h0, l0 = _PM0 >> s32, _PM0 & m32
        h1, l1 = _PM1 >> s32, _PM1 & m32
        x0, x1 = np.empty(_TILE, np.uint64), np.empty(_TILE, np.uint64)
        x2, x3 = np.empty(_TILE, np.uint64), np.empty(_TILE, np.uint64)
        blocks = out.shape[0] // 4
        for start in range(0, blocks, _TILE):
            t = min(_TILE, blocks - start)
            for i in range(t):
                x0[i], x1[i], x2[i], x3[i] = np.uint64(start + i + 1), np.uint64(0), c2, c3
            ka, kb = k0, k1
            for _ in range(10):
                for i in range(t):
                    a0, a2 = x0[i], x2[i]
                    x0[i] = _mulhi64(a2, h1, l1) ^ x1[i] ^ ka
                    x2[i] = _mulhi64(a0, h0, l0) ^ x3[i] ^ kb
                    x1[i] = a2 * _PM1
                    x3[i] = a0 * _PM0
                ka, kb = ka + _PW0, kb + _PW1
            for i in range(t):
                j = 4 * (start + i)
                out[j], out[j + 1], out[j + 2], out[j + 3] = x0[i], x1[i], x2[i], x3[i]

_INT8, _INT32, _FLOAT64 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.float64)
_FLOAT32, _INT64 = np.dtype(np.float32), np.dtype(np.int64)
_NO_LANES = np.zeros((1, 1, 1), np.uint16)  # what the kernels get when rounding to nearest


# What the kernels take; anything else goes to the reference. Dtypes are tested by
# identity, shapes by the kernels themselves (these run for every product).
def _quantizable(x, axis) -> bool:
    return type(x) is np.ndarray and x.dtype is _FLOAT32 and 2 <= x.ndim <= 3 and axis in (-1, -2)


def _scalable(acc, sa, sb) -> bool:
    return (type(acc) is np.ndarray and acc.dtype is _INT32 and 2 <= acc.ndim <= 3
            and type(sa) is np.ndarray and sa.dtype is _FLOAT32 and sa.ndim == acc.ndim - 1
            and type(sb) is np.ndarray and sb.dtype is _FLOAT32 and sb.ndim == acc.ndim - 1)


class NumbaKernels(Kernels):
    """The reference's kernels fused by numba; anything unusual goes to the reference."""

    name = "numba"
    # the product check's A side in float64 where exact (native_check); select_kernels
    # times both forms at start and keeps the faster
    check_in_f64 = True

    fuses_check = True  # the check's dots ride in the quantize and epilogue passes

    def quantize(self, x, axis, key):
        if not _quantizable(x, axis):
            return super().quantize(x, axis, key)
        done = self._quantize(x, axis, key, None)
        if done is None:
            return super().quantize(x, axis, key)  # raises the reference's NonFiniteError
        return done[:2]

    def quantize_dots(self, x, axis, key, w):
        # w's shape is the kernel's to test (one call per operand of every checked product)
        if not (_quantizable(x, axis) and type(w) is np.ndarray and w.dtype is _INT64
                and 1 <= w.ndim < x.ndim):
            return super().quantize_dots(x, axis, key, w)
        done = self._quantize(x, axis, key, w)
        if done is None:
            return super().quantize_dots(x, axis, key, w)  # the reference's refusals
        return done

    def _quantize(self, x, axis, key, w):
        """(q, scale, dots or None), or None where x holds a NaN or an Inf."""
        xb = x if x.ndim == 3 else x[None]  # (B, R, C) f32, a view
        if key is None:
            lanes = _NO_LANES
        else:
            n = x.size
            words = self.raw64(key, (n + 3) // 4).astype("<u8", copy=False)
            lanes = words.view("<u2")[:n].reshape(xb.shape)  # (B, R, C) u16, C order
        # A transposed view (x.T, p.transpose(0, 2, 1)) walks memory down its rows: scale
        # its rows as the columns of the untransposed array instead (the same numbers).
        swap = xb.strides[-1] > xb.strides[-2] and xb.shape[-2] > 1
        if swap:
            xb, lanes = xb.swapaxes(-1, -2), (lanes if key is None else lanes.swapaxes(-1, -2))
        by_rows = (axis == -1) != swap
        q = np.empty(xb.shape, np.int8)
        scale = np.empty(xb.shape[:2] if by_rows else xb.shape[::2], np.float32)
        if w is None:
            dots = None
            kernel = _quantize_rows if by_rows else _quantize_cols
            if not kernel(xb, xb.view(np.int32), lanes, key is not None, q, scale):
                return None
        else:  # over x's last axis: the kernel's columns, or its rows where swapped
            dots = np.empty(x.shape[:-1], np.int64)
            if _quantize_dots(xb, xb.view(np.int32), lanes, key is not None, q, scale,
                              by_rows, w, dots, swap) != 1:
                return None
        if swap:
            q = q.swapaxes(-1, -2)
        return (q.reshape(x.shape), scale.reshape(x.shape[:-1] if axis == -1
                                                  else x.shape[:-2] + x.shape[-1:]), dots)

    def epilogue(self, acc, sa, sb):
        if _scalable(acc, sa, sb):
            out = np.empty(acc.shape, np.float32)
            if _epilogue(acc, sa, sb, out) == 1:
                return out
        return super().epilogue(acc, sa, sb)  # the reference's refusals

    def epilogue_checked(self, acc, sa, sb, r, lhs):
        if (_scalable(acc, sa, sb) and type(r) is np.ndarray and r.dtype is _INT64
                and r.ndim == 1 and type(lhs) is np.ndarray and lhs.dtype is _INT64
                and lhs.ndim == acc.ndim - 1):
            out = np.empty(acc.shape, np.float32)
            held = _epilogue_checked(acc, sa, sb, out, r, lhs)
            if held >= 0:
                return out, held == 1
        return super().epilogue_checked(acc, sa, sb, r, lhs)  # the reference's refusals

    def gelu_with_grad(self, x):
        if not (isinstance(x, np.ndarray) and x.dtype == np.float32):
            return super().gelu_with_grad(x)
        flat = np.ascontiguousarray(x).reshape(-1)
        y, dy = np.empty_like(flat), np.empty_like(flat)
        if not np.isfinite(flat).all():
            return super().gelu_with_grad(x)  # the reference handles +-inf and NaN
        _gelu(flat, y, dy)
        return y.reshape(x.shape), dy.reshape(x.shape)

    def softmax_rows(self, x, mask=None):
        if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim >= 1
                and x.shape[-1] > 0):
            return super().softmax_rows(x, mask)
        out, _, _ = self._softmax(x, mask)
        return super().softmax_rows(x, mask) if out is None else out

    def log_softmax_parts(self, x):
        if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 2
                and x.shape[-1] > 0):
            return super().log_softmax_parts(x)
        probs, totals, tops = self._softmax(x, None)
        if probs is None:
            return super().log_softmax_parts(x)
        lse = detmath.log(totals) + tops  # (R,) f64, as the reference sums them
        return probs, lse.astype(np.float32)

    def _softmax(self, x, mask):
        rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])  # (R, C) f32
        if mask is None:
            flags, use = np.ones((1, 1), bool), False
        else:
            flags, use = np.broadcast_to(mask, x.shape).reshape(-1, x.shape[-1]), True
        if not np.isfinite(rows).all():
            return None, None, None  # the reference handles +-inf and NaN
        out = np.empty(rows.shape, np.float32)
        totals, tops = np.empty(rows.shape[0], np.float64), np.empty(rows.shape[0], np.float32)
        _softmax(rows, flags, use, out, totals, tops)
        return out.reshape(x.shape), totals, tops

    def product_holds(self, a, b, out, r):
        # called for every GEMM product: identity tests of the dtypes, no more
        if not (type(a) is type(b) is type(out) is type(r) is np.ndarray
                and a.dtype is _INT8 and b.dtype is _INT8 and out.dtype is _INT32
                and r.dtype is _FLOAT64 and r.ndim == 2 and a.ndim == b.ndim == out.ndim
                and 2 <= a.ndim <= 3):
            return super().product_holds(a, b, out, r)
        holds = native_check.product_holds_2d if a.ndim == 2 else native_check.product_holds_3d
        held = holds(a, b, out, r, self.check_in_f64)
        if held < 0:
            return super().product_holds(a, b, out, r)
        return held == 1

    def raw64(self, key, n):
        k, c = rng.key_words64(key)
        if not 0 <= n < 2**62:
            return super().raw64(key, n)  # the reference's errors
        out = np.empty(-(-n // 4) * 4, np.uint64)
        _philox_blocks(np.uint64(k[0]), np.uint64(k[1]), np.uint64(c[2]), np.uint64(c[3]), out)
        return out[:n]

    def from_fixed(self, total, frac_bits, divisor):
        if not (type(total) is np.ndarray and total.dtype == np.int64 and total.ndim == 1
                and type(frac_bits) is int and 0 <= frac_bits <= MAX_FRAC_BITS
                and type(divisor) is int and divisor >= 1):
            return super().from_fixed(total, frac_bits, divisor)  # the reference's refusals
        out = np.empty(total.shape[0], np.float32)
        native_optim.from_fixed(total, 2.0**-frac_bits, float(divisor), out)
        return out

    def adamw(self, p, g, m, v, scalars, scale):
        flats = (p, g, m, v)
        if not (all(type(x) is np.ndarray and x.dtype == np.float32 and x.ndim == 1
                    and x.shape == p.shape for x in flats)
                and len(scalars) == 8 and all(type(x) is np.float32 for x in scalars)
                and (scale is None or type(scale) is np.float32)):
            return super().adamw(p, g, m, v, scalars, scale)
        out = (np.empty_like(p), np.empty_like(p), np.empty_like(p))
        clipped = scale is not None
        if not native_optim.adamw(*flats, *scalars, scale if clipped else np.float32(1.0),
                                  clipped, *out):
            return super().adamw(p, g, m, v, scalars, scale)
        return out

    def psum_rows(self, x):
        if not (isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float64)
                and x.ndim >= 1 and x.shape[-1] > 0 and np.isfinite(x).all()):
            return super().psum_rows(x)
        rows = x.reshape(-1, x.shape[-1])
        out = np.empty(rows.shape[0], x.dtype)
        _psum_rows(rows, out)
        return out.reshape(x.shape[:-1])


def available() -> bool:
    """True if numba imports here (native CPython with the `fast` extra)."""
    return numba is not None


def select_kernels(prefer: str | None = None) -> tuple[Kernels, KernelGateReport | None]:
    """The fastest kernels that pass their gate: numba where it imports, else the numpy
    reference. prefer="numpy" forces the reference; prefer="numba" forces numba (an error
    where it is missing or fails its gate). Returns (kernels, numba's report)."""
    if prefer not in (None, "numba", "numpy"):
        raise UnknownBackendError(f"unknown kernels {prefer!r}; valid: numba, numpy")
    if prefer == "numba" and numba is None:
        raise BackendUnavailableError("numba is not installed (pip install numba, the `fast` "
                                      "extra); without it use --kernels numpy")
    if prefer == "numpy" or numba is None:
        return REFERENCE, None
    report = gate_kernels(NumbaKernels())
    if not report.passed and prefer == "numba":
        raise GateError(f"forced numba kernels failed their exact gate at {report.failing_case}")
    if not report.passed:
        log.warning("numba kernels failed their gate at %s; using the numpy reference",
                    report.failing_case)
        return REFERENCE, report
    kernels = NumbaKernels()
    kernels.check_in_f64 = native_check.faster_a_side()
    return kernels, report

