"""The plain-float alternative: the same GPT, data and optimizer, in float torch (native only).

Its gradients still travel as int64 fixed point, so the cluster machinery is identical; only
the model's arithmetic differs (and is not bit-reproducible across machines).
"""

from __future__ import annotations

from typing import Any

from pynode.config import RunConfig
from pynode.tasks.gpt import GPTTask, gpt_config


class FloatGPTTask(GPTTask):
    name = "float"
    uses_units = False
    requires = ("torch",)  # checked by load_task: one line naming the extra, not a traceback

    def build_model(self, cfg: RunConfig, gemm: Any):
        from pynode.float_gpt import FloatGPT

        return FloatGPT(gpt_config(cfg))
