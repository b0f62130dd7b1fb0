"""The int8 layers against independent references.

Oracles: a float64 numpy implementation of each layer (finite differences of it give the
exact gradient) and torch float32 for the forward. Tolerances, and why:
- Layers without a GEMM (RMSNorm, GELU, cross-entropy, embedding) are float32 throughout,
  so they must agree to float32 round-off: relative L2 error < 1e-4.
- A GEMM rounds each operand to int8 with step absmax/127 per row or column. Over rows of
  Gaussian-like values that is ~0.5-1 % relative error per operand, and a stochastically
  rounded dY adds up to twice the variance of round-to-nearest. Measured here (several
  keys): linear forward 0.7 %, attention forward 0.4 %, linear gradients 0.7-0.8 %,
  attention gradients 0.6-0.9 % (each of q, k, v under 1 %). The bounds are ~3x that,
  far below what a wrong formula gives (a missing term or a transpose shows up as tens
  of percent and a cosine well under 0.99).
Legend: M rows, K inner, N out, B batch, T positions, D width, H heads, V vocab.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pynode.core import layers as nn
from pynode.core.errors import NonFiniteError

SQRT2 = math.sqrt(2.0)
_erf64 = np.vectorize(math.erf)
KEY = (7, 3, 1)


# ---------------------------------------------------------------- helpers


def normal(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def cosine(got, want) -> float:
    a, b = np.ravel(got).astype(np.float64), np.ravel(want).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def assert_grad(got, want, *, rel, cos=0.99):
    assert got.shape == want.shape and got.dtype == np.float32
    assert cosine(got, want) > cos, cosine(got, want)
    assert rel_err(got, want) < rel, rel_err(got, want)


def fd_grads(scalar_fn, arrays, h=1e-6):
    """Central differences of scalar_fn(*arrays) (float64) for every element of each array."""
    arrays = [np.array(a, np.float64) for a in arrays]
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            keep = a[i]
            a[i] = keep + h
            up = scalar_fn(*arrays)
            a[i] = keep - h
            down = scalar_fn(*arrays)
            a[i] = keep
            g[i] = (up - down) / (2 * h)
        grads.append(g)
    return grads


def bits(x):
    return np.ascontiguousarray(x).view(np.uint32)


# ---------------------------------------------------------------- float64 references


def linear64(x, w, b):
    return x @ w + b


def rmsnorm64(x, g):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g


def gelu64(x):
    return 0.5 * x * (1.0 + _erf64(x / SQRT2))


def attention64(qkv, heads):
    b, t, d3 = qkv.shape
    d = d3 // 3
    q, k, v = (
        z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for z in np.split(qkv, 3, -1)
    )
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads)  # (B, H, T, T)
    s = np.where(np.tri(t, dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(b, t, d)


def cross_entropy64(logits, targets):
    m = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(-1)) + m[:, 0]
    return float((lse - logits[np.arange(len(targets)), targets]).mean())


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def units():
    from pynode.unitfiles import load_default_units

    return load_default_units()


@pytest.fixture(scope="module")
def gemm(units):
    from pynode.core.gemm import select_gemm

    return select_gemm(units)


@pytest.fixture(scope="module")
def ref_gemm(units):
    from pynode.core.gemm import select_gemm

    return select_gemm(units, prefer="reference")


# ---------------------------------------------------------------- linear


def linear_case():
    x, w, b = normal((16, 24), 1), normal((24, 12), 2, 0.2), normal((12,), 3, 0.1)
    return x, w, b, normal((16, 12), 4)


def test_linear_forward_matches_torch(gemm):
    x, w, b, _ = linear_case()
    y, _ = nn.linear_forward(gemm, x, w, b)
    want = F.linear(torch.from_numpy(x), torch.from_numpy(w.T.copy()), torch.from_numpy(b))
    assert y.dtype == np.float32 and y.shape == (16, 12)
    assert rel_err(y, want.numpy()) < 0.02


def test_linear_backward_matches_finite_differences(gemm):
    x, w, b, dy = linear_case()
    _, cache = nn.linear_forward(gemm, x, w, b)
    dx, dw, db = nn.linear_backward(gemm, cache, dy, KEY, layer_id=5)
    fx, fw, fb = fd_grads(lambda *a: float((linear64(*a) * dy).sum()), [x, w, b])
    assert_grad(dx, fx, rel=0.025)
    assert_grad(dw, fw, rel=0.025)
    assert_grad(db, fb, rel=1e-4)


def test_linear_backward_is_deterministic_and_keyed(gemm):
    x, w, b, dy = linear_case()
    _, cache = nn.linear_forward(gemm, x, w, b)
    first = nn.linear_backward(gemm, cache, dy, KEY, 5)
    again = nn.linear_backward(gemm, cache, dy, KEY, 5)
    other = nn.linear_backward(gemm, cache, dy, KEY, 6)
    for g1, g2 in zip(first, again, strict=True):
        assert np.array_equal(bits(g1), bits(g2))
    assert not np.array_equal(first[0], other[0]), "the layer id must reach the rounding key"
    assert not np.array_equal(first[1], other[1])


def test_linear_same_bits_on_every_backend(gemm, ref_gemm):
    x, w, b, dy = linear_case()
    outs = []
    for g in (gemm, ref_gemm):
        y, cache = nn.linear_forward(g, x, w, b)
        outs.append((y, *nn.linear_backward(g, cache, dy, KEY, 5)))
    for a, r in zip(*outs, strict=True):
        assert np.array_equal(bits(a), bits(r))


def test_linear_refuses_nan_before_any_change(gemm):
    x, w, b, _ = linear_case()
    x[3, 4] = np.nan
    w_before = w.copy()
    with pytest.raises(NonFiniteError):
        nn.linear_forward(gemm, x, w, b)
    assert np.array_equal(bits(w), bits(w_before))
    x[3, 4] = 0.0
    w[0, 0] = np.inf
    with pytest.raises(NonFiniteError):
        nn.linear_forward(gemm, x, w, b)


# ---------------------------------------------------------------- attention


def attention_case(t=6):
    return normal((2, t, 24), 10), normal((2, t, 8), 11)


def test_attention_forward_matches_torch(gemm):
    qkv, _ = attention_case()
    out, _ = nn.attention_forward(gemm, qkv, heads=2)
    q, k, v = (z.reshape(2, 6, 2, 4).transpose(1, 2) for z in torch.from_numpy(qkv).split(8, -1))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 6, 8)
    assert out.dtype == np.float32 and out.shape == (2, 6, 8)
    assert rel_err(out, want.numpy()) < 0.015


def test_attention_backward_matches_finite_differences(gemm):
    qkv, dout = attention_case()
    _, cache = nn.attention_forward(gemm, qkv, heads=2)
    dqkv = nn.attention_backward(gemm, cache, dout, KEY, layer_id=2)
    (want,) = fd_grads(lambda a: float((attention64(a, 2) * dout).sum()), [qkv])
    assert_grad(dqkv, want, rel=0.03)
    # q, k and v each get their share right, not just the whole.
    for part in range(3):
        cols = slice(8 * part, 8 * part + 8)
        assert_grad(dqkv[..., cols], want[..., cols], rel=0.04)


def test_attention_same_bits_twice_and_on_every_backend(gemm, ref_gemm):
    qkv, dout = attention_case()
    results = []
    for g in (gemm, gemm, ref_gemm):
        out, cache = nn.attention_forward(g, qkv, heads=2)
        results.append((out, nn.attention_backward(g, cache, dout, KEY, 2)))
    for out, grad in results[1:]:
        assert np.array_equal(bits(out), bits(results[0][0]))
        assert np.array_equal(bits(grad), bits(results[0][1]))


def test_attention_output_ignores_later_positions_bit_for_bit(gemm):
    qkv, _ = attention_case(t=8)
    later = qkv.copy()
    later[:, 5:] = normal((2, 3, 24), 99, scale=50.0)  # large, so any shared scale would move
    out, _ = nn.attention_forward(gemm, qkv, heads=2)
    out_later, _ = nn.attention_forward(gemm, later, heads=2)
    assert np.array_equal(bits(out[:, :5]), bits(out_later[:, :5]))
    assert not np.array_equal(out[:, 5:], out_later[:, 5:])


def test_causal_softmax_rows_sum_to_one_and_mask_is_exact():
    s = normal((3, 7, 7), 5, scale=4.0)
    p = nn.causal_softmax(s)
    assert p.dtype == np.float32
    assert np.all(p[:, np.triu_indices(7, 1)[0], np.triu_indices(7, 1)[1]] == 0)
    assert np.abs(p.astype(np.float64).sum(-1) - 1).max() < 1e-6
    assert p[0, 0, 0] == 1.0


def test_attention_refuses_nan(gemm):
    qkv, _ = attention_case()
    qkv[1, 2, 20] = np.nan  # a value entry
    with pytest.raises(NonFiniteError):
        nn.attention_forward(gemm, qkv, heads=2)


# ---------------------------------------------------------------- RMSNorm, GELU, cross-entropy


def test_rmsnorm_forward_and_backward():
    x, g, dy = normal((6, 16), 20), normal((16,), 21, 0.5) + 1, normal((6, 16), 22)
    y, cache = nn.rmsnorm_forward(x, g)
    want = F.rms_norm(torch.from_numpy(x), (16,), torch.from_numpy(g), eps=1e-5)
    assert rel_err(y, want.numpy()) < 1e-5
    dx, dg = nn.rmsnorm_backward(cache, dy)
    fx, fg = fd_grads(lambda *a: float((rmsnorm64(*a) * dy).sum()), [x, g])
    assert_grad(dx, fx, rel=1e-4, cos=0.9999)
    assert_grad(dg, fg, rel=1e-4, cos=0.9999)


def test_gelu_forward_and_backward():
    u, dy = normal((4, 13), 30, 2.0), normal((4, 13), 31)
    y, cache = nn.gelu_forward(u)
    assert rel_err(y, F.gelu(torch.from_numpy(u)).numpy()) < 1e-5
    (fu,) = fd_grads(lambda a: float((gelu64(a) * dy).sum()), [u])
    assert_grad(nn.gelu_backward(cache, dy), fu, rel=1e-4, cos=0.9999)


def test_cross_entropy_forward_and_backward():
    logits, targets = normal((8, 11), 40, 3.0), np.array([0, 3, 10, 2, 2, 7, 5, 1])
    loss, cache = nn.cross_entropy_forward(logits, targets)
    want = F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(targets)).item()
    assert isinstance(loss, np.float32) and abs(loss - want) < 1e-5 * want
    (fl,) = fd_grads(lambda a: cross_entropy64(a, targets), [logits])
    assert_grad(nn.cross_entropy_backward(cache), fl, rel=1e-4, cos=0.9999)


# ---------------------------------------------------------------- embedding


def test_embedding_forward_and_backward():
    wte, wpe = normal((10, 4), 50), normal((8, 4), 51)
    tokens = np.array([[1, 2, 2, 9, 1], [2, 0, 1, 1, 2]])
    x = nn.embedding_forward(wte, wpe, tokens)
    want = F.embedding(torch.from_numpy(tokens), torch.from_numpy(wte)) + torch.from_numpy(wpe[:5])
    assert np.array_equal(x, want.numpy())
    dx = normal((2, 5, 4), 52)
    dwte, dwpe = nn.embedding_backward(tokens, dx, vocab=10, positions=8)
    ref_te = np.zeros((10, 4))
    np.add.at(ref_te, tokens.ravel(), dx.reshape(-1, 4).astype(np.float64))
    assert dwte.dtype == np.float32 and rel_err(dwte, ref_te) < 1e-6
    assert np.all(dwte[[3, 4, 5, 6, 7, 8]] == 0)
    assert rel_err(dwpe[:5], dx.astype(np.float64).sum(0)) < 1e-6 and np.all(dwpe[5:] == 0)


def test_scatter_add_is_exact_and_order_free():
    rng = np.random.default_rng(60)
    index = rng.integers(0, 5, 4000)
    # 21-bit integers times 2**-10..2**0: every sum is exact in float64 but needs more bits
    # than float32 holds, so a float32 scatter-add of these depends on its order.
    scale = 2.0 ** rng.integers(-10, 1, (4000, 1))
    values = (rng.integers(-(2**20), 2**20, (4000, 3)) * scale).astype(np.float32)
    got = nn.scatter_add_exact(index, values, rows=5)
    perm = rng.permutation(4000)
    assert np.array_equal(bits(got), bits(nn.scatter_add_exact(index[perm], values[perm], rows=5)))
    exact = np.zeros((5, 3))
    for i, v in zip(index, values.astype(np.float64), strict=True):
        exact[i] += v
    assert np.array_equal(got, exact.astype(np.float32))


def test_scatter_add_refuses_nan():
    values = np.ones((3, 2), np.float32)
    values[1, 1] = np.nan
    with pytest.raises(NonFiniteError):
        nn.scatter_add_exact(np.array([0, 1, 0]), values, rows=2)


def test_an_int8_product_without_a_gemm_is_named():
    """A task that says uses_units = False is built with no GEMM; calling the int8 layers
    then was "AttributeError: 'NoneType' object has no attribute 'matmul'"."""
    from pynode.core.errors import NoGemmError

    a = np.ones((2, 3), np.float32)
    with pytest.raises(NoGemmError, match="uses_units = False"):
        nn.int8_matmul(None, a, a.T)
    with pytest.raises(NoGemmError, match="uses_units = False"):
        nn.int8_bmm(None, a[None], a.T[None])
