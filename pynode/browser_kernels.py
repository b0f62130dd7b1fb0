"""The page's hot kernels in WebAssembly SIMD: the numpy reference's bits, on numpy's buffers.

`pynode/wasm/kernels.wat` holds the kernels (why each gives the reference's bits: at its
top); `kernels.wasm` beside it is their build, shipped in the pynode bundle and linked into
Pyodide's own memory as the GEMM kernel is (`browser_gemm.link_side_module`), so a kernel
is one JS call on the addresses of numpy arrays, with no copies. `WasmKernels` overrides
every hot kernel of `Kernels` (pynode/core/kernels.py), as `NumbaKernels` does natively;
what a kernel does not handle (other dtypes, empty or 0-d arrays) and any input with a NaN
or an Inf go to the reference, so refusals and special values are the reference's own.
Stochastic rounding reads the same 16-bit lanes of `rng.raw64` as the reference (drawn by
the wasm Philox, `browser_philox.raw64_wasm`, which equals it word for word). The per-call
product check (`product_holds`, every GEMM product in the page) reads operands stored
row-major or transposed in place and copies only other strides. The page computes with
these kernels only after `gate_kernels` passed (`select_kernels`).

Legend: B batch, R rows, C columns, n elements of a row; f32 float32, f64 float64.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pynode.browser_gemm import address, link_side_module
from pynode.browser_philox import raw64_wasm
from pynode.core import detmath
from pynode.core.gemm import BackendUnavailableError
from pynode.core.kernels import REFERENCE, KernelGateReport, Kernels, gate_kernels

__all__ = ["WasmKernels", "load_kernels", "select_kernels"]

log = logging.getLogger(__name__)

KERNELS_PATH = Path(__file__).resolve().parent / "wasm" / "kernels.wasm"
EXPORTS = ("quantize_rows", "quantize_cols", "epilogue", "gelu", "softmax",
           "psum_rows_f32", "psum_rows_f64", "product_holds")
_INT8, _INT32, _FLOAT64 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.float64)


@functools.lru_cache(maxsize=1)
def load_kernels() -> dict[str, Callable[..., Any]]:
    """The kernels' exported functions by name, linked into Pyodide's memory once per
    process; BackendUnavailableError where they cannot run (natively, no wasm SIMD)."""
    exports = link_side_module(KERNELS_PATH, "daisychain_kernels.so")
    return {name: getattr(exports, f"daisychain_{name}") for name in EXPORTS}


def _stored(x: np.ndarray) -> tuple[np.ndarray, int]:
    """(x or a row-major copy, 1 if x is its last two axes' transpose stored row-major)."""
    if x.flags.c_contiguous:
        return x, 0
    if x.swapaxes(-1, -2).flags.c_contiguous:
        return x, 1
    return np.ascontiguousarray(x), 0


def _f32(x: Any, min_ndim: int) -> bool:
    return (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim >= min_ndim
            and x.size > 0)


class WasmKernels(Kernels):
    """The reference's kernels in wasm SIMD; anything unusual goes to the reference."""

    name = "wasm"

    def __init__(self) -> None:
        self._fn = load_kernels()
        # the product check's scratch, kept between calls (each call writes what it reads)
        self._scratch = np.empty(0, np.float64)
        self._scratch_at = address(self._scratch)

    def quantize(self, x, axis, key):
        if not (_f32(x, 2) and axis in (-1, -2)):
            return super().quantize(x, axis, key)
        if key is None and not x.flags.c_contiguous and x.swapaxes(-1, -2).flags.c_contiguous:
            # A transposed view (x.T, k.transpose(0, 2, 1)): its rows are the columns of the
            # contiguous xt, so the other axis's kernel takes the same elements, the same
            # max and the same divisions (rounding to nearest draws no lanes, so element
            # order does not matter); only the int8 result is transposed, a quarter of the
            # bytes of copying x.
            done = self._quantize(x.swapaxes(-1, -2), -2 if axis == -1 else -1, None)
            if done is not None:
                qt, scale = done  # (..., C, R) i8
                return np.ascontiguousarray(qt.swapaxes(-1, -2)), scale  # (..., R, C) i8
        else:
            done = self._quantize(np.ascontiguousarray(x), axis, key)
        if done is None:
            return super().quantize(x, axis, key)  # raises the reference's NonFiniteError
        return done

    def _quantize(self, xc, axis, key):
        """(q, scale) of a contiguous xc (..., R, C) f32 by the kernels; None where it
        holds a NaN or an Inf."""
        rows, cols = xc.shape[-2:]
        q = np.empty(xc.shape, np.int8)
        # Lane i of the stream rounds element i in C order, as in the reference.
        words = None if key is None else raw64_wasm(key, (xc.size + 3) // 4)  # (n/4,) u64
        lanes = 0 if words is None else address(words)
        if axis == -1:
            scale = np.empty(xc.shape[:-1], np.float32)  # (..., R) f32
            ok = self._fn["quantize_rows"](address(xc), address(q), address(scale), lanes,
                                           xc.size // cols, cols)
        else:
            scale = np.empty(xc.shape[:-2] + (cols,), np.float32)  # (..., C) f32
            ok = self._fn["quantize_cols"](address(xc), address(q), address(scale), lanes,
                                           xc.size // (rows * cols), rows, cols)
        return (q, scale) if ok else None

    def epilogue(self, acc, sa, sb):
        ok = (isinstance(acc, np.ndarray) and acc.dtype == np.int32 and acc.ndim >= 2
              and acc.size > 0 and _f32(sa, 1) and _f32(sb, 1)
              and sa.shape == acc.shape[:-1] and sb.shape == acc.shape[:-2] + acc.shape[-1:])
        if not ok:
            return super().epilogue(acc, sa, sb)  # the reference's refusals
        rows, cols = acc.shape[-2:]
        a, ra, rb = (np.ascontiguousarray(v) for v in (acc, sa, sb))
        out = np.empty(acc.shape, np.float32)  # (..., R, C) f32
        if not self._fn["epilogue"](address(a), address(ra), address(rb), address(out),
                                    acc.size // (rows * cols), rows, cols):
            return super().epilogue(acc, sa, sb)  # a non-finite scale, or a NaN result
        return out

    def gelu_with_grad(self, x):
        if not _f32(x, 1):
            return super().gelu_with_grad(x)
        flat = np.ascontiguousarray(x).reshape(-1)  # (n,) f32
        y, dy = np.empty_like(flat), np.empty_like(flat)
        if not self._fn["gelu"](address(flat), address(y), address(dy), flat.size):
            return super().gelu_with_grad(x)  # the reference handles +-inf and NaN
        return y.reshape(x.shape), dy.reshape(x.shape)

    def softmax_rows(self, x, mask=None):
        if not _f32(x, 1):
            return super().softmax_rows(x, mask)
        n = x.shape[-1]
        flags, period = None, 1
        if mask is not None:
            if not (isinstance(mask, np.ndarray) and mask.dtype == np.bool_):
                return super().softmax_rows(x, mask)
            if mask.ndim == 2 and mask.shape == x.shape[-2:]:  # the causal mask: row r % T
                flags, period = np.ascontiguousarray(mask), mask.shape[0]
            else:
                try:
                    flags = np.ascontiguousarray(np.broadcast_to(mask, x.shape)).reshape(-1, n)
                except ValueError:
                    return super().softmax_rows(x, mask)
                period = flags.shape[0]
        out, _, _ = self._softmax(x, flags, period, parts=False)
        return super().softmax_rows(x, mask) if out is None else out

    def log_softmax_parts(self, x):
        if not (_f32(x, 2) and x.ndim == 2):
            return super().log_softmax_parts(x)
        probs, totals, tops = self._softmax(x, None, 1, parts=True)
        if probs is None:
            return super().log_softmax_parts(x)
        lse = detmath.log(totals) + tops  # (R,) f64, as the reference sums them
        return probs, lse.astype(np.float32)

    def _softmax(self, x, flags, period, parts):
        """(out, totals, tops) of the wasm softmax, or Nones where the reference must run."""
        n = x.shape[-1]
        rows = np.ascontiguousarray(x).reshape(-1, n)  # (R, n) f32
        r = rows.shape[0]
        out = np.empty(rows.shape, np.float32)
        scratch = np.empty(2 * n, np.float64)  # e and the psum tree of one row
        totals = np.empty(r, np.float64) if parts else None
        tops = np.empty(r, np.float32) if parts else None
        ok = self._fn["softmax"](
            address(rows), 0 if flags is None else address(flags), period, address(out),
            0 if totals is None else address(totals), 0 if tops is None else address(tops),
            address(scratch), r, n)
        if not ok:
            return None, None, None  # a NaN or an Inf, or a row with every entry masked
        return out.reshape(x.shape), totals, tops

    def psum_rows(self, x):
        if not (isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float64)
                and x.ndim >= 1 and x.size > 0):
            return super().psum_rows(x)
        n = x.shape[-1]
        rows = np.ascontiguousarray(x).reshape(-1, n)  # (R, n)
        out = np.empty(rows.shape[0], x.dtype)
        scratch = np.empty(n, x.dtype)
        kernel = self._fn["psum_rows_f32" if x.dtype == np.float32 else "psum_rows_f64"]
        kernel(address(rows), address(out), address(scratch), rows.shape[0], n)
        return out.reshape(x.shape[:-1])

    def product_holds(self, a, b, out, r):
        # called for every GEMM product: identity tests of the dtypes, no more
        if not (type(a) is type(b) is type(out) is type(r) is np.ndarray
                and a.dtype is _INT8 and b.dtype is _INT8 and out.dtype is _INT32
                and r.dtype is _FLOAT64 and r.ndim == 2 and 2 <= a.ndim == b.ndim == out.ndim <= 3):
            return super().product_holds(a, b, out, r)
        m, k = a.shape[-2:]
        n = b.shape[-1]
        if (b.shape[:-2] != a.shape[:-2] or out.shape[:-2] != a.shape[:-2]
                or b.shape[-2] != k or out.shape[-2:] != (m, n) or r.shape[1] != n
                or out.size == 0 or a.size == 0 or b.size == 0 or r.size == 0):
            return super().product_holds(a, b, out, r)  # the reference's errors and edges
        (av, a_t), (bv, b_t), (ov, out_t) = _stored(a), _stored(b), _stored(out)
        rc = r if r.flags.c_contiguous else np.ascontiguousarray(r)  # (V, N) f64
        if self._scratch.size < k + 2 * m:  # b @ r_q, a @ (b @ r_q), out @ r_q: f64
            self._scratch = np.empty(k + 2 * m, np.float64)
            self._scratch_at = address(self._scratch)
        # |out| <= 2**31 always, so a bound past it is the same test as 2**31
        bound = min((1 << 14) * k, 1 << 31)
        return bool(self._fn["product_holds"](
            address(av), a_t, address(bv), b_t, address(ov), out_t, address(rc), r.shape[0],
            self._scratch_at, a.size // (m * k), m, k, n, bound))


def select_kernels(prefer: str | None = None) -> tuple[Kernels, KernelGateReport | None]:
    """The page's fastest kernels that pass their gate: wasm where it links, else the numpy
    reference. prefer="numpy" forces the reference. Returns (kernels, wasm's report)."""
    if prefer == "numpy":
        return REFERENCE, None
    try:
        candidate = WasmKernels()
    except BackendUnavailableError as exc:
        log.info("wasm kernels unavailable (%s); using the numpy reference", exc)
        return REFERENCE, None
    report = gate_kernels(candidate)
    if not report.passed:
        log.warning("wasm kernels failed their gate at %s; using the numpy reference",
                    report.failing_case)
        return REFERENCE, report
    return candidate, report
