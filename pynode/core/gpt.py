"""Byte-level GPT with an explicit int8 forward and backward (pure numpy, see layers.py).

Architecture (pre-norm, no biases, tied head, as nanoGPT with bias=False):
    x = wte[tokens] + wpe[:T]
    each block:  x += proj(attn(qkv(rmsnorm(x))));  x += proj(gelu(fc(rmsnorm(x))))
    logits = rmsnorm(x) wte^T;  loss = mean cross-entropy
RMSNorm rather than LayerNorm: one pinned reduction per row instead of two, no bias.
GELU (erf form, detmath) rather than a ReLU through the verified unit: it keeps the
activation in float between the two MLP GEMMs, matches the float torch twin exactly
in architecture, and needs nothing beyond the gated `gemm` the model is built with.

Legend: B batch, T positions (<= cfg.seq), D width, V vocab, L layers, M = B * T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pynode.core import layers as nn
from pynode.core import rng
from pynode.core.errors import ShapeError

# rng purpose of parameter initialisation (training keys start with the step instead).
INIT_PURPOSE = 0x1A17
# GEMM layers of a block in forward order; layer id = 1 + SLOTS * block + slot.
QKV, ATTN, ATTN_PROJ, FC, MLP_PROJ = range(5)
SLOTS = 5


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256  # byte-level: one token per byte value
    width: int = 64  # D, residual stream and embedding size
    layers: int = 2  # L, transformer blocks
    heads: int = 4  # attention heads; must divide width
    seq: int = 64  # S, longest context (rows of the position table)

    def __post_init__(self) -> None:
        for name in ("vocab", "width", "layers", "heads", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ShapeError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.width % self.heads:
            raise ShapeError(f"GPTConfig: heads ({self.heads}) must divide width ({self.width})")


def gpt_param_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes in canonical order (weights are (in, out))."""
    d = cfg.width
    shapes: dict[str, tuple[int, ...]] = {"wte": (cfg.vocab, d), "wpe": (cfg.seq, d)}
    for i in range(cfg.layers):
        shapes[f"h.{i}.ln1.g"] = (d,)
        shapes[f"h.{i}.attn.qkv"] = (d, 3 * d)
        shapes[f"h.{i}.attn.proj"] = (d, d)
        shapes[f"h.{i}.ln2.g"] = (d,)
        shapes[f"h.{i}.mlp.fc"] = (d, 4 * d)
        shapes[f"h.{i}.mlp.proj"] = (4 * d, d)
    shapes["lnf.g"] = (d,)
    return shapes


def gpt_init_params(cfg: GPTConfig, seed: int) -> dict[str, np.ndarray]:
    """GPT-2 init from the counter-based RNG: N(0, 0.02), residual projections scaled
    by 1/sqrt(2L), norm gains 1. Same bits everywhere for the same seed."""
    params = {}
    proj_std = 0.02 / (2 * cfg.layers) ** 0.5
    for index, (name, shape) in enumerate(gpt_param_shapes(cfg).items()):
        if name.endswith(".g"):
            params[name] = np.ones(shape, np.float32)
            continue
        std = proj_std if name.endswith(".proj") else 0.02
        params[name] = rng.normal((seed, INIT_PURPOSE, index), shape) * np.float32(std)
    return params


def check_tokens(tokens: Any, cfg: GPTConfig, extra: int) -> np.ndarray:
    """Refuse tokens that are not (B, T + extra) integers in [0, vocab) with T <= seq."""
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 2:
        raise ShapeError(f"tokens must be a 2-D integer array, got {_describe(tokens)}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ShapeError(f"tokens must be integers, got {tokens.dtype}")
    t = tokens.shape[1] - extra
    if tokens.shape[0] < 1 or not 1 <= t <= cfg.seq:
        raise ShapeError(
            f"tokens of shape {tokens.shape}: need B >= 1 and 1 <= T <= {cfg.seq} "
            f"positions (+{extra} for targets)"
        )
    if tokens.min() < 0 or tokens.max() >= cfg.vocab:
        raise ShapeError(
            f"token values must lie in [0, {cfg.vocab}), got {tokens.min()}..{tokens.max()}"
        )
    return tokens.astype(np.int64)


def _describe(x: Any) -> str:
    return f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__


class GPT:
    """The int8 GPT. `gemm` is the gated GEMM wrapper (matmul/bmm int8 -> int32)."""

    def __init__(self, cfg: GPTConfig, gemm: Any) -> None:
        self.cfg = cfg
        self.gemm = gemm
        self.ops = nn.kernels_of(gemm)  # quantize, epilogue, GELU, softmax, row sums
        self._shapes = gpt_param_shapes(cfg)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def init_params(self, seed: int) -> dict[str, np.ndarray]:
        return gpt_init_params(self.cfg, seed)

    def forward_logits(self, params: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
        """Next-byte logits of tokens (B, T) int -> (B, T, V) f32."""
        nn.check_params(params, self._shapes)
        tokens = check_tokens(tokens, self.cfg, extra=0)
        logits, _ = self._forward(params, tokens)  # (M, V) f32
        return logits.reshape(*tokens.shape, self.cfg.vocab)

    def loss(self, params: dict[str, np.ndarray], tokens: np.ndarray) -> np.float32:
        """Mean next-byte cross-entropy of tokens (B, T+1), forward only (held-out loss)."""
        nn.check_params(params, self._shapes)
        tokens = check_tokens(tokens, self.cfg, extra=1)
        logits, _ = self._forward(params, tokens[:, :-1])  # (M, V) f32
        return nn.cross_entropy_forward(logits, tokens[:, 1:].reshape(-1), self.ops)[0]

    def loss_and_grads(
        self, params: dict[str, np.ndarray], tokens: np.ndarray, key: tuple[int, ...]
    ) -> tuple[np.float32, dict[str, np.ndarray]]:
        """Mean next-byte cross-entropy of tokens (B, T+1) and its float32 gradients.

        `key` (seed, step, microbatch) seeds the stochastic rounding of the backward.
        """
        nn.check_params(params, self._shapes)
        key = nn.check_key(key)
        tokens = check_tokens(tokens, self.cfg, extra=1)
        logits, caches = self._forward(params, tokens[:, :-1])  # (M, V) f32
        loss, ce = nn.cross_entropy_forward(logits, tokens[:, 1:].reshape(-1), self.ops)
        grads = self._backward(params, tokens[:, :-1], caches, nn.cross_entropy_backward(ce), key)
        return loss, {name: grads[name] for name in self._shapes}

    def _forward(self, params, tokens):
        cfg, gemm = self.cfg, self.gemm
        b, t = tokens.shape
        x = nn.embedding_forward(params["wte"], params["wpe"], tokens).reshape(b * t, -1)  # (M, D)
        blocks = []
        for i in range(cfg.layers):
            x, cache = self._block_forward(params, i, x, b)
            blocks.append(cache)
        h, lnf = nn.rmsnorm_forward(x, params["lnf.g"], self.ops)  # (M, D) f32
        logits, head = nn.linear_forward(gemm, h, params["wte"].T)  # (M, V) f32
        return logits, (blocks, lnf, head)

    def _block_forward(self, params, i, x, b):
        gemm, p = self.gemm, f"h.{i}."
        h, ln1 = nn.rmsnorm_forward(x, params[p + "ln1.g"], self.ops)  # (M, D) f32
        qkv, qkv_c = nn.linear_forward(gemm, h, params[p + "attn.qkv"])  # (M, 3D) f32
        a, attn_c = nn.attention_forward(gemm, qkv.reshape(b, -1, qkv.shape[-1]), self.cfg.heads)
        y, aproj_c = nn.linear_forward(gemm, a.reshape(x.shape), params[p + "attn.proj"])
        x = x + y  # (M, D) f32
        h, ln2 = nn.rmsnorm_forward(x, params[p + "ln2.g"], self.ops)
        u, fc_c = nn.linear_forward(gemm, h, params[p + "mlp.fc"])  # (M, 4D) f32
        g, gelu_c = nn.gelu_forward(u, self.ops)
        y, mproj_c = nn.linear_forward(gemm, g, params[p + "mlp.proj"])  # (M, D) f32
        return x + y, (ln1, qkv_c, attn_c, aproj_c, ln2, fc_c, gelu_c, mproj_c)

    def _backward(self, params, tokens, caches, dlogits, key):
        cfg, gemm = self.cfg, self.gemm
        blocks, lnf, head = caches
        grads: dict[str, np.ndarray] = {}
        dh, dwte_t, _ = nn.linear_backward(gemm, head, dlogits, key, 1 + SLOTS * cfg.layers)
        dx, grads["lnf.g"] = nn.rmsnorm_backward(lnf, dh, self.ops)  # (M, D) f32
        for i in reversed(range(cfg.layers)):
            dx = self._block_backward(i, blocks[i], dx, key, grads)
        b, t = tokens.shape
        dwte, grads["wpe"] = nn.embedding_backward(tokens, dx.reshape(b, t, -1), cfg.vocab, cfg.seq)
        grads["wte"] = dwte + dwte_t.T  # (V, D) f32: tied embedding and head
        return grads

    def _block_backward(self, i, cache, dx, key, grads):
        gemm, p, base = self.gemm, f"h.{i}.", 1 + SLOTS * i
        ln1, qkv_c, attn_c, aproj_c, ln2, fc_c, gelu_c, mproj_c = cache
        dg, grads[p + "mlp.proj"], _ = nn.linear_backward(gemm, mproj_c, dx, key, base + MLP_PROJ)
        du = nn.gelu_backward(gelu_c, dg)  # (M, 4D) f32
        dh, grads[p + "mlp.fc"], _ = nn.linear_backward(gemm, fc_c, du, key, base + FC)
        dres, grads[p + "ln2.g"] = nn.rmsnorm_backward(ln2, dh, self.ops)
        dx = dx + dres  # (M, D) f32
        da, grads[p + "attn.proj"], _ = nn.linear_backward(gemm, aproj_c, dx, key, base + ATTN_PROJ)
        da = da.reshape(attn_c.q.shape[0] // attn_c.heads, -1, da.shape[-1])  # (B, T, D) f32
        dqkv = nn.attention_backward(gemm, attn_c, da, key, base + ATTN)  # (B, T, 3D) f32
        dh, grads[p + "attn.qkv"], _ = nn.linear_backward(
            gemm, qkv_c, dqkv.reshape(dx.shape[0], -1), key, base + QKV
        )
        dres, grads[p + "ln1.g"] = nn.rmsnorm_backward(ln1, dh, self.ops)
        return dx + dres
