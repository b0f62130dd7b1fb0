"""A template for your own task: copy it, rename the class, then train it with

    PYNODE_TASK=my_task_template:LinearRegressionTask python -m pynode train --steps 50

(run from this folder, or put the module on PYTHONPATH). Every rule of DESIGN.md section 2
applies, because every peer must compute the same bits: draw randomness from
pynode.core.rng, reduce floats with pynode.core.detmath.psum, and do matrix products
through the int8 GEMM (pynode.core.layers.int8_matmul), never with `@` on floats.
"""

from __future__ import annotations

import numpy as np

from pynode.config import RunConfig
from pynode.core import detmath, layers, rng

FEATURES = 8
DATA_PURPOSE = 0x7E57  # keeps this task's data stream apart from init and rounding


class LinearModel:
    """y = x W: one int8 linear layer, trained on a fixed teacher."""

    def __init__(self, gemm):
        self.gemm = gemm

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"w": (FEATURES, 1)}

    def init_params(self, seed: int) -> dict[str, np.ndarray]:
        return {"w": rng.normal((seed, 1), (FEATURES, 1)) * np.float32(0.1)}


class LinearRegressionTask:
    name = "linear-regression"

    def build_model(self, cfg: RunConfig, gemm) -> LinearModel:
        return LinearModel(gemm)

    def sample(self, cfg: RunConfig, step: int, index: int):
        # A pure function of (seed, step, index): every peer draws the same microbatch.
        x = rng.normal((cfg.seed, step, index, DATA_PURPOSE), (cfg.microbatch_size, FEATURES))
        teacher = np.arange(1, FEATURES + 1, dtype=np.float32)[:, None] / np.float32(FEATURES)
        y = detmath.psum(x * teacher[:, 0][None, :], axis=-1)[:, None]  # (B, 1) f32
        return x, y

    def loss(self, model: LinearModel, params, batch, key):
        x, y = batch
        pred = layers.int8_matmul(model.gemm, x, params["w"])  # (B, 1) f32
        err = pred - y
        count = np.float32(err.shape[0])
        loss = detmath.psum(err[:, 0] * err[:, 0], axis=-1) / count
        derr = (np.float32(2.0) / count) * err  # (B, 1) f32, dLoss/dpred
        # dW = x^T derr, through the int8 GEMM with the gradient stochastically rounded.
        dw = layers.int8_matmul(model.gemm, x.T.copy(), derr, b_key=key + (0,))
        return np.float32(loss), {"w": dw}
