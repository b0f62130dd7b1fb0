"""Fault injection for the fault tests, read only by the command line.

PYNODE_FAULT="[RANK:]STEP:KIND" makes this peer misbehave in step STEP (1-based), as it
starts computing (whether or not the plan gave it microbatches); with RANK, only the group
member of that rank. KIND:
  kill   SIGKILL itself
  int    SIGINT itself (a terminal's Ctrl-C)
  stall  block its training loop (its links stay up, its messages stop: deadlines drop it)
  nan    a NaN weight, so its gradient is not finite
  flip   flip one weight bit after the step's update (a silent fork)
  sum    SIGKILL while handing out its reduced chunk of the step's all-reduce, after the
         leader committed it (webrtc transport only)
  gemm   from that step on, its GEMM backend is wrong in one cell of every product whose
         inner size is the model width, a shape no start-up gate uses (only the per-call
         product check, --check-products, can catch it)
  grad   from that step on, one gradient value of each of its microbatches is off (as from
         a wrong non-GEMM kernel: only the cross-peer check, --cross-check, can catch it)
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np

from pynode.config import ConfigError
from pynode.core.gemm import GemmBackend
from pynode.run.trainer import Trainer

FAULT_ENV = "PYNODE_FAULT"
KINDS = ("kill", "int", "stall", "nan", "flip", "sum", "gemm", "grad")


def install_fault(trainer: Trainer, rank: int | None = None) -> None:
    """Arm the fault PYNODE_FAULT names on `trainer` (group rank `rank`), if any."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[-1] not in KINDS:
        raise ConfigError(f"{FAULT_ENV} must be [RANK:]STEP:KIND with KIND one of "
                          f"{', '.join(KINDS)}; got {spec!r}")
    *who, step_text, kind = parts
    if who and int(who[0]) != rank:
        return
    at = int(step_text)
    if kind == "flip":
        def flip(t: Trainer) -> None:
            if t.state.step == at:
                name = next(iter(t.state.params))
                t.state.params[name].reshape(-1).view("<u4")[0] ^= 1

        trainer.after_update.append(flip)
    elif kind == "sum":
        die_handing_out_sums(trainer, at)
    elif kind == "grad":
        trainer.task = WrongGradients(trainer, at)
    elif kind == "gemm":
        def go_wrong(step: int, indices: list[int]) -> None:
            if step == at and trainer.gemm is not None:
                trainer.gemm.backend = WrongAtWidth(trainer.gemm.backend, trainer.cfg.width)
                trainer.gemm.routes.clear()

        trainer.before_compute.append(go_wrong)
    else:
        def misbehave(step: int, indices: list[int]) -> None:
            if step != at:
                return
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "int":
                os.kill(os.getpid(), signal.SIGINT)
            if kind == "stall":
                time.sleep(3600)
            if kind == "nan":
                trainer.state.params[next(iter(trainer.state.params))].reshape(-1)[0] = float("nan")

        trainer.before_compute.append(misbehave)


class WrongAtWidth(GemmBackend):
    """`inner`'s products, except those whose inner size is `k`: one cell is off by 2**16."""

    def __init__(self, inner: GemmBackend, k: int) -> None:
        self.inner, self.k, self.name = inner, k, f"wrong_{inner.name}"

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._spoil(self.inner.matmul(a, b), a.shape[-1])

    def bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._spoil(self.inner.bmm(a, b), a.shape[-1])

    def _spoil(self, out: np.ndarray, k: int) -> np.ndarray:
        if k == self.k and out.size:
            out.reshape(-1)[out.size * 5 // 7] += 1 << 16
        return out


class WrongGradients:
    """`trainer`'s task, but from step `at` on the first gradient value of every microbatch
    is 0.5 off."""

    def __init__(self, trainer: Trainer, at: int) -> None:
        self.task, self.trainer, self.at = trainer.task, trainer, at

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def loss(self, model: Any, params: dict, batch: Any, key: Any) -> tuple[float, dict]:
        loss, grads = self.task.loss(model, params, batch, key)
        if self.trainer.state.step + 1 >= self.at:
            name = next(iter(grads))
            spoiled = np.array(grads[name], np.float32)
            spoiled.reshape(-1)[0] += np.float32(0.5)
            grads = {**grads, name: spoiled}
        return loss, grads


def die_handing_out_sums(trainer: Trainer, at: int) -> None:
    from pynode.comm.webrtc import MeshCollective, Op

    coll = trainer.collective
    if not isinstance(coll, MeshCollective):
        raise ConfigError(f"{FAULT_ENV} kind 'sum' needs the webrtc transport")
    plain_send = coll._send

    def send(peer: str, op: Op, *args: Any, **kw: Any) -> None:
        plain_send(peer, op, *args, **kw)
        if op == Op.SUM and trainer.state.step + 1 == at:
            os.kill(os.getpid(), signal.SIGKILL)

    coll._send = send  # type: ignore[method-assign]
