"""Putting a peer together: verified units, the gated GEMM, the task, the trainer, checkpoints.

The one place that builds a Trainer: every entry point (CLI train / cluster / join, the
cluster's ranks, the page) starts a peer the same way and refuses the same things.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pynode import platform
from pynode.config import ConfigError, RunConfig, check_outer_given
from pynode.core import checkpoint
from pynode.core.errors import DaisyError
from pynode.run.errors import OutputError
from pynode.run.trainer import ALONE, Trainer, TrainOptions, TrainState
from pynode.tasks import load_task
from pynode.tasks.base import check_task_data

log = logging.getLogger("pynode.run")


def load_units_and_gemm(
    backend: str | None = None, kernels: str | None = None, check_products: bool = True
) -> tuple[Any, Any]:
    """Verified units (full-domain check), the best gated GEMM backend (or `backend`) and
    the fastest gated hot kernels (or `kernels`: "numpy" forces the reference without
    loading numba, "numba" forces numba natively).
    `check_products`: check every GEMM product (pynode.core.gemm.check: Freivalds, a
    few % of a native step; the page checks too, inline, with the wasm kernel)."""
    from pynode.core.detmath import check_float_environment
    from pynode.core.gemm import select_gemm
    from pynode.core.rng import check_bit_generator
    from pynode.gemm_backends import backend_order, build_backend
    from pynode.platform import IN_PYODIDE
    from pynode.unitfiles import load_default_units

    check_float_environment()
    check_bit_generator()
    units = load_default_units()
    if kernels == "numpy":  # numba's import and first load cost about a second a start
        from pynode.core.kernels import REFERENCE as ops
    else:
        if IN_PYODIDE:
            from pynode.browser_kernels import select_kernels
        else:
            from pynode.native_kernels import select_kernels
        ops, _ = select_kernels(kernels)
    return units, select_gemm(units, prefer=backend, order=backend_order(), kernels=ops,
                              build=build_backend, check=check_products)


class MemoryRefusal(ConfigError):
    """This machine does not have the memory a config needs (the leader's, or its own)."""


def memory_needed(cfg: RunConfig, param_count: int) -> int:
    """Rough peak bytes of a peer: params, Adam moments, gradients, partials, activations."""
    state = param_count * (4 * 4 + 8)
    activations = cfg.microbatch_size * cfg.seq * cfg.width * cfg.layers * 4 * 24
    attention = cfg.microbatch_size * cfg.heads * cfg.seq * cfg.seq * 4 * 6 * cfg.layers
    return state + activations + attention


def check_memory(cfg: RunConfig, task: Any, rank: int | None = None) -> None:
    """MemoryRefusal if this machine's available memory cannot hold `cfg`'s training (where
    it can be known: not in the page), before anything of its size is allocated."""
    available = platform.memory_bytes()
    if not available:
        return
    if platform.IN_PYODIDE and available <= 1:
        raise MemoryRefusal(f"this tab's Python memory already grew to "
                            f"{platform.heap_bytes() / 2**30:.1f} GiB (a config too big for a "
                            "tab was tried): reload the page to train in it")
    try:  # a custom task's model may want its GEMM: then the trainer's build says what fails
        shapes = task.build_model(cfg, None).param_shapes()
    except Exception:  # noqa: BLE001 - only the estimate is skipped
        return
    need = memory_needed(cfg, sum(math.prod(shape) for shape in shapes.values()))
    if need > available:
        # a rank of a group did not choose the config (a cluster's followers are all
        # "rank 0" of the room): said the same to each
        who, ask = (("", "choose a smaller one") if rank is None else
                    (f"rank {rank}: ", "the run needs a smaller config"))
        if platform.IN_PYODIDE:  # a tab's user knows no ranks; rank 0 is the tab that starts
            who, ask = "", "choose a smaller one" if rank in (None, 0) else ask
        smaller = ("width, layers, sequence, microbatch size" if platform.IN_PYODIDE
                   else "--width, --layers, --seq, --microbatch-size")
        here = (f"left of the {size_text(platform.PAGE_HEAP_BUDGET)} a tab can hold"
                if platform.IN_PYODIDE else "available here")
        raise MemoryRefusal(f"{who}this config needs about {size_text(need)}, only "
                            f"{size_text(available)} {here}; {ask} ({smaller})")


def size_text(count: float) -> str:
    """Bytes as a person reads them: 812.3 MiB, 14.0 TiB (not 14657961.6 MiB)."""
    value, unit = count / 2**20, "MiB"
    for bigger in ("GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def preflight(cfg: RunConfig) -> None:
    """What a native peer checks of a run it leads or resumes before it starts anything or
    asks anyone: its task's data is readable here (Task.check_data) and this machine's
    memory holds it (check_memory)."""
    task = load_task(cfg.task)
    check_task_data(task, cfg)
    check_memory(cfg, task)


def build_trainer(
    cfg: RunConfig, collective: Any = None,
    resume: checkpoint.CheckpointState | None = None, *,
    arithmetic: tuple[Any, Any] | None = None, backend: str | None = None,
    kernels: str | None = None, options: TrainOptions = ALONE, check_products: bool = True,
) -> Trainer:
    """The trainer of `cfg`, fresh or from the validated checkpoint `resume`.

    `arithmetic` is (units, gemm) a peer verified already (a room peer checks once, then
    trains run after run; the page checks in its own way); without it they are loaded and
    checked here (`backend`, `kernels` as in load_units_and_gemm) and, unless `backend`
    forces one, the GEMM backend is chosen per shape of this model (pynode.gemm_tuning);
    `check_products` as in load_units_and_gemm.
    """
    task = load_task(cfg.task)
    check_memory(cfg, task, None if collective is None else collective.rank)
    units = gemm = None
    tune = False
    if getattr(task, "uses_units", True):
        if arithmetic is None:
            arithmetic = load_units_and_gemm(backend, kernels, check_products)
            tune = backend is None
        units, gemm = arithmetic
    state = None if resume is None else state_from_checkpoint(resume)
    kind = Trainer
    if cfg.outer:  # --sync-every H > 1
        from pynode.run.outer import OuterTrainer as kind
    trainer = kind(cfg, task, gemm, collective, state, units=units, options=options)
    if resume is not None:
        trainer.schedule = list(resume.config.get("schedule", []))
    if tune:
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
    """`read_resume` of the checkpoint file at `path` (--resume), and its run's `preflight`:
    a data file that moved or changed is refused here, once, before any group forms."""
    cfg, state = read_resume(checkpoint_bytes(path, "--resume"), overrides,
                             source=f"--resume {os.fspath(path)}")
    preflight(cfg)
    return cfg, state


def checkpoint_bytes(path: str | os.PathLike, flag: str) -> bytes:
    """The bytes of the checkpoint file that `flag` names; CheckpointError naming the flag
    and the file where it cannot be read (missing, a folder, not readable)."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise checkpoint.CheckpointError(
            f"{flag} {os.fspath(path)}: cannot read it ({exc.strerror or exc})") from None


class NothingToTrainError(ConfigError):
    """A checkpoint at or past the step its run (as resumed) ends at."""


def read_resume(
    data: bytes, overrides: dict, more: str = "give --steps above {step}", source: str = ""
) -> tuple[RunConfig, checkpoint.CheckpointState]:
    """The checkpoint `data` and the config to continue it with: the checkpoint's own config,
    then the explicit `overrides`. Raises CheckpointError (nothing loaded) for a bad file or
    one that does not fit the model the config describes, naming `source` (the flag and
    file: "--resume run.pt") and the overrides that changed its model, and
    NothingToTrainError, saying `more` (how to ask for more steps where the caller is: a
    flag, a form), for a finished run."""
    with checkpoint_named(source):
        return _read_resume(data, overrides, more)


@contextlib.contextmanager
def checkpoint_named(source: str) -> Iterator[None]:
    """A CheckpointError of the block names `source`, the flag and file it came from
    ("--resume run.pt"; "": as it is): the error named only what was wrong in the file."""
    try:
        yield
    except checkpoint.CheckpointError as exc:
        if not source:
            raise
        raise checkpoint.CheckpointError(f"{source}: {exc}") from None


def _read_resume(
    data: bytes, overrides: dict, more: str
) -> tuple[RunConfig, checkpoint.CheckpointState]:
    stored = checkpoint.load_checkpoint(data)
    config = {k: v for k, v in stored.config.items() if k not in ("vocab", "schedule")}
    try:
        stored_outer = RunConfig.from_dict(config).outer
    except ValueError as exc:
        raise checkpoint.CheckpointError(f"checkpoint config is not valid: {exc}") from exc
    every = overrides.get("sync_every", config.get("sync_every", 1))
    valid = isinstance(every, int) and not isinstance(every, bool) and every >= 1
    if valid and (every > 1) != stored_outer:  # Adam's moments are not an outer momentum,
        raise ConfigError(  # nor back; said before the switch's other flags are judged
            f"the checkpoint is of a {'--sync-every' if stored_outer else 'per-step'} run and "
            f"cannot continue as a {'per-step' if stored_outer else '--sync-every'} run (its "
            "optimizer state is of the other kind); "
            + ("drop --sync-every 1: a resume keeps the checkpoint's own H" if stored_outer
               else "drop --sync-every, or start a --sync-every run afresh"))
    try:
        cfg = RunConfig.from_dict({**config, **overrides})
        check_outer_given(overrides, cfg)
    except ValueError as exc:  # the checkpoint's own config is valid (above): the flags are not
        raise ConfigError(f"the flags given with --resume do not fit its run: {exc}") from exc
    try:
        ckpt = checkpoint.load_checkpoint(data, expect=checkpoint_expectations(cfg))
    except checkpoint.CheckpointError as exc:  # a flag that changed the model's shape
        changed = [f"--{name.replace('_', '-')} {value} (the checkpoint's run has "
                   f"{config[name]!r})" for name, value in overrides.items()
                   if name in config and config[name] != value
                   and _reshapes(config, name, value)]
        if not changed:
            raise
        raise checkpoint.CheckpointError(
            f"{', '.join(changed)}: the checkpoint's model does not fit that run ({exc}); a "
            "resumed run keeps its model's shape: drop the flag") from None
    if cfg.steps <= ckpt.step:  # checked once the file is known to fit the model
        raise NothingToTrainError(f"the checkpoint is at step {ckpt.step} and the run ends at "
                                  f"step {cfg.steps}: nothing to train "
                                  f"({more.format(step=ckpt.step)})")
    return cfg, ckpt


def _reshapes(config: dict, name: str, value: Any) -> bool:
    """Whether setting `name` to `value` alone gives the checkpoint's run other parameter
    shapes (or no valid model at all)."""
    try:
        ours = checkpoint_expectations(RunConfig.from_dict(config))
        theirs = checkpoint_expectations(RunConfig.from_dict({**config, name: value}))
    except (ValueError, DaisyError):
        return True
    return ours != theirs


def checkpoint_expectations(cfg: RunConfig) -> dict:
    task = load_task(cfg.task)
    expect = {"task": cfg.task, "param_shapes": task.build_model(cfg, None).param_shapes()}
    vocab = getattr(task, "vocab", None)
    if vocab is not None:
        expect["vocab"] = vocab
    return expect


def write_atomically(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so a crash leaves either the old file or the new one.
    OutputError (naming `path`, no temporary file left behind) if it cannot."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    except BaseException as exc:  # a full disk, or a second Ctrl-C mid-write: no stray file
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
