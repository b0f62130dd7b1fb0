"""`python -m pynode train`: one peer, or several local peers over the loopback transport."""

from __future__ import annotations

import argparse
import sys
import time

from pynode import platform
from pynode.cli.dashboard import StatusReporter, register
from pynode.cli.faults import install_fault
from pynode.cli.flags import (
    check_output_flags,
    config_from_values,
    explicit_config,
    parse_capacity,
    resume_line,
    resume_notes,
    unsaved_note,
)
from pynode.cli.generate import check_train_sample_flags, print_train_sample
from pynode.cli.report import (
    Saver,
    StepReporter,
    echo,
    final_status,
    print_summary,
    run_header,
    stop_reason,
    write_summary,
)
from pynode.config import ConfigError, RunConfig
from pynode.core.checkpoint import CheckpointState
from pynode.run.assemble import build_trainer, checkpoint_bytes, read_resume
from pynode.run.loop import train
from pynode.run.schedule import check_reached, read_schedule, replay
from pynode.tasks import load_task


def check_sync_every_flags(args: argparse.Namespace, cfg: RunConfig, changes: list,
                           start: int = 0) -> None:
    """ConfigError for what a --sync-every H run never reaches: states (checkpoints,
    schedule changes) exist only at outer-step boundaries, every H steps from the step the
    run starts at (`start`: 0, or the checkpoint's step; a run whose --steps H does not
    divide ends on a shorter outer step, and one resumed there goes on from that step)."""
    every = cfg.sync_every
    if every == 1:
        return
    if args.save_every is not None and args.save_every % every:
        raise ConfigError(f"--save-every {args.save_every}: a --sync-every {every} run has "
                          f"states only every {every} steps; give a multiple of {every}")
    off = [c.step for c in changes if c.step > start and (c.step - start) % every]
    if off:
        where = f"multiples of {every}" if start == 0 else \
            f"step {start} plus multiples of {every} ({start + every}, {start + 2 * every}, ...)"
        raise ConfigError(f"--schedule: a --sync-every {every} run changes only at its outer "
                          f"steps' boundaries, {where}; steps {off} are not")


def run_config(args: argparse.Namespace) -> tuple[RunConfig, CheckpointState | None, bytes]:
    """The run's config, the checkpoint it continues (None) and that file's bytes. Without
    --resume: the flags given, over the defaults. With it: the checkpoint's config with the
    flags given over it, checked together (a flag is judged against the run it changes,
    never against the defaults), and the checkpoint read and checked before any peer
    starts."""
    given = explicit_config(args)  # --data FILE: its sha256, computed once
    if not args.resume:
        return config_from_values(given), None, b""
    data = checkpoint_bytes(args.resume, "--resume")
    cfg, resume = read_resume(data, given, source=f"--resume {args.resume}")
    # said first: the header's "from step S" alone did not say the run was resumed
    print(resume_line(args.resume, resume, cfg.steps), file=sys.stderr)
    for note in [*resume_notes(resume.config, resume.step, given), unsaved_note(args)]:
        if note:
            print(note, file=sys.stderr)
    return cfg, resume, data


async def train_command(args: argparse.Namespace) -> int:
    check_output_flags(args)
    cfg, resume, data = run_config(args)
    load_task(cfg.task)  # a task's own extras, before any peer starts
    check_train_sample_flags(args, cfg)
    if args.capacity is not None and args.peers == 1:
        raise ConfigError("--capacity sets the relative speeds of local peers: it needs "
                          "--peers N with N > 1 (one peer computes every microbatch)")
    changes = read_schedule(args.schedule) if args.schedule else []
    start = resume.step if resume is not None else 0
    check_reached(changes, cfg.steps, start)
    check_sync_every_flags(args, cfg, changes, start)
    if args.peers != 1:
        if changes:
            raise ConfigError("--schedule replays a run's changes on one peer (the same bits "
                              "as any group): drop --peers")
        from pynode.cli.group import train_local_peers

        return await train_local_peers(args, cfg, parse_capacity(args.capacity, args.peers),
                                       resumed=data if resume is not None else None)
    platform.pin_to_core(0)
    dashboard = register(args.dashboard, "train", 1) if args.dashboard else None
    if dashboard is not None:
        echo(dashboard.card_line())
    trainer = build_trainer(cfg, resume=resume, backend=args.backend,
                            kernels=args.kernels, check_products=args.check_products)
    install_fault(trainer)
    echo(run_header(trainer))
    reporter = StepReporter(trainer, cfg.steps, args.log, progress=not args.no_progress)
    saver = Saver(args.save, args.save_every, log=args.log, owns_state=True)
    hooks = [reporter, saver.hook(trainer)]
    status = StatusReporter(dashboard, 0) if dashboard else None
    if status is not None:
        status.attach(trainer)
        hooks.append(status)
    started = time.perf_counter()
    try:
        last = await train(trainer, before_step=(replay(changes),), on_step=hooks)
    except BaseException as exc:  # refused mid-run (bad data, a non-finite step), or
        reporter.close()          # interrupted: keep what was agreed
        if status is not None:
            status.finish("stopped", stop_reason(exc))
        saver.tell_last_agreed()
        raise
    finally:
        reporter.close()
    if status is not None:
        status.finish("finished")
    print(final_status(0, trainer, "finished"), file=sys.stderr)
    elapsed = time.perf_counter() - started
    saved = saver.final(trainer)
    if saved:  # a stop says where its state went; so does a finished run
        print(saved, file=sys.stderr)
    if args.summary:
        write_summary(args.summary, trainer, 1, None)
    print_summary(trainer, last, elapsed)
    print_train_sample(args, trainer)
    print(trainer.state.hash())
    return 0
