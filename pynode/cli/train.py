"""`python -m pynode train`: one peer, or several local peers over the loopback transport."""

from __future__ import annotations

import argparse
import sys
import time

from pynode.cli.faults import install_fault
from pynode.cli.flags import check_output_flags, explicit_config, parse_capacity
from pynode.cli.generate import check_train_sample_flags, print_train_sample
from pynode.cli.report import Saver, StepReporter, print_summary, run_header, write_summary
from pynode.config import ConfigError, RunConfig
from pynode.run.assemble import build_trainer, load_resume
from pynode.run.loop import train


async def train_command(args: argparse.Namespace, cfg: RunConfig) -> int:
    check_output_flags(args)
    check_train_sample_flags(args, cfg)
    if args.capacity is not None and args.peers == 1:
        raise ConfigError("--capacity sets the relative speeds of local peers: it needs "
                          "--peers N with N > 1 (one peer computes every microbatch)")
    if args.peers != 1:
        from pynode.cli.group import train_local_peers

        return await train_local_peers(args, cfg, parse_capacity(args.capacity, args.peers))
    resume = None
    if args.resume:
        cfg, resume = load_resume(args.resume, explicit_config(args))
    trainer = build_trainer(cfg, resume=resume, backend=args.backend,
                            kernels=args.kernels, check_products=args.check_products)
    install_fault(trainer)
    print(run_header(trainer), file=sys.stderr)
    reporter = StepReporter(trainer, cfg.steps, args.log, progress=not args.no_progress)
    saver = Saver(args.save, args.save_every)
    started = time.perf_counter()
    try:
        last = await train(trainer, on_step=(reporter, saver.hook(trainer)))
    finally:
        reporter.close()
    elapsed = time.perf_counter() - started
    saver.final(trainer)
    if args.summary:
        write_summary(args.summary, trainer, 1, None)
    print_summary(trainer, last, elapsed)
    print_train_sample(args, trainer)
    print(trainer.state.hash())
    return 0
