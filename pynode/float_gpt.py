"""The plain-float twin of pynode.core.gpt: same architecture, parameter names and shapes,
in torch float32 (or float64 as a test oracle). Native only: it imports torch.

It serves as the "plain-float alternative task" the int8 model is judged against, and as
the reference the int8 gradients are compared with. Nothing here is bit-reproducible
across machines, and nothing needs to be.

Legend: B batch, T positions, D width, H heads, Dh = D / H, V vocab.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from pynode.core.gpt import GPTConfig, check_tokens, gpt_init_params, gpt_param_shapes
from pynode.core.layers import check_params

RMS_EPS = 1e-5  # as pynode.core.layers


def _rmsnorm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * g


def _attention(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, d3 = qkv.shape  # (B, T, 3D)
    q, k, v = (
        z.reshape(b, t, heads, d3 // 3 // heads).transpose(1, 2) for z in qkv.split(d3 // 3, -1)
    )  # (B, H, T, Dh) each
    s = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)  # (B, H, T, T)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    p = s.masked_fill(~mask, float("-inf")).softmax(-1)
    return (p @ v).transpose(1, 2).reshape(b, t, d3 // 3)  # (B, T, D)


def float_forward(params: dict[str, torch.Tensor], tokens: torch.Tensor, cfg: GPTConfig):
    """Logits (B, T, V) of tokens (B, T) int64 under torch params (same names as GPT)."""
    t = tokens.shape[1]
    x = params["wte"][tokens] + params["wpe"][:t]  # (B, T, D)
    for i in range(cfg.layers):
        p = f"h.{i}."
        a = _attention(_rmsnorm(x, params[p + "ln1.g"]) @ params[p + "attn.qkv"], cfg.heads)
        x = x + a @ params[p + "attn.proj"]
        u = _rmsnorm(x, params[p + "ln2.g"]) @ params[p + "mlp.fc"]
        x = x + F.gelu(u) @ params[p + "mlp.proj"]
    return _rmsnorm(x, params["lnf.g"]) @ params["wte"].T


def float_loss_and_grads(
    params: dict[str, np.ndarray],
    tokens: np.ndarray,
    cfg: GPTConfig,
    dtype: torch.dtype = torch.float32,
) -> tuple[np.floating, dict[str, np.ndarray]]:
    """Mean next-byte cross-entropy of tokens (B, T+1) and its gradients, in plain float.

    The arithmetic and the returned arrays are `dtype` (float32, or float64 as an oracle).
    """
    check_params(params, gpt_param_shapes(cfg))
    tokens = torch.from_numpy(check_tokens(tokens, cfg, extra=1))
    leaves = {n: torch.tensor(p, dtype=dtype, requires_grad=True) for n, p in params.items()}
    logits = float_forward(leaves, tokens[:, :-1], cfg)  # (B, T, V)
    loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), tokens[:, 1:].reshape(-1))
    loss.backward()
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    grads = {n: leaves[n].grad.numpy().astype(np_dtype) for n in gpt_param_shapes(cfg)}
    return np_dtype(loss.item()), grads


class FloatGPT:
    """The float twin with the GPT model interface (the float task's model)."""

    def __init__(self, cfg: GPTConfig, gemm: Any = None) -> None:
        self.cfg = cfg

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return gpt_param_shapes(self.cfg)

    def init_params(self, seed: int) -> dict[str, np.ndarray]:
        return gpt_init_params(self.cfg, seed)

    def loss_and_grads(
        self, params: dict[str, np.ndarray], tokens: np.ndarray, key: tuple[int, ...] = ()
    ) -> tuple[np.float32, dict[str, np.ndarray]]:
        """As GPT.loss_and_grads; `key` is accepted for the same call shape and unused."""
        return float_loss_and_grads(params, tokens, self.cfg)

    def loss(self, params: dict[str, np.ndarray], tokens: np.ndarray) -> np.float32:
        """Mean next-byte cross-entropy of tokens (B, T+1), forward only (held-out loss)."""
        tokens = check_tokens(tokens, self.cfg, extra=1)
        logits = self.forward_logits(params, tokens[:, :-1])  # (B, T, V) f32
        with torch.no_grad():
            loss = F.cross_entropy(torch.from_numpy(logits).reshape(-1, self.cfg.vocab),
                                   torch.from_numpy(tokens[:, 1:]).reshape(-1).long())
        return np.float32(loss.item())

    def forward_logits(self, params: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
        check_params(params, gpt_param_shapes(self.cfg))
        tokens = torch.from_numpy(check_tokens(tokens, self.cfg, extra=0))
        with torch.no_grad():
            leaves = {n: torch.from_numpy(p) for n, p in params.items()}
            return float_forward(leaves, tokens, self.cfg).numpy()
