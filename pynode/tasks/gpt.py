"""The default task: a byte-level GPT trained through the verified int8 units."""

from __future__ import annotations

from typing import Any

import numpy as np

from pynode.config import RunConfig
from pynode.core.gpt import GPT, GPTConfig
from pynode.datafile import is_file_spec
from pynode.datasource import HELDOUT_STEP, is_text_url, microbatch_bytes, whole_text_part


class GPTTask:
    name = "gpt"
    vocab = 256  # byte-level; recorded in checkpoints and checked on load

    def check_data(self, cfg: RunConfig) -> None:
        """Refuse, before any step, a data file that is missing or another (DataFileError)
        and a text URL that cannot be read or holds another text (DataSourceError). Only a
        trainer asks: a checkpoint's model (generate, the kit) needs no data."""
        if is_file_spec(cfg.data) or is_text_url(cfg.data):
            # each part the run reads holds a sequence: a 2-byte upload started a room's
            # run that stopped at its first step
            for part in ("train", "heldout") if cfg.eval_every else ("all",):
                whole_text_part(cfg.data, part, cfg.seq + 1)

    def build_model(self, cfg: RunConfig, gemm: Any) -> GPT:
        return GPT(gpt_config(cfg), gemm)

    def sample(self, cfg: RunConfig, step: int, index: int) -> np.ndarray:
        # (B, T+1) int32: inputs are [:, :-1], targets [:, 1:]
        return microbatch_bytes(cfg.data, cfg.seed, step, index, cfg.microbatch_size,
                                cfg.seq + 1, cfg.data_fallback,
                                part="train" if cfg.eval_every else "all")

    def loss(self, model: GPT, params, batch, key):
        return model.loss_and_grads(params, batch, key)

    def heldout(self, cfg: RunConfig, index: int) -> np.ndarray:
        """Held-out microbatch `index`: the same text at every evaluation. (B, T+1) int32."""
        return microbatch_bytes(cfg.data, cfg.seed, HELDOUT_STEP, index, cfg.microbatch_size,
                                cfg.seq + 1, cfg.data_fallback, part="heldout")

    def eval_loss(self, model: GPT, params, batch) -> np.float32:
        return model.loss(params, batch)


def gpt_config(cfg: RunConfig) -> GPTConfig:
    return GPTConfig(vocab=256, width=cfg.width, layers=cfg.layers, heads=cfg.heads, seq=cfg.seq)
