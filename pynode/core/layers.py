"""Int8 layers with explicit forward and backward, bit-identical on every peer.

Every matrix product, forward and backward, is an int8 GEMM through the gated `gemm`
(`int8_matmul` / `int8_bmm`): the left operand quantized per row, the right per column,
the int32 result scaled back by `quant.epilogue` in its pinned order. Forward operands
use round-to-nearest; an incoming gradient (dY, or the attention score gradient dS) uses
stochastic rounding keyed by `key + (layer_id, product)`, which keeps int8 training as
good as float (DESIGN 3). Float reductions go through `detmath.psum`/`pmax` only.

Each layer is a pair of pure functions: `*_forward(...) -> (out, cache)` and
`*_backward(cache, dout, ...) -> grads`; a cache holds what the backward needs.

Legend: B batch, T positions, D width, H heads, Dh = D / H, G = B * H, M rows (B * T),
K inner dimension, N output features, V vocab, S max positions (wpe rows).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from pynode.core import detmath, rng
from pynode.core.errors import NoGemmError, NonFiniteError, ShapeError
from pynode.core.kernels import REFERENCE, Kernels

RMS_EPS = np.float32(1e-5)

# Product codes: the last element of a stochastic-rounding key, one per backward product.
LINEAR_DX, LINEAR_DW = 0, 1
ATTN_DP, ATTN_DV, ATTN_DQ, ATTN_DK = 0, 1, 2, 3

F32 = np.float32


def _c(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x)


def kernels_of(gemm: Any) -> Kernels:
    """The hot kernels that go with a gated GEMM (the numpy reference by default)."""
    return getattr(gemm, "kernels", REFERENCE)


def need_gemm(gemm: Any) -> None:
    if gemm is None:
        raise NoGemmError("int8_matmul / int8_bmm need the verified GEMM, and this model was "
                          "built without one (gemm=None): a task that says uses_units = False "
                          "gets none (only a plain-float task should; docs/CUSTOM_TASK.md)")


def int8_matmul(
    gemm: Any,
    a: np.ndarray,
    b: np.ndarray,
    *,
    a_key: tuple[int, ...] | None = None,
    b_key: tuple[int, ...] | None = None,
) -> np.ndarray:
    """a (M, K) f32 times b (K, N) f32 as one int8 GEMM; returns (M, N) f32.

    `a` is quantized per row, `b` per column; a key switches that operand from
    round-to-nearest to stochastic rounding (used for incoming gradients only).
    """
    need_gemm(gemm)
    return _int8_product(gemm, a, b, a_key, b_key, gemm.matmul)


def int8_bmm(
    gemm: Any,
    a: np.ndarray,
    b: np.ndarray,
    *,
    a_key: tuple[int, ...] | None = None,
    b_key: tuple[int, ...] | None = None,
) -> np.ndarray:
    """Batched `int8_matmul`: a (G, M, K) f32, b (G, K, N) f32 -> (G, M, N) f32."""
    need_gemm(gemm)
    return _int8_product(gemm, a, b, a_key, b_key, gemm.bmm)


def _int8_product(gemm: Any, a: np.ndarray, b: np.ndarray, a_key, b_key, product) -> np.ndarray:
    """int8_matmul / int8_bmm: a (..., M, K), b (..., K, N) f32 -> (..., M, N) f32, `product`
    gemm's matmul or bmm; the check rides in the kernels' passes where the GEMM offers it."""
    ops = kernels_of(gemm)
    r = _check_vectors(gemm, b.shape[-1])
    if r is None:
        qa, sa = ops.quantize(a, -1, a_key)  # (..., M, K) int8, (..., M) f32
        qb, sb = ops.quantize(b, -2, b_key)  # (..., K, N) int8, (..., N) f32
        return ops.epilogue(product(qa, qb), sa, sb)  # (..., M, N) f32
    qb, sb, br = ops.quantize_dots(b, -2, b_key, r)  # ..., qb @ r (..., K) int64
    qa, sa, lhs = ops.quantize_dots(a, -1, a_key, br)  # ..., qa @ (qb @ r) (..., M) int64
    return gemm.scaled(qa, qb, sa, sb, r, lhs)  # (..., M, N) f32


def _check_vectors(gemm: Any, n: int) -> np.ndarray | None:
    """The per-call check's r for a product of N columns where it rides in the kernels'
    passes (Gemm.check_vectors), else None: a GEMM without one checks on its own."""
    vectors = getattr(gemm, "check_vectors", None)
    return None if vectors is None else vectors(n)


# ---------------------------------------------------------------- embedding


def embedding_forward(wte: np.ndarray, wpe: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Token plus position embedding: tokens (B, T) int -> (B, T, D) f32."""
    t = tokens.shape[1]
    return wte[tokens] + wpe[None, :t]  # (B, T, D) f32


def embedding_backward(
    tokens: np.ndarray, dx: np.ndarray, vocab: int, positions: int
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of the embedding tables: dx (B, T, D) -> dwte (V, D), dwpe (S, D)."""
    b, t, d = dx.shape
    dwte = scatter_add_exact(tokens.reshape(-1), dx.reshape(b * t, d), vocab)  # (V, D) f32
    dwpe = np.zeros((positions, d), F32)  # (S, D) f32
    dwpe[:t] = detmath.psum(dx, axis=0)  # (T, D) f32, pinned sum over the batch
    return dwte, dwpe


def scatter_add_exact(index: np.ndarray, values: np.ndarray, rows: int) -> np.ndarray:
    """out[index[i]] += values[i], summed exactly in int64 fixed point: (N,), (N, D) -> (rows, D).

    Which positions share a token is data, so a float scatter-add would be pinned only
    by numpy's loop order in np.add.at, an implementation detail. In integers the order
    cannot matter: values are scaled by one power of two, chosen so that the sum of all
    N stays below 2**62, rounded to int64, added with np.add.at and scaled back. With
    N <= 1024 every value within 2**-27 of the largest converts exactly and smaller ones
    round at 2**-51 of it: finer than any float32 sum.
    """
    d = values.shape[1]
    amax = float(np.max(np.abs(values))) if values.size else 0.0
    if not math.isfinite(amax):
        raise NonFiniteError("non-finite gradient reached the embedding scatter-add")
    if amax == 0.0:
        return np.zeros((rows, d), F32)
    _, exponent = math.frexp(amax)  # amax < 2**exponent
    shift = 62 - int(len(index)).bit_length() - exponent
    scaled = values.astype(np.float64)  # (N, D) f64, a fresh array: scaled in place
    np.rint(np.ldexp(scaled, shift, out=scaled), out=scaled)
    acc = np.zeros((rows, d), np.int64)  # (rows, D) int64
    np.add.at(acc, index, scaled.astype(np.int64))
    total = acc.astype(np.float64)  # (rows, D) f64
    return np.ldexp(total, -shift, out=total).astype(F32)  # (rows, D) f32


# ---------------------------------------------------------------- RMSNorm


class RMSNormCache(NamedTuple):
    xhat: np.ndarray  # (M, D) f32, x * r
    r: np.ndarray  # (M,) f32, 1 / rms(x)
    g: np.ndarray  # (D,) f32


def rmsnorm_forward(
    x: np.ndarray, g: np.ndarray, ops: Kernels = REFERENCE
) -> tuple[np.ndarray, RMSNormCache]:
    """y = x / sqrt(mean(x**2) + eps) * g over the last axis: x (M, D), g (D,) -> (M, D)."""
    d = F32(x.shape[-1])
    r = detmath.rsqrt(ops.psum_rows(x * x) / d + RMS_EPS)  # (M,) f32
    xhat = x * r[:, None]  # (M, D) f32
    return xhat * g, RMSNormCache(xhat, r, g)


def rmsnorm_backward(
    cache: RMSNormCache, dy: np.ndarray, ops: Kernels = REFERENCE
) -> tuple[np.ndarray, np.ndarray]:
    """dy (M, D) -> dx (M, D), dg (D,)."""
    d = F32(dy.shape[-1])
    dxhat = dy * cache.g  # (M, D) f32
    dg = detmath.psum(dy * cache.xhat, axis=0)  # (D,) f32, pinned sum over positions
    proj = ops.psum_rows(dxhat * cache.xhat) / d  # (M,) f32
    dx = cache.xhat * proj[:, None]  # (M, D) f32, then dx = (dxhat - it) * r in place
    np.subtract(dxhat, dx, out=dx)
    dx *= cache.r[:, None]
    return dx, dg


# ---------------------------------------------------------------- linear


class LinearCache(NamedTuple):
    x: np.ndarray  # (M, K) f32
    w: np.ndarray  # (K, N) f32
    has_bias: bool


def linear_forward(
    gemm: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None
) -> tuple[np.ndarray, LinearCache]:
    """y = x W (+ b): x (M, K), w (K, N), b (N,) -> (M, N) f32."""
    y = int8_matmul(gemm, x, w)  # (M, N) f32
    if b is not None:
        y = y + b
    return y, LinearCache(x, w, b is not None)


def linear_backward(
    gemm: Any, cache: LinearCache, dy: np.ndarray, key: tuple[int, ...], layer_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """dy (M, N) -> dx (M, K), dw (K, N), db (N,) or None; dY rounded stochastically."""
    k = tuple(key) + (layer_id,)
    dx = int8_matmul(gemm, dy, cache.w.T, a_key=k + (LINEAR_DX,))  # (M, K) f32
    dw = int8_matmul(gemm, cache.x.T, dy, b_key=k + (LINEAR_DW,))  # (K, N) f32
    db = detmath.psum(dy, axis=0) if cache.has_bias else None  # (N,) f32
    return dx, dw, db


# ---------------------------------------------------------------- GELU


def gelu_forward(u: np.ndarray, ops: Kernels = REFERENCE) -> tuple[np.ndarray, np.ndarray]:
    """Exact (erf) GELU, elementwise; the cache is its derivative at u (one pass for both)."""
    return ops.gelu_with_grad(u)


def gelu_backward(grad: np.ndarray, dy: np.ndarray) -> np.ndarray:
    return dy * grad


# ---------------------------------------------------------------- causal self-attention


class AttentionCache(NamedTuple):
    q: np.ndarray  # (G, T, Dh) f32
    k: np.ndarray  # (G, T, Dh) f32
    v: np.ndarray  # (G, T, Dh) f32
    p: np.ndarray  # (G, T, T) f32, attention weights, zero above the diagonal
    heads: int


def _split_heads(x: np.ndarray, heads: int) -> np.ndarray:
    b, t, d = x.shape  # (B, T, D) -> (G, T, Dh)
    return _c(x.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3).reshape(-1, t, d // heads))


def _merge_heads(x: np.ndarray, batch: int) -> np.ndarray:
    g, t, dh = x.shape  # (G, T, Dh) -> (B, T, D)
    heads = g // batch
    return _c(x.reshape(batch, heads, t, dh).transpose(0, 2, 1, 3).reshape(batch, t, heads * dh))


def causal_softmax(s: np.ndarray, ops: Kernels = REFERENCE) -> np.ndarray:
    """Softmax over keys <= query of s (G, T, T); exact zeros above the diagonal.

    Masked entries never enter a reduction with a value of their own, so the weights of
    position t are the same bits whatever the later tokens are.
    """
    return ops.softmax_rows(s, np.tri(s.shape[-1], dtype=bool))  # key <= query


def attend_values(gemm: Any, p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """p (G, T, T) times v (G, T, Dh) as an int8 batched GEMM -> (G, T, Dh) f32.

    A per-column scale of v would span all positions, so a later token would change how
    an earlier output is rounded. Instead v is scaled per key position (its rows), and
    that scale is folded into p's columns before p is quantized per query row: every
    scale then depends on positions <= the query only, and the product stays one GEMM.
    """
    ops = kernels_of(gemm)
    ones = np.ones(v.shape[::2], F32)  # (G, Dh) f32
    r = _check_vectors(gemm, v.shape[-1])
    if r is None:
        qv, sv = ops.quantize(v, -1, None)  # (G, T, Dh) int8, (G, T) f32
        qp, sp = ops.quantize(p * sv[:, None, :], -1, None)  # (G, T, T) int8, (G, T) f32
        return ops.epilogue(gemm.bmm(qp, qv), sp, ones)  # (G, T, Dh) f32
    qv, sv, vr = ops.quantize_dots(v, -1, None, r)  # ..., qv @ r (G, T) int64
    qp, sp, lhs = ops.quantize_dots(p * sv[:, None, :], -1, None, vr)  # ..., (G, T) int64
    return gemm.scaled(qp, qv, sp, ones, r, lhs)  # (G, T, Dh) f32


def attention_forward(gemm: Any, qkv: np.ndarray, heads: int) -> tuple[np.ndarray, AttentionCache]:
    """Causal multi-head self-attention: qkv (B, T, 3D) f32 -> (B, T, D) f32."""
    b = qkv.shape[0]
    q, k, v = (_split_heads(part, heads) for part in np.split(qkv, 3, axis=-1))  # (G, T, Dh)
    scale = F32(1.0 / math.sqrt(q.shape[-1]))
    s = int8_bmm(gemm, q, k.transpose(0, 2, 1)) * scale  # (G, T, T) f32
    p = causal_softmax(s, kernels_of(gemm))  # (G, T, T) f32
    o = attend_values(gemm, p, v)  # (G, T, Dh) f32
    return _merge_heads(o, b), AttentionCache(q, k, v, p, heads)


def attention_backward(
    gemm: Any, cache: AttentionCache, dout: np.ndarray, key: tuple[int, ...], layer_id: int
) -> np.ndarray:
    """dout (B, T, D) -> dqkv (B, T, 3D); dO and dS rounded stochastically."""
    b = dout.shape[0]
    q, k, v, p = cache.q, cache.k, cache.v, cache.p
    kk = tuple(key) + (layer_id,)
    do = _split_heads(dout, cache.heads)  # (G, T, Dh) f32
    dp = int8_bmm(gemm, do, v.transpose(0, 2, 1), a_key=kk + (ATTN_DP,))  # (G, T, T) f32
    dv = int8_bmm(gemm, p.transpose(0, 2, 1), do, b_key=kk + (ATTN_DV,))  # (G, T, Dh) f32
    scale = F32(1.0 / math.sqrt(q.shape[-1]))
    row = kernels_of(gemm).psum_rows(p * dp)  # (G, T) f32
    ds = p * (dp - row[..., None]) * scale  # (G, T, T) f32, zero above the diagonal
    dq = int8_bmm(gemm, ds, k, a_key=kk + (ATTN_DQ,))  # (G, T, Dh) f32
    dk = int8_bmm(gemm, ds.transpose(0, 2, 1), q, a_key=kk + (ATTN_DK,))  # (G, T, Dh) f32
    return np.concatenate([_merge_heads(x, b) for x in (dq, dk, dv)], axis=-1)


# ---------------------------------------------------------------- cross-entropy


class CrossEntropyCache(NamedTuple):
    probs: np.ndarray  # (N, V) f32, softmax of the logits
    targets: np.ndarray  # (N,) int


def cross_entropy_forward(
    logits: np.ndarray, targets: np.ndarray, ops: Kernels = REFERENCE
) -> tuple[np.float32, CrossEntropyCache]:
    """Mean cross-entropy of logits (N, V) f32 against targets (N,) int -> float32."""
    n = logits.shape[0]
    probs, lse = ops.log_softmax_parts(logits)  # (N, V), (N,) f32
    picked = logits[np.arange(n), targets]  # (N,) f32
    loss = detmath.psum(lse - picked, axis=-1) / F32(n)
    return F32(loss), CrossEntropyCache(probs, targets)


def cross_entropy_backward(cache: CrossEntropyCache) -> np.ndarray:
    """Gradient of the mean loss with respect to the logits: (N, V) f32."""
    n = cache.probs.shape[0]
    grad = cache.probs.copy()  # (N, V) f32
    grad[np.arange(n), cache.targets] -= F32(1)
    return grad / F32(n)


def check_finite(name: str, x: np.ndarray) -> None:
    """Raise NonFiniteError naming `name` if x holds a NaN or an Inf."""
    if not np.isfinite(x).all():
        raise NonFiniteError(f"{name} holds NaN or Inf")


def check_key(key: Any) -> tuple[int, ...]:
    """Refuse a rounding key that is not a tuple of ints >= 0 (before any work is done)."""
    ok = isinstance(key, tuple) and all(
        isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 0 for k in key
    )
    if not ok:
        raise rng.RngArgumentError(f"a rounding key is a tuple of ints >= 0, got {key!r}")
    return key


def check_params(params: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse a parameter dict whose names, shapes, dtype or values do not fit the model."""
    if not isinstance(params, dict) or set(params) != set(shapes):
        got = set(params) if isinstance(params, dict) else type(params).__name__
        missing = sorted(set(shapes) - set(got)) if isinstance(got, set) else "all"
        extra = sorted(set(got) - set(shapes)) if isinstance(got, set) else []
        raise ShapeError(f"parameters do not match the model: missing {missing}, extra {extra}")
    for name, shape in shapes.items():
        p = params[name]
        if not isinstance(p, np.ndarray) or p.dtype != np.float32 or p.shape != shape:
            desc = f"{p.dtype} {p.shape}" if isinstance(p, np.ndarray) else type(p).__name__
            raise ShapeError(f"parameter {name!r}: expected float32 {shape}, got {desc}")
        check_finite(f"parameter {name!r}", p)
