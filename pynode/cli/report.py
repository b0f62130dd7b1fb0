"""What the commands show and write: progress, step logs, summaries, checkpoints."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pynode import datafile
from pynode.cli.signals import terminated
from pynode.config import RunConfig
from pynode.core.errors import DaisyError
from pynode.run.assemble import write_atomically
from pynode.run.trainer import StepResult, Trainer


def plain(line: str) -> None:
    """A line on stderr as it is: the last lines of a command whose lines carry no time
    (`say` is for those that do), said after any progress bar is closed."""
    print(line, file=sys.stderr)


def say(text: str) -> None:
    """A line for the person at the terminal (above the progress bar, if one is drawn)."""
    echo(f"{time.strftime('%H:%M:%S')} {text}")


def name_rank_in_logs(rank: int) -> None:
    """Prefix this process's log lines with its group rank (a group's ranks share stderr),
    after the time where they carry it (pynode.cli.main.STAMPED_COMMANDS)."""
    for handler in logging.getLogger().handlers:
        old = handler.formatter
        timed = old is not None and old.usesTime()
        handler.setFormatter(logging.Formatter(
            ("%(asctime)s " if timed else "") + f"rank {rank}: %(levelname)s %(name)s: "
            "%(message)s", datefmt=old.datefmt if old is not None else None))


def echo(text: str) -> None:
    """Lines of a run's report, above its progress bar if one is drawn. The text and its
    newline go in one call, so lines of several lines leave in one write too
    (pynode.cli.main.whole_lines)."""
    try:
        from tqdm import tqdm

        tqdm.write(text + "\n", file=sys.stderr, end="")
    except ImportError:
        print(text + "\n", file=sys.stderr, end="", flush=True)


class ReportHandler(logging.Handler):
    """Log records as report lines (echo): above the progress bar, not glued onto it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            echo(self.format(record))
        except Exception:
            self.handleError(record)


def gemm_summary(gemm: Any) -> str:
    """GEMM backend(s) and kernels of a run, for its header line."""
    if gemm is None:
        return "float (torch)"
    from pynode.gemm_tuning import summary

    return f"{summary(gemm)}  kernels {gemm.kernels.name}"


def run_header(trainer: Trainer) -> str:
    """The first line a run prints: task, arithmetic, size and starting step."""
    params = sum(p.size for p in trainer.state.params.values())
    cfg = trainer.cfg
    left = cfg.steps - trainer.state.step
    outer = (f"  sync every {cfg.sync_every} steps over {cfg.replicas} "
             f"replica{'s' if cfg.replicas != 1 else ''}"
             + (f" (one outer step: the run has {left} step{'s' if left != 1 else ''} left)"
                if cfg.sync_every > left > 0 else "")
             + ("  (no cross-peer checks: not yet in outer steps)" if cfg.cross_check else "")
             if cfg.outer else "")
    return (f"task {cfg.task}  backend {gemm_summary(trainer.gemm)}  "
            f"params {params:,}  from step {trainer.state.step}{data_note(cfg)}{outer}"
            f"{warmup_note(cfg)}" + (f"  ({note})" if (note := clip_note(cfg)) else ""))


def data_note(cfg: RunConfig) -> str:
    """For the header: the text a run trains on, where it is not the built-in corpus (a
    file's path, a server's address), so that a wrong file is seen at once."""
    if cfg.data == "builtin":
        return ""
    if datafile.is_file_spec(cfg.data):
        return f"  data {datafile.split_spec(cfg.data)[0]}"
    return f"  data {cfg.data.partition('#')[0]}"


DEFAULT_WARMUP = RunConfig().warmup


def warmup_note(cfg: RunConfig) -> str:
    """For the header: a --warmup longer than the run, which is legal but rarely meant (the
    learning rate never reaches --lr). The default warm-up in a short trial run is not
    said: `train --steps 5` is a common first command, and its rate is not what it is for."""
    if cfg.warmup <= cfg.steps or cfg.warmup == DEFAULT_WARMUP:
        return ""
    return (f"  (--warmup {cfg.warmup} is longer than the run's {cfg.steps} steps: the "
            f"learning rate rises to {100 * cfg.steps / cfg.warmup:.2g}% of --lr, never to it)")


def clip_note(cfg: RunConfig) -> str:
    """For the header: --clip 0, which turns the clip off (legal, and read as a norm of 0 by
    some: that would stop every step)."""
    if cfg.clip:
        return ""
    return "--clip 0 turns the gradient-norm clip off: the gradients are not clipped at all"


def stop_reason(exc: BaseException) -> str:
    """Why a run stopped, for its status line and the dashboard."""
    if isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):  # Ctrl-C (asyncio.run)
        return "terminated (SIGTERM)" if terminated() else "interrupted (Ctrl-C)"
    return f"{type(exc).__name__}: {exc}"


def last_logged_step(path: str) -> int | None:
    """The step of a --log file's last row (None: no file, no row, not a log)."""
    if not os.path.isfile(path):  # /dev/stdout, a pipe: nothing to read back
        return None
    try:
        with open(path, "rb") as log:
            log.seek(0, 2)
            log.seek(max(0, log.tell() - 65536))
            lines = log.read().splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


# Where stderr is no terminal (nohup, a service, a CI log) a run's progress is a plain line
# this often, instead of the bar's redraws
PLAIN_EVERY_S = 30.0


class StepReporter:
    """Progress bar on a terminal (a plain line every PLAIN_EVERY_S elsewhere), JSON lines
    to --log, nothing else. A loop hook."""

    def __init__(self, trainer: Trainer, until: int, log_path: str | None, progress: bool):
        self.trainer = trainer
        self.started = time.perf_counter()
        self.elapsed = 0.0  # seconds from here to the end of the last step reported
        logged = last_logged_step(log_path) if log_path else None
        if logged is not None and logged > trainer.state.step:  # a resume from an older save
            echo(f"note: {log_path} already has rows up to step {logged}; this run's steps "
                 f"{trainer.state.step + 1} on are appended after them (for each step, the "
                 "last row is this run's)")
        self.log_file = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115
        self.bar = None
        self.until = until
        # no terminal: a run redirected to a file said nothing from its first line to its end
        self.plain_at = self.started + PLAIN_EVERY_S if progress else None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            self.plain_at = None
            self.bar = tqdm(total=until, initial=trainer.state.step, unit="step", file=sys.stderr)
            trainer.after_inner.append(self.inner)  # --sync-every: inside an outer step
        self.plain_from = (self.started, trainer.state.step)  # the last plain line's

    def __call__(self, result: StepResult) -> None:
        self.elapsed = time.perf_counter() - self.started
        if self.log_file is not None:
            row = {"step": result.step, "loss": result.loss, "hash": result.hash,
                   "probe": result.probe, "seconds": round(result.seconds, 4)}
            if result.heldout is not None:
                row["heldout"] = result.heldout
            if result.change is not None:
                row["change"] = result.change
            self.log_file.write(json.dumps(row) + "\n")
            self.log_file.flush()
        if self.bar is not None:
            self.bar.update(result.step - self.bar.n)  # an outer step: what inner() has not
            self.bar.set_postfix(loss=f"{result.loss:.4f}", hash=result.hash[:12])
        now = time.perf_counter()
        if self.plain_at is not None and now >= self.plain_at:
            began, first = self.plain_from
            rate = (result.step - first) / max(now - began, 1e-9)
            say(f"step {result.step}/{self.until}  loss {result.loss:.4f}  {rate:.2f} steps/s  "
                f"hash {result.hash[:12]}")
            self.plain_at, self.plain_from = now + PLAIN_EVERY_S, (now, result.step)
        if result.heldout is not None:
            echo(f"step {result.step}  held-out loss {result.heldout:.4f}")

    def inner(self, replica: int, step: int) -> None:
        """A --sync-every hook: the bar shows the furthest inner step this peer has taken
        (replicas run one after another, so it may wait at an outer step's end)."""
        if self.bar is not None and step > self.bar.n:
            self.bar.update(step - self.bar.n)

    def close(self) -> None:
        if self.log_file is not None:
            self.log_file.close()
        if self.bar is not None:
            self.bar.close()


class Saver:
    """--save and --save-every of one run: keeps the state of the last step every peer
    agreed on, so a run that stops can still leave it behind. `tell` says its lines after
    a stop: stderr as they are, or `say` for a command whose lines carry the time (join)."""

    def __init__(self, path: str | None, every: int | None,
                 tell: Callable[[str], None] | None = None, log: str | None = None,
                 owns_state: bool = False) -> None:
        self.path, self.every, self.log = path, every, log  # log: the run's --log, if any
        # the run's state is here alone (train, a cluster's rank 0), not also in a room's
        # other peers: a stop without --save says it is lost
        self.owns_state = owns_state
        self.tell = tell or plain
        self.agreed: bytes | None = None
        self.agreed_step = 0

    def hook(self, trainer: Trainer) -> Any:
        """The loop hook (on_step) of `trainer`'s run. --save-every N writes at the first
        state at or past each multiple of N: every N-th step of a per-step run, and the
        outer boundary that reaches it in a --sync-every run, whose boundaries fall off the
        multiples of H once a run resumed from a short last outer step (step 20 of H = 8:
        28, 36, ..., none of which N = 8 divides, so nothing was ever written)."""
        previous = trainer.state.step

        def on_step(result: StepResult) -> None:
            nonlocal previous
            self.agreed_step = result.step  # without --save too: a stop says what is lost
            if not self.path:
                return
            self.agreed = trainer.state_bytes()
            if self.every and result.step // self.every > previous // self.every:
                write_atomically(self.path, self.agreed)
            previous = result.step

        return on_step

    def final(self, trainer: Trainer) -> str | None:
        """Write the state at the end of the run; the line to tell, if anything was saved."""
        if not self.path:
            return None
        write_atomically(self.path, trainer.state_bytes())
        return f"saved the state (step {trainer.state.step}) to {self.path}"

    def last_agreed(self) -> str | None:
        """After a stop: write the last agreed state; the line to tell, if there was one."""
        if not self.path or self.agreed is None:
            return None
        write_atomically(self.path, self.agreed)
        return (f"saved the last agreed state (step {self.agreed_step}) to {self.path}: "
                f"{self.resume_flags()} goes on from there")

    def resume_flags(self) -> str:
        """The flags that go on from the saved state and keep writing where this run did:
        `--resume F` alone left the state the resumed run reaches unsaved, and its log rows
        unwritten (a newcomer trial)."""
        flags = f"--resume {self.path} --save {self.path}"
        return f"{flags} --log {self.log}" if self.log else flags

    def tell_last_agreed(self) -> bool:
        """After a stop (an error, an interrupt): write the last agreed state and say so;
        whether it was written. A write that fails says why, and leaves the stop's own
        error to be told."""
        if self.path and self.agreed is None:  # the docs promise a stop says where --save is
            self.tell(f"no step was agreed before the stop: nothing saved to {self.path}")
            return False
        if not self.path:  # a Ctrl-C said only "interrupted" after an hour of training
            if self.agreed_step and self.owns_state:
                self.tell(f"no --save: the state this run reached (step {self.agreed_step}) "
                          "is not kept")
            return False
        written = False
        try:
            saved = self.last_agreed()
            written = saved is not None
        except DaisyError as exc:
            saved = f"the last agreed state (step {self.agreed_step}) was not saved: {exc}"
        if saved:
            self.tell(saved)
        return written


def print_summary(trainer: Trainer, last: StepResult | None, elapsed: float,
                  local_units: bool = True) -> None:
    if last is not None:
        print(f"step {last.step}  loss {last.loss:.4f}  {elapsed:.2f}s", file=sys.stderr)
    if trainer.units is not None and local_units:
        counts = trainer.units.counts.snapshot()
        pretty = "  ".join(f"{k} {v:,}" for k, v in counts.items())
        print(f"unit invocations: {pretty}", file=sys.stderr)


def final_status(rank: int, trainer: Trainer | None, state: str, reason: str = "",
                 collective: Any = None) -> str:
    """The one line every rank prints at the end: how its run ended, where, and its part."""
    head = f"rank {rank}: {state}" + (f": {reason}" if reason else "")
    if trainer is None:
        return head + " (before the first step)"
    part = (f"step {trainer.state.step}/{trainer.cfg.steps}, state hash "
            f"{trainer.state.hash()[:16]}, microbatch {1000 * trainer.microbatch_seconds:.0f} ms")
    if collective is not None:
        part += f", sent {collective.bytes_sent / 1e6:.2f} MB"
    return f"{head} ({part})"


def write_summary(path: str, trainer: Trainer, peers: int, traffic: dict | None,
                  timings: dict[str, dict[int, Any]] | None = None) -> None:
    """The run's end as JSON: final hash and step, peers, traffic, and by rank where its
    steps went (StepClock.timings: the milliseconds per step in each phase of all its steps
    but the first, with their count, and each such step's milliseconds, whether it had a
    check round and the share of steps with one); this trainer's alone where `timings` is
    not given."""
    if timings is None:
        timings = {key: {0: value} for key, value in trainer.clock.timings().items()}
    summary = {"hash": trainer.state.hash(), "step": trainer.state.step, "peers": peers,
               "traffic": traffic, **timings, "phase_timed_steps": trainer.clock.timed_steps}
    Path(path).write_text(json.dumps(summary, sort_keys=True) + "\n", encoding="utf-8")
