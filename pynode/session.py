"""Putting a peer together: verified units, the gated GEMM, the task, the trainer, checkpoints.

Shared by every entry point (CLI train / cluster / join, and the page), so each of them
starts a peer the same way and refuses the same things.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pynode.config import RunConfig
from pynode.core import checkpoint
from pynode.core.errors import DaisyError
from pynode.tasks import load_task
from pynode.trainer import StepResult, Trainer, TrainState

log = logging.getLogger("pynode.session")


def load_units_and_gemm(backend: str | None = None) -> tuple[Any, Any]:
    """Verified units (full-domain check) and the best gated GEMM backend (or `backend`)."""
    from pynode.core.gemm import select_gemm
    from pynode.unitfiles import load_default_units

    units = load_default_units()
    return units, select_gemm(units, prefer=backend)


def build_trainer(
    cfg: RunConfig, backend: str | None = None, collective: Any = None,
    resume: checkpoint.CheckpointState | None = None,
) -> Trainer:
    task = load_task(cfg.task)
    gemm = None
    units = None
    if getattr(task, "uses_units", True):
        units, gemm = load_units_and_gemm(backend)
    state = None if resume is None else state_from_checkpoint(resume)
    trainer = Trainer(cfg, task, gemm, collective=collective, state=state)
    trainer.units = units
    return trainer


def state_from_checkpoint(ckpt: checkpoint.CheckpointState) -> TrainState:
    from pynode.core import optim

    opt = optim.AdamState(m=dict(ckpt.adam_m), v=dict(ckpt.adam_v), step=ckpt.adam_step)
    return TrainState(step=ckpt.step, params=dict(ckpt.params), opt=opt)


def read_checkpoint(path: str | os.PathLike, cfg: RunConfig | None = None):
    """Load and validate a checkpoint file; `cfg` (if given) must match its config."""
    data = Path(path).read_bytes()
    expect = None if cfg is None else {"config": _model_keys(cfg), "task": cfg.task}
    return checkpoint.load_checkpoint(data, expect=expect)


def _model_keys(cfg: RunConfig) -> dict:
    return {k: getattr(cfg, k) for k in ("width", "layers", "heads", "seq")}


def checkpoint_bytes(trainer: Trainer) -> bytes:
    state = trainer.state
    return checkpoint.save_checkpoint(
        checkpoint.CheckpointState(
            task=trainer.cfg.task,
            config=json_config(trainer.cfg),
            step=state.step,
            params=state.params,
            adam_m=state.opt.m,
            adam_v=state.opt.v,
            adam_step=state.opt.step,
            data_cursor=state.step,
            state_hash=state.hash(),
        )
    )


def json_config(cfg: RunConfig) -> dict:
    import json

    return json.loads(cfg.to_json())


def write_atomically(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so a crash leaves either the old file or the new one."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, target)


async def run_steps(
    trainer: Trainer, until: int, on_step: Callable[[StepResult], Awaitable[None] | None]
) -> None:
    """Train until `trainer.state.step == until`, calling `on_step` after each step."""
    while trainer.state.step < until:
        result = await trainer.step()
        maybe = on_step(result)
        if maybe is not None:
            await maybe


__all__ = ["DaisyError", "build_trainer", "checkpoint_bytes", "read_checkpoint", "run_steps"]
