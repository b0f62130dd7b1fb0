"""`train --peers N` (loopback processes on this machine) and `cluster` (gloo across machines).

Rank 0 is the leader: it prints the plan, the per-step progress and the final hash, writes
--log and --save. Other ranks are quiet. When a gloo member dies the group cannot go on:
the survivors stop within the collective's deadline and rank 0 (or the lowest surviving
rank) writes a checkpoint of the last step everybody agreed on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pynode import platform
from pynode.cli_train import StepReporter, explicit_config, print_summary
from pynode.comm import CommError, make_collective
from pynode.config import ConfigError, RunConfig
from pynode.core.errors import DaisyError
from pynode.group import run_member
from pynode.session import checkpoint_bytes, load_resume, write_atomically
from pynode.trainer import ForkError, Trainer

# Test hook, read only by the CLI: "RANK:STEP:KIND" makes rank RANK misbehave at STEP.
# KIND: kill (SIGKILL itself while computing), flip (flip one weight bit after the update),
# nan (a NaN gradient), stall (stop answering).
FAULT_ENV = "PYNODE_FAULT"


def install_fault(trainer: Trainer, rank: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    fault_rank, fault_step, kind = spec.split(":")
    if int(fault_rank) != rank:
        return
    at = int(fault_step)
    if kind == "flip":
        def flip(t: Trainer) -> None:
            if t.state.step == at:
                name = next(iter(t.state.params))
                t.state.params[name].reshape(-1).view(np.uint32)[0] ^= 1
        trainer.fault_hook = flip
        return
    original = trainer.microbatch_partial

    def faulty(indices):
        if trainer.state.step + 1 == at and indices:
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "stall":
                import time

                time.sleep(3600)
            if kind == "nan":
                trainer.state.params[next(iter(trainer.state.params))].reshape(-1)[0] = np.nan
        return original(indices)

    trainer.microbatch_partial = faulty


async def lead(args: argparse.Namespace, cfg: RunConfig, collective, capacities) -> int:
    """Rank 0's side: everything the user sees."""
    pin_to_core(0)
    resume = None
    if args.resume:
        cfg, _ = load_resume(args.resume, explicit_config(args))
        resume = Path(args.resume).read_bytes()
    reporter: StepReporter | None = None
    last = {"trainer": None, "result": None, "agreed": None}

    def on_step(trainer: Trainer, result) -> None:
        nonlocal reporter
        if reporter is None:
            reporter = StepReporter(trainer, cfg.steps, args.log, not args.no_progress)
        reporter(result)
        last["result"] = result
        last["agreed"] = checkpoint_bytes(trainer) if args.save else None
        every = getattr(args, "save_every", None)
        if every and result.step % every == 0:
            write_atomically(args.save, last["agreed"])

    def prepare(trainer: Trainer) -> None:
        last["trainer"] = trainer
        # `cluster --timeout` bounds how long a rank waits for the others during training too
        trainer.min_deadline = getattr(args, "timeout", trainer.min_deadline)
        install_fault(trainer, 0)

    try:
        trainer = await run_member(
            collective, cfg, resume=resume, backend=args.backend, capacities=capacities,
            on_step=on_step, report=lambda line: print(line, file=sys.stderr), prepare=prepare,
        )
    except (CommError, ForkError) as exc:
        print(f"error: the group stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
        if args.save and last["agreed"] is not None:
            write_atomically(args.save, last["agreed"])
            step = last["result"].step
            print(f"saved the last agreed state (step {step}) to {args.save}", file=sys.stderr)
        return 3
    finally:
        if reporter is not None:
            reporter.close()
    if args.save:
        write_atomically(args.save, checkpoint_bytes(trainer))
    if getattr(args, "summary", None):
        write_summary(args.summary, trainer, collective.world_size)
    print_summary(trainer, last["result"], 0.0, local_units=False)
    print(trainer.state.hash())
    return 0


def write_summary(path: str, trainer: Trainer, peers: int) -> None:
    summary = {"hash": trainer.state.hash(), "step": trainer.state.step, "peers": peers,
               "traffic": getattr(trainer, "traffic", None)}
    Path(path).write_text(json.dumps(summary, sort_keys=True) + "\n", encoding="utf-8")


def pin_to_core(rank: int) -> None:
    """With PYNODE_PIN_CORES=1 each rank runs on core `rank` only (benchmarks)."""
    if os.environ.get("PYNODE_PIN_CORES") == "1" and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})


async def follow(collective, backend: str | None, capacities, timeout: float | None = None) -> int:
    rank = collective.rank
    pin_to_core(rank)

    def prepare(trainer: Trainer) -> None:
        if timeout is not None:
            trainer.min_deadline = timeout
        install_fault(trainer, rank)

    try:
        await run_member(collective, None, backend=backend, capacities=capacities,
                         report=lambda line: None, prepare=prepare)
    except DaisyError as exc:
        print(f"rank {rank}: stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    return 0


async def train_local_peers(args, cfg: RunConfig, capacities) -> int:
    """Rank 0 in this process, ranks 1..N-1 as child processes over a Unix socket."""
    if args.peers < 1:
        raise ConfigError(f"--peers must be >= 1, got {args.peers}")
    with tempfile.TemporaryDirectory(prefix="pynode-") as tmp:
        address = str(Path(tmp) / "hub.sock")
        children = [spawn_peer(rank, args.peers, address, args) for rank in range(1, args.peers)]
        try:
            collective = await make_collective(
                "loopback", rank=0, world_size=args.peers, address=address, timeout=60.0
            )
            try:
                return await lead(args, cfg, collective, capacities)
            finally:
                await collective.close()
        finally:
            for child in children:
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()


def spawn_peer(rank: int, world: int, address: str, args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pynode", "_peer", "--rank", str(rank), "--world", str(world),
           "--address", address]
    if args.backend:
        cmd += ["--backend", args.backend]
    if args.capacity:
        cmd += ["--capacity", args.capacity]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=threads_per_peer(world))


def threads_per_peer(peers: int) -> dict[str, str]:
    """Split this machine's cores between the local peers: a BLAS pool per process that
    wants every core makes N processes on N cores wait on each other at every GEMM."""
    share = str(max(1, platform.cpu_count() // peers))
    env = dict(os.environ)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, share)
    return env


async def peer_command(args) -> int:
    """Hidden `_peer` subcommand: one loopback follower process."""
    from pynode.cli_train import parse_capacity

    collective = await make_collective(
        "loopback", rank=args.rank, world_size=args.world, address=args.address, timeout=60.0
    )
    try:
        return await follow(collective, args.backend, parse_capacity(args.capacity, args.world))
    finally:
        await collective.close()


async def cluster_command(args, cfg: RunConfig) -> int:
    """gloo group from MASTER_ADDR / MASTER_PORT / WORLD_SIZE / RANK."""
    from pynode.cli_train import parse_capacity

    collective = await make_collective("gloo", timeout=args.timeout)
    capacities = parse_capacity(args.capacity, collective.world_size)
    try:
        if collective.rank == 0:
            return await lead(args, cfg, collective, capacities)
        return await follow(collective, args.backend, capacities, timeout=args.timeout)
    finally:
        await asyncio.shield(collective.close())
