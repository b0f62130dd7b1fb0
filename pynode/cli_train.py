"""`python -m pynode train`: one peer, or several local peers over the loopback transport."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

from pynode.config import ConfigError, RunConfig
from pynode.session import build_trainer, checkpoint_bytes, load_resume, write_atomically
from pynode.trainer import StepResult, Trainer


def gemm_summary(gemm) -> str:
    """GEMM backend(s) and kernels of a run, for its header line."""
    if gemm is None:
        return "float (torch)"
    from pynode.gemm_tuning import summary

    return f"{summary(gemm)}  kernels {gemm.kernels.name}"


def parse_capacity(text: str | None, peers: int) -> dict[int, float] | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError as exc:
        raise ConfigError(f"--capacity must be numbers like 1,2,5, got {text!r}") from exc
    if len(values) != peers or any(v <= 0 for v in values):
        raise ConfigError(f"--capacity needs {peers} positive numbers, got {text!r}")
    return dict(enumerate(values))


class StepReporter:
    """Progress bar on a terminal, JSON lines to --log, nothing else."""

    def __init__(self, trainer: Trainer, until: int, log_path: str | None, progress: bool):
        self.trainer = trainer
        self.log_file = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115
        self.bar = None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=until, initial=trainer.state.step, unit="step", file=sys.stderr)

    def __call__(self, result: StepResult) -> None:
        if self.log_file is not None:
            row = {"step": result.step, "loss": result.loss, "hash": result.hash,
                   "probe": result.probe, "seconds": round(result.seconds, 4)}
            self.log_file.write(json.dumps(row) + "\n")
            self.log_file.flush()
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{result.loss:.4f}", hash=result.hash[:12])

    def close(self) -> None:
        if self.log_file is not None:
            self.log_file.close()
        if self.bar is not None:
            self.bar.close()


async def train_command(args: argparse.Namespace, cfg: RunConfig) -> int:
    if args.peers != 1:
        from pynode.cli_group import train_local_peers

        return await train_local_peers(args, cfg, parse_capacity(args.capacity, args.peers))
    resume = None
    if args.resume:
        cfg, resume = load_resume(args.resume, explicit_config(args))
    if args.save:
        check_writable(args.save)
    if args.save_every is not None and (args.save_every < 1 or not args.save):
        raise ConfigError("--save-every needs --save and a positive number of steps")
    trainer = build_trainer(cfg, backend=args.backend, resume=resume)
    print(f"task {cfg.task}  backend {gemm_summary(trainer.gemm)}  "
          f"params {sum(p.size for p in trainer.state.params.values()):,}  "
          f"from step {trainer.state.step}", file=sys.stderr)
    reporter = StepReporter(trainer, cfg.steps, args.log, progress=not args.no_progress)
    started = time.perf_counter()
    last = None
    try:
        while trainer.state.step < cfg.steps:
            last = await trainer.step()
            reporter(last)
            if args.save and args.save_every and last.step % args.save_every == 0:
                write_atomically(args.save, checkpoint_bytes(trainer))
    finally:
        reporter.close()
    elapsed = time.perf_counter() - started
    if args.save:
        write_atomically(args.save, checkpoint_bytes(trainer))
    if args.summary:
        from pynode.cli_group import write_summary

        write_summary(args.summary, trainer, 1)
    print_summary(trainer, last, elapsed)
    print(trainer.state.hash())
    return 0


def explicit_config(args: argparse.Namespace) -> dict:
    """Config flags the user actually gave (the rest come from a resumed checkpoint)."""
    names = [f.name for f in fields(RunConfig)]
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def check_writable(path: str) -> None:
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise ConfigError(f"--save: folder {parent} does not exist")


def print_summary(
    trainer: Trainer, last: StepResult | None, elapsed: float, local_units: bool = True
) -> None:
    if last is not None:
        print(f"step {last.step}  loss {last.loss:.4f}  {elapsed:.1f}s", file=sys.stderr)
    units = getattr(trainer, "units", None)
    if units is not None and local_units:
        counts = units.counts.snapshot()
        pretty = "  ".join(f"{k} {v:,}" for k, v in counts.items())
        print(f"unit invocations: {pretty}", file=sys.stderr)
