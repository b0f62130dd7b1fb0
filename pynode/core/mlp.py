"""A small int8 classifier (two linear layers with biases and a GELU) for fast tests.

Same interface as the GPT; a batch is (x (B, I) float32, y (B,) int class labels).
Legend: B batch, I inputs, H hidden, C classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pynode.core import layers as nn
from pynode.core import rng
from pynode.core.errors import ShapeError

INIT_PURPOSE = 0x1A17  # same purpose as the GPT's init: a model owns its seed's init stream
FC1, FC2 = 1, 2  # layer ids of the stochastic-rounding keys


@dataclass(frozen=True)
class MLPConfig:
    inputs: int = 16  # I, features per example
    hidden: int = 32  # H, hidden width
    classes: int = 4  # C, number of labels

    def __post_init__(self) -> None:
        for name in ("inputs", "hidden", "classes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ShapeError(f"MLPConfig.{name} must be a positive integer, got {value!r}")


class MLP:
    """x -> GELU(x W1 + b1) W2 + b2 -> cross-entropy, every product an int8 GEMM."""

    def __init__(self, cfg: MLPConfig, gemm: Any) -> None:
        self.cfg = cfg
        self.gemm = gemm

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.cfg
        return {
            "fc1.w": (c.inputs, c.hidden),
            "fc1.b": (c.hidden,),
            "fc2.w": (c.hidden, c.classes),
            "fc2.b": (c.classes,),
        }

    def init_params(self, seed: int) -> dict[str, np.ndarray]:
        """Weights N(0, 1/fan_in) from the counter-based RNG, biases zero."""
        params = {}
        for index, (name, shape) in enumerate(self.param_shapes().items()):
            if name.endswith(".b"):
                params[name] = np.zeros(shape, np.float32)
            else:
                std = np.float32(1.0 / shape[0] ** 0.5)
                params[name] = rng.normal((seed, INIT_PURPOSE, index), shape) * std
        return params

    def forward_logits(self, params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        """Class logits of x (B, I) f32 -> (B, C) f32."""
        nn.check_params(params, self.param_shapes())
        logits, _ = self._forward(params, self._check_x(x))
        return logits

    def loss_and_grads(
        self,
        params: dict[str, np.ndarray],
        batch: tuple[np.ndarray, np.ndarray],
        key: tuple[int, ...],
    ) -> tuple[np.float32, dict[str, np.ndarray]]:
        """Mean cross-entropy of batch = (x (B, I), y (B,)) and its float32 gradients."""
        shapes = self.param_shapes()
        nn.check_params(params, shapes)
        key = nn.check_key(key)
        if not isinstance(batch, tuple) or len(batch) != 2:
            raise ShapeError("an MLP batch is a tuple (x, y)")
        x, y = self._check_x(batch[0]), batch[1]
        if not isinstance(y, np.ndarray) or y.shape != x.shape[:1] or y.dtype.kind not in "iu":
            raise ShapeError(f"labels must be integers of shape {x.shape[:1]}")
        if y.min() < 0 or y.max() >= self.cfg.classes:
            raise ShapeError(f"labels must lie in [0, {self.cfg.classes})")
        logits, (fc1, gelu, fc2) = self._forward(params, x)
        loss, ce = nn.cross_entropy_forward(logits, y.astype(np.int64))
        dlogits = nn.cross_entropy_backward(ce)  # (B, C) f32
        dh, dw2, db2 = nn.linear_backward(self.gemm, fc2, dlogits, key, FC2)
        du = nn.gelu_backward(gelu, dh)  # (B, H) f32
        _, dw1, db1 = nn.linear_backward(self.gemm, fc1, du, key, FC1)
        grads = {"fc1.w": dw1, "fc1.b": db1, "fc2.w": dw2, "fc2.b": db2}
        return loss, {name: grads[name] for name in shapes}

    def _check_x(self, x: Any) -> np.ndarray:
        want = self.cfg.inputs
        if not isinstance(x, np.ndarray) or x.ndim != 2 or x.shape[1] != want or len(x) < 1:
            got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
            raise ShapeError(f"inputs must be (B, {want}) float32, got {got}")
        if x.dtype != np.float32:
            raise ShapeError(f"inputs must be float32, got {x.dtype}")
        nn.check_finite("inputs", x)
        return x

    def _forward(self, params, x):
        u, fc1 = nn.linear_forward(self.gemm, x, params["fc1.w"], params["fc1.b"])  # (B, H) f32
        h, gelu = nn.gelu_forward(u)
        logits, fc2 = nn.linear_forward(self.gemm, h, params["fc2.w"], params["fc2.b"])  # (B, C)
        return logits, (fc1, gelu, fc2)
