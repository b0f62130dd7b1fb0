"""The Task interface: everything the trainer needs to know about a model and its data."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from pynode.config import RunConfig
from pynode.core.errors import DaisyError


class TaskDataError(DaisyError):
    """A task's check_data raised an error of its own kind (not a DaisyError): said in one
    line with the task's name, as the project's own errors are."""


def check_task_data(task: Any, cfg: RunConfig) -> None:
    """The task's optional `check_data(cfg)`: its named error for data this peer cannot
    read (a trainer, and a run's leader before it starts, ask it)."""
    check_data = getattr(task, "check_data", None)
    if check_data is None:
        return
    try:
        check_data(cfg)
    except (DaisyError, ImportError):  # an extra it needs: main names what to install
        raise
    except Exception as exc:  # noqa: BLE001 - a researcher's ValueError is said too
        raise TaskDataError(f"task {cfg.task!r}: check_data: {type(exc).__name__}: "
                            f"{exc}") from exc


@runtime_checkable
class Model(Protocol):
    def param_shapes(self) -> dict[str, tuple[int, ...]]: ...

    def init_params(self, seed: int) -> dict[str, np.ndarray]: ...


@runtime_checkable
class Task(Protocol):
    """A trainable task. Every method must be a pure function of its arguments.

    build_model(cfg, gemm) -> Model     the model; `gemm` is the gated int8 GEMM (None for float)
    sample(cfg, step, index) -> batch   microbatch `index` of `step`: same bits on every peer
    loss(model, params, batch, key)     -> (loss float32, grads {name: float32 array})

    Optional: check_data(cfg) raises an error for data this peer cannot read, before any
    step (a DaisyError is said as it is, any other as TaskDataError with its type);
    build_model never reads data (generation and checkpoint checks build the model
    without it).

    Optional, for held-out loss (RunConfig.eval_every; pynode.run.trainer.heldout_loss):
    heldout(cfg, index) -> batch        held-out microbatch `index`, the same at every step
    eval_loss(model, params, batch)     -> loss float32, forward only
    """

    name: str

    def build_model(self, cfg: RunConfig, gemm: Any) -> Model: ...

    def sample(self, cfg: RunConfig, step: int, index: int) -> Any: ...

    def loss(
        self, model: Model, params: dict[str, np.ndarray], batch: Any, key: tuple[int, ...]
    ) -> tuple[np.float32, dict[str, np.ndarray]]: ...
