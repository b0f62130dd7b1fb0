"""A small classification task for fast tests: 4 classes from the signs of two features."""

from __future__ import annotations

from typing import Any

import numpy as np

from pynode.config import RunConfig
from pynode.core import rng
from pynode.core.mlp import MLP, MLPConfig

DATA_PURPOSE = 0xDA7A


class MLPTask:
    name = "mlp"

    def build_model(self, cfg: RunConfig, gemm: Any) -> MLP:
        return MLP(MLPConfig(inputs=16, hidden=cfg.width, classes=4), gemm)

    def sample(self, cfg: RunConfig, step: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.normal((cfg.seed, step, index, DATA_PURPOSE), (cfg.microbatch_size, 16))  # (B, 16)
        y = (x[:, 0] > 0).astype(np.int32) * 2 + (x[:, 1] > 0).astype(np.int32)  # (B,) int32
        return x, y

    def loss(self, model: MLP, params, batch, key):
        x, y = batch
        return model.loss_and_grads(params, (x, y), key)
