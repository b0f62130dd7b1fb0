"""Putting a peer together: verified units, the gated GEMM, the task, the trainer, checkpoints.

Shared by every entry point (CLI train / cluster / join, and the page), so each of them
starts a peer the same way and refuses the same things.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from pynode.config import RunConfig
from pynode.core import checkpoint
from pynode.tasks import load_task
from pynode.trainer import Trainer, TrainState

log = logging.getLogger("pynode.session")


def load_units_and_gemm(
    backend: str | None = None, kernels: str | None = None
) -> tuple[Any, Any]:
    """Verified units (full-domain check), the best gated GEMM backend (or `backend`) and
    the fastest gated hot kernels (or `kernels`: "numpy" forces the reference)."""
    from pynode.browser_gemm import WASM_SIMD, available_backends
    from pynode.core.detmath import check_float_environment
    from pynode.core.gemm import select_gemm
    from pynode.core.rng import check_bit_generator
    from pynode.unitfiles import load_default_units
    from pynode.verify import backend_order

    check_float_environment()
    check_bit_generator()
    units = load_default_units()
    order = backend_order()
    if WASM_SIMD in order:  # the page: a backend core cannot build by name; wasm kernels
        from pynode.browser_kernels import select_kernels

        order, _ = available_backends(order, units.mul_lut)
    else:
        from pynode.native_kernels import select_kernels
    ops, _ = select_kernels(kernels)
    return units, select_gemm(units, prefer=backend, order=order, kernels=ops)


def build_trainer(
    cfg: RunConfig, backend: str | None = None, collective: Any = None,
    resume: checkpoint.CheckpointState | None = None, kernels: str | None = None,
) -> Trainer:
    task = load_task(cfg.task)
    gemm = None
    units = None
    if getattr(task, "uses_units", True):
        units, gemm = load_units_and_gemm(backend, kernels)
    state = None if resume is None else state_from_checkpoint(resume)
    trainer = Trainer(cfg, task, gemm, collective=collective, state=state)
    trainer.units = units
    if gemm is not None and backend is None:
        from pynode.gemm_tuning import tune_trainer

        tune_trainer(trainer)
    return trainer


def state_from_checkpoint(ckpt: checkpoint.CheckpointState) -> TrainState:
    from pynode.core import optim

    opt = optim.AdamState(m=dict(ckpt.adam_m), v=dict(ckpt.adam_v), step=ckpt.adam_step)
    return TrainState(step=ckpt.step, params=dict(ckpt.params), opt=opt)


def load_resume(
    path: str | os.PathLike, overrides: dict
) -> tuple[RunConfig, checkpoint.CheckpointState]:
    """The checkpoint at `path` and the config to continue it with: the checkpoint's own
    config, then the explicit `overrides`. Raises CheckpointError (nothing loaded) for a bad
    file or one that does not fit the model the config describes."""
    data = Path(path).read_bytes()
    stored = checkpoint.load_checkpoint(data)
    config = {k: v for k, v in stored.config.items() if k != "vocab"}
    try:
        cfg = RunConfig.from_dict({**config, **overrides})
    except ValueError as exc:
        raise checkpoint.CheckpointError(f"checkpoint config cannot be resumed: {exc}") from exc
    return cfg, checkpoint.load_checkpoint(data, expect=checkpoint_expectations(cfg))


def checkpoint_expectations(cfg: RunConfig) -> dict:
    task = load_task(cfg.task)
    expect = {"task": cfg.task, "param_shapes": task.build_model(cfg, None).param_shapes()}
    vocab = getattr(task, "vocab", None)
    if vocab is not None:
        expect["vocab"] = vocab
    return expect


def checkpoint_bytes(trainer: Trainer) -> bytes:
    """The trainer's current state as a .pt file (see pynode.core.checkpoint)."""
    return trainer.state_bytes()


def write_atomically(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so a crash leaves either the old file or the new one."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, target)
