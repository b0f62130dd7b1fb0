"""The step's hot non-GEMM kernels behind one small interface, and their exact gate.

`Kernels` is the numpy reference: quantize (quant.py), the GEMM epilogue, GELU with
its gradient and the softmaxes (fastmath.py), pinned row sums (detmath.py), the Freivalds
product check and the Philox draws behind stochastic rounding (rng.raw64). It runs
everywhere, Pyodide included. A faster implementation (pynode/native_kernels.py, numba)
subclasses it and overrides what it accelerates; before a peer uses one, `gate_kernels`
runs every kernel on discriminating inputs (ties, zero and subnormal rows, strided and
batched operands, tails of odd length) and demands the reference's bits, as the GEMM
gate does for backends. Refusals (NaN into a quantizer, bad shapes) stay the reference's.

Legend: R rows, C columns, ... leading batch dims; u16 random lanes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import detmath, fastmath, fixedpoint, optim, quant, rng
from .errors import ShapeError


class Kernels:
    """The numpy reference of every hot kernel; subclasses override with faster code."""

    name = "numpy"

    def quantize(self, x: np.ndarray, axis: int, key: tuple[int, ...] | None):
        """int8 with one scale per row (axis -1) or column (axis -2) of x (..., R, C) f32;
        round-to-nearest, or stochastic rounding drawn from `key`. -> (q, scale)."""
        if axis == -1:
            if key is None:
                return quant.quantize_rows(x)
            return quant.quantize_rows_stochastic(x, key)
        if key is None:
            return quant.quantize_cols(x)
        return quant.quantize_cols_stochastic(x, key)

    def epilogue(self, acc: np.ndarray, sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
        return quant.epilogue(acc, sa, sb)

    # Whether the product check's sums may ride in quantize_dots and epilogue_checked
    # (pynode/core/gemm/check.py, "fused"): where they are one pass with the work around
    # them (native_kernels), not here, where they would be extra numpy passes.
    fuses_check = False

    def quantize_dots(self, x: np.ndarray, axis: int, key: tuple[int, ...] | None,
                      w: np.ndarray):
        """quantize(x, axis, key) and each row's dot with w: dots[..., i] = sum_c
        q[..., i, c] * w[..., c], exact int64 (wrapping), for w int64 of x's last size
        (one vector, or one a batch matrix). -> (q, scale, dots)."""
        q, scale = self.quantize(x, axis, key)
        lead = x.shape[:-2]
        if not (isinstance(w, np.ndarray) and w.dtype == np.int64
                and w.shape in (x.shape[-1:], lead + x.shape[-1:])):
            raise ShapeError(f"quantize_dots: w must be int64 of shape {x.shape[-1:]} or "
                             f"{lead + x.shape[-1:]} for x {x.shape}, got {quant.describe(w)}")
        return q, scale, _row_dots(q, w)

    def epilogue_checked(self, acc: np.ndarray, sa: np.ndarray, sb: np.ndarray,
                         r: np.ndarray, lhs: np.ndarray) -> tuple[np.ndarray, bool]:
        """epilogue(acc, sa, sb), and whether acc @ r == lhs (each row's dot with r (N,)
        int64 against lhs (..., M) int64, wrapping): the per-call check's C side."""
        out = self.epilogue(acc, sa, sb)  # its refusals first
        for name, v, want in (("r", r, acc.shape[-1:]), ("lhs", lhs, acc.shape[:-1])):
            if not (isinstance(v, np.ndarray) and v.dtype == np.int64 and v.shape == want):
                raise ShapeError(f"epilogue_checked: {name} must be int64 of shape {want} for "
                                 f"acc {acc.shape}, got {quant.describe(v)}")
        return out, bool(np.array_equal(_row_dots(acc, r), lhs))

    def gelu_with_grad(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return fastmath.gelu_with_grad(x)

    def softmax_rows(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        return fastmath.softmax_rows(x, mask)

    def log_softmax_parts(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return fastmath.log_softmax_parts(x)

    def psum_rows(self, x: np.ndarray) -> np.ndarray:
        """detmath.psum over the last axis."""
        return detmath.psum(x, axis=-1)

    def raw64(self, key: tuple[int, ...], n: int) -> np.ndarray:
        """rng.raw64: the first n words of the key's Philox4x64 stream, (n,) uint64."""
        return rng.raw64(key, n)

    def product_holds(self, a: np.ndarray, b: np.ndarray, out: np.ndarray,
                      r: np.ndarray) -> bool:
        """Freivalds' identity for out == a @ b: every |out| <= 2**14 * K, and
        a @ (b @ r) == out @ r, for a (M, K) and b (K, N) int8 and out (M, N) int32, or
        each with a leading batch axis B, and r (V, N) float64 of integers below 2**bits. The caller
        (pynode.core.gemm.check) picks bits so that every partial sum is an integer below
        2**53: both sides are exact whatever the order of summation."""
        bound = (1 << 14) * a.shape[-1]
        if out.size and (int(out.max()) > bound or int(out.min()) < -bound):
            return False
        rt = r.T  # (N, V)
        return bool(np.array_equal(np.matmul(a, np.matmul(b, rt)), np.matmul(out, rt)))


    def from_fixed(self, total: np.ndarray, frac_bits: int, divisor: int) -> np.ndarray:
        """fixedpoint.from_fixed: total (n,) int64 / (divisor * 2**frac_bits) as float32."""
        return fixedpoint.from_fixed(total, frac_bits, divisor)

    def adamw(self, p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray,
              scalars: tuple[np.float32, ...], scale: np.float32 | None):
        """One AdamW step of p, g, m, v (n,) f32 (optim.adamw_elementwise, its `scalars`),
        the gradient first multiplied by `scale` where clipping gives one. -> (p', m', v')."""
        if scale is not None:
            g = np.asarray(g * scale)
        return optim.adamw_elementwise(p, g, m, v, scalars)


def _row_dots(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """sum_c x[..., i, c] * w[..., c] in int64 (exact mod 2**64), (..., R); w int64."""
    return np.matmul(x.astype(np.int64), w[..., None])[..., 0]


REFERENCE = Kernels()


@dataclass(frozen=True)
class KernelGateReport:
    kernels: str  # name of the gated implementation
    cases: int  # inputs compared
    passed: bool
    failing_case: str = ""  # the first case whose bits differed


def _cases(seed: int = 0x6A7E):
    """(name, method, args) of the gate: shapes with odd tails, batches, strided views,
    exact ties, zero / subnormal / huge rows, both rounding modes."""
    g = np.random.default_rng(seed)
    f32 = np.float32

    def normal(*shape):
        return (g.standard_normal(shape) * 10.0 ** g.uniform(-3, 3, shape[:-1] + (1,))).astype(f32)

    mat = normal(37, 67)
    mat[1] = 0.0
    mat[2] = f32(1e-44) * np.sign(mat[2])  # scale underflows to the smallest subnormal
    mat[3, :] = np.arange(67, dtype=f32) - f32(33.5)  # ties after scaling
    mat[4, 5] = f32(3e38)
    batched = normal(3, 19, 33)
    wide = normal(5, 300)
    yield from (
        (f"quantize.{what}.{axis}.{key is not None}", "quantize", (x, axis, key))
        for what, x in (("mat", mat), ("batched", batched), ("wide", wide),
                        ("transposed", mat.T), ("btransposed", batched.transpose(0, 2, 1)))
        for axis in (-1, -2) for key in (None, (7, 3, 1, 2))
    )
    for what, x in (("mat", mat), ("batched", batched), ("wide", wide),
                    ("transposed", mat.T), ("btransposed", batched.transpose(0, 2, 1))):
        # the check's vectors: r's 20-bit entries, B @ r's sums, and wrapping ones
        lead = x.shape[:-2] if x.ndim == 3 else ()
        for size, w in (("r", g.integers(0, 1 << 20, x.shape[-1])),
                        ("sums", g.integers(-(2**40), 2**40, lead + x.shape[-1:])),
                        ("wrapping", g.integers(-(2**62), 2**62, x.shape[-1]))):
            for axis in (-1, -2):
                for key in (None, (7, 3, 1, 2)):
                    yield (f"quantize_dots.{what}.{size}.{axis}.{key is not None}",
                           "quantize_dots", (x, axis, key, w))
    acc = g.integers(-(2**31), 2**31, (3, 17, 9), dtype=np.int64).astype(np.int32)
    yield "epilogue", "epilogue", (acc, normal(3, 17), normal(3, 9))
    sa, sb = normal(3, 17), normal(3, 9)
    r = g.integers(0, 1 << 20, 9)
    right = np.matmul(acc.astype(np.int64), r)  # (3, 17)
    cell = right.copy()
    cell[1, 5] += 1
    for what, lhs in (("right", right), ("cell", cell),
                      ("top bit", right ^ np.int64(-(2**63)))):
        yield f"epilogue_checked.{what}", "epilogue_checked", (acc, sa, sb, r, lhs)
        yield (f"epilogue_checked.2d.{what}", "epilogue_checked",
               (acc[1], sa[1], sb[1], r, lhs[1]))
    # r past int32 (the numba kernel's other path), its sums wrapping int64
    wide = g.integers(-(2**62), 2**62, 9)
    wide[4] = 2**31
    right = np.matmul(acc.astype(np.int64), wide)
    for what, lhs in (("right", right), ("cell", right + (np.arange(17) == 3))):
        yield f"epilogue_checked.wide.{what}", "epilogue_checked", (acc, sa, sb, wide, lhs)
    gelu_x = np.concatenate([normal(4099).ravel(), np.array(
        [0, -0.0, 1e-30, -1e-30, -0.7518, 5.0, -5.0, 13.5, -13.5, 40.0, -40.0, 1e30, -1e30], f32)])
    yield "gelu", "gelu_with_grad", (gelu_x,)
    yield "gelu.2d", "gelu_with_grad", (normal(31, 129),)
    scores = normal(6, 33, 33)
    yield "softmax", "softmax_rows", (normal(45, 257),)
    yield "softmax.masked", "softmax_rows", (scores, np.tri(33, dtype=bool))
    yield "log_softmax", "log_softmax_parts", (normal(45, 257),)
    yield "psum_rows", "psum_rows", (normal(7, 9, 129),)
    squares = normal(119105).astype(np.float64)  # the clipping norm's one long float64 row
    yield "psum_rows.f64", "psum_rows", (squares * squares,)
    yield "psum_rows.f64.rows", "psum_rows", (normal(5, 1031).astype(np.float64),)
    for n in (1, 3, 4, 5, 1031, 4 * 700 + 2):  # whole and partial Philox blocks, many tiles
        yield f"raw64.{n}", "raw64", ((7, 3, n, 2**40 + n), n)
    totals = g.integers(-(2**62), 2**62, 1031, dtype=np.int64)
    totals[:6] = [-(2**63), 2**63 - 1, 0, -1, 1, 2**31 + 1]  # the ends and the halves' seams
    for frac_bits, divisor in ((32, 8), (16, 3), (0, 1), (40, 7)):
        yield f"from_fixed.{frac_bits}.{divisor}", "from_fixed", (totals, frac_bits, divisor)
    n = 2053
    pg, gg = normal(n), normal(n)
    mg, vg = normal(n) * f32(0.01), np.abs(normal(n)) * f32(1e-4)
    pg[:4], gg[:4], vg[:4] = 0.0, [0.0, -0.0, 1e-40, -3e-39], [0.0, 1e-45, 3e38, 0.0]
    steps = {"warm": (0.9, 0.1, 0.999, 0.001, 3e-3 / 0.19, 0.0447, 1e-8, 1.0),
             "decay": (0.9, 0.1, 0.95, 0.05, 1e-3 / 0.1, 0.7, 1e-6, 0.9999)}
    for what, values in steps.items():
        scalars = tuple(f32(x) for x in values)
        for scale in (None, f32(0.37)):
            yield (f"adamw.{what}.{scale is not None}", "adamw",
                   (pg, gg, mg, vg, scalars, scale))
    for name, (bs, m, k, n) in {"mm": (1, 45, 131, 29), "bmm": (5, 17, 33, 63),
                                "tall": (1, 300, 8, 3), "wide": (2, 3, 257, 90)}.items():
        a = g.integers(-128, 128, (bs, m, k), dtype=np.int64).astype(np.int8)
        b = g.integers(-128, 128, (bs, k, n), dtype=np.int64).astype(np.int8)
        right = np.matmul(a.astype(np.int32), b.astype(np.int32))
        r = g.integers(0, 1 << 16, (2, n)).astype(np.float64)
        views = {"": (a, b), ".transposed": (  # the same values in column-major memory
            a.transpose(0, 2, 1).copy().transpose(0, 2, 1),
            b.transpose(0, 2, 1).copy().transpose(0, 2, 1))}
        for how, (av, bv) in views.items():
            wrong = {"right": right, "cell": right.copy(), "huge": right.copy()}
            wrong["cell"][-1, m // 2, n - 1] -= 1
            wrong["huge"][0, 0, 0] = 2**31 - 1
            for what, out in wrong.items():
                yield f"product_holds.{name}{how}.{what}", "product_holds", (av, bv, out, r)
                if bs == 1:  # a plain matmul's 2-d operands
                    yield (f"product_holds.{name}{how}.2d.{what}", "product_holds",
                           (av[0], bv[0], out[0], r))
    # B @ r beyond numba's float64 side (sum |B @ r| * 2**7 reaches 2**53): its int64 side
    a = g.integers(-128, 128, (2, 6, 300), dtype=np.int64).astype(np.int8)
    b = np.full((2, 300, 200), 127, np.int8)
    right = np.matmul(a.astype(np.int32), b.astype(np.int32))
    wrong = right.copy()
    wrong[1, 5, 199] += 1
    r = np.full((1, 200), float(2**24))
    for how, av in {"": a, ".transposed": a.transpose(0, 2, 1).copy().transpose(0, 2, 1)}.items():
        for what, out in {"right": right, "cell": wrong}.items():
            yield f"product_holds.heavy{how}.{what}", "product_holds", (av, b, out, r)


def _same(a, b) -> bool:
    if isinstance(a, bool):
        return type(b) is bool and a == b
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_same, a, b))
    return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
            and a.tobytes() == b.tobytes())


def gate_kernels(candidate: Kernels, reference: Kernels = REFERENCE) -> KernelGateReport:
    """Compare every kernel of `candidate` with `reference`, bit for bit (raw bytes, so
    -0.0 and NaN payloads count). Twice each, so a kernel keeping state shows it."""
    cases = 0
    for name, method, args in _cases():
        want = getattr(reference, method)(*args)
        for _ in range(2):
            cases += 1
            try:
                got = getattr(candidate, method)(*args)
            except Exception as exc:  # a crash is a failed case, not a crashed peer
                return KernelGateReport(candidate.name, cases, False, f"{name}: {exc!r}")
            if not _same(want, got):
                return KernelGateReport(candidate.name, cases, False, name)
    return KernelGateReport(candidate.name, cases, True)
