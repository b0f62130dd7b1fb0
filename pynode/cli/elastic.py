"""`cluster --elastic MIN:MAX`: the cluster under torchrun's elastic agent, which restarts
every rank when one is lost and resumes from the last checkpoint the ranks agreed on.

On each machine, `python -m pynode cluster --elastic MIN:MAX --rdzv HOST:PORT ...` runs
torchrun's agent (torch.distributed.launcher, c10d rendezvous at HOST:PORT, the agent
store) with --nproc ranks of `python -m pynode cluster ...` (the same flags). A rank that
dies makes the agents stop and restart every rank (at most --max-restarts times); the new
group, of MIN to MAX machines, resumes from the newest checkpoint a rank holds
(pynode.run.elastic). Ranks under any torchrun (also one started by hand) do the same.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pynode.cli.flags import check_output_flags, explicit_config
from pynode.cli.report import Saver, say
from pynode.config import ConfigError, RunConfig
from pynode.core.checkpoint import CheckpointState
from pynode.core.errors import DaisyError
from pynode.extras import require
from pynode.run.assemble import checkpoint_bytes, load_resume, read_resume
from pynode.run.elastic import (
    Offer,
    Resume,
    agree_on_resume,
    clock,
    config_digest,
    describe_previous,
)
from pynode.run.trainer import StepResult, Trainer

DEFAULT_RDZV = "127.0.0.1:29400"
LAUNCHER_FLAGS = {"--elastic": 1, "--rdzv": 1, "--max-restarts": 1, "--nproc": 1,
                  "--rdzv-last-call": 1}


def add_elastic_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--elastic", metavar="MIN:MAX",
                        help="run under torchrun's elastic agent on MIN to MAX machines: a lost "
                        "rank restarts the group from the last agreed checkpoint (needs --save "
                        "and --save-every)")
    parser.add_argument("--rdzv", metavar="HOST:PORT", default=None,
                        help=f"(--elastic) the rendezvous every machine meets at, hosted by the "
                        f"machine whose address it is (default {DEFAULT_RDZV}: this machine only)")
    parser.add_argument("--max-restarts", type=int, default=None, metavar="N",
                        help="(--elastic) restarts of the group before it gives up (default 3)")
    parser.add_argument("--nproc", type=int, default=None, metavar="N",
                        help="(--elastic) ranks on this machine (default 1)")
    parser.add_argument("--rdzv-last-call", type=float, default=None, metavar="S",
                        help="(--elastic) seconds the rendezvous waits for more machines once "
                        "MIN are there (default 30, torchrun's)")


def check_elastic_flags(args: argparse.Namespace) -> tuple[int, int]:
    """(MIN, MAX) of --elastic; ConfigError naming the flag for anything that cannot work."""
    if not args.elastic:
        for flag in ("rdzv", "max_restarts", "nproc", "rdzv_last_call"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} works with --elastic MIN:MAX only")
        return 0, 0
    low, sep, high = args.elastic.partition(":")
    try:
        nodes = (int(low), int(high if sep else low))
    except ValueError:
        raise ConfigError(f"--elastic must be MIN:MAX machines like 1:4, got "
                          f"{args.elastic!r}") from None
    if not 1 <= nodes[0] <= nodes[1]:
        raise ConfigError(f"--elastic needs 1 <= MIN <= MAX, got {args.elastic!r}")
    host, _, port = (args.rdzv or DEFAULT_RDZV).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--rdzv must be HOST:PORT, got {args.rdzv!r}")
    if (args.max_restarts or 0) < 0:
        raise ConfigError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if args.nproc is not None and args.nproc < 1:
        raise ConfigError(f"--nproc (ranks on this machine) must be >= 1, got {args.nproc}")
    if args.rdzv_last_call is not None and not args.rdzv_last_call >= 0:
        raise ConfigError(f"--rdzv-last-call must be >= 0 seconds, got {args.rdzv_last_call}")
    if args.capacity and nodes[0] != nodes[1]:
        raise ConfigError("--capacity gives each rank's speed, and with --elastic MIN:MAX the "
                          "number of ranks may change: leave it out (rank 0 plans from "
                          "measured speeds)")
    if not args.save or not args.save_every:
        raise ConfigError("--elastic needs --save FILE and --save-every N: a restarted group "
                          "resumes from that checkpoint")
    return nodes


def worker_argv(argv: list[str]) -> list[str]:
    """The ranks' own command line: `argv` without the launcher's flags."""
    out, skip = [], 0
    for arg in argv:
        name = arg.split("=", 1)[0]
        if skip:
            skip -= 1
        elif name in LAUNCHER_FLAGS:
            skip = LAUNCHER_FLAGS[name] if "=" not in arg else 0
        else:
            out.append(arg)
    return out


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """--elastic on this machine: torchrun's agent and its ranks, until the run ends."""
    low, high = check_elastic_flags(args)
    check_output_flags(args, lock_log=False)  # its rank 0 writes --log
    if args.resume:  # refused here once, not by every attempt of rank 0
        load_resume(args.resume, explicit_config(args))
    require("cluster --elastic (torchrun's elastic agent)", "torch")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    restarts = 3 if args.max_restarts is None else args.max_restarts
    nproc = args.nproc or 1
    rdzv = args.rdzv or DEFAULT_RDZV
    conf: dict[str, Any] = {}
    if args.rdzv_last_call is not None:
        conf["last_call_timeout"] = args.rdzv_last_call
    config = LaunchConfig(min_nodes=low, max_nodes=high, nproc_per_node=nproc,
                          run_id="daisychain", rdzv_endpoint=rdzv, rdzv_backend="c10d",
                          rdzv_configs=conf, max_restarts=restarts, monitor_interval=0.1,
                          start_method="spawn")
    say(f"elastic cluster: {nproc} rank(s) here, {low} to {high} machines meeting at {rdzv}, "
        f"up to {restarts} restarts from {args.save}")
    try:
        elastic_launch(config, sys.executable)("-m", "pynode", *worker_argv(argv))
    except ChildFailedError as exc:
        failures = ", ".join(f"rank {r} (exit {f.exitcode})" for r, f in exc.failures.items())
        print(f"error: the elastic cluster gave up after {restarts} restarts: {failures} "
              "failed; their last lines above say why", file=sys.stderr)
        return 3
    return 0


class ElasticRank:
    """One rank of a group torchrun may restart: it leaves notes for the next attempt (its
    steps, its goodbye), offers its checkpoint, and rank 0 tells how the restart went."""

    def __init__(self, collective: Any, args: argparse.Namespace) -> None:
        self.collective, self.args = collective, args
        self.rank = collective.rank
        # one writer of --save per machine (rank 0 writes anyway)
        self.saves = self.rank == 0 or os.environ.get("LOCAL_RANK", "0") == "0"
        self.stopped_at: float | None = None  # the previous attempt's first goodbye
        self.reported = False

    def install(self) -> None:
        """Say goodbye in the store when torchrun's agent stops this rank (SIGTERM): only
        the ranks that were lost leave none."""
        def on_term(signum: int, frame: Any) -> None:
            self.farewell("stopped by the agent")
            say(f"rank {self.rank}: stopped by torchrun's agent (a rank failed, or machines "
                "joined or left)")
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)

    def farewell(self, reason: str) -> None:
        self.collective.note("farewell", f"{time.time():.3f} {reason}")

    async def agree(self, cfg: RunConfig | None) -> bytes | None:
        """The checkpoint bytes rank 0 resumes from (None: fresh), after every rank offered
        its newest; rank 0 (`cfg`: its run's config) reports the previous attempt and the
        choice."""
        given = explicit_config(self.args)
        run = cfg
        offers: list[tuple[CheckpointState, bytes]] = []
        if self.rank == 0 and self.args.resume:
            run, ckpt = load_resume(self.args.resume, given)
            offers.append((ckpt, checkpoint_bytes(self.args.resume, "--resume")))
        if self.rank == 0 and not (self.args.save and self.args.save_every):
            say("torchrun may restart this group: without --save and --save-every a restart "
                "begins again from the start (or --resume)")
        save = Path(self.args.save) if self.args.save else None
        if self.collective.restarted and save is not None and save.is_file():
            data = save.read_bytes()
            try:
                _, ckpt = read_resume(data, given)
                offers.append((ckpt, data))
            except (DaisyError, ValueError) as exc:  # a damaged or foreign file: not offered
                say(f"rank {self.rank}: not offering {save}: {type(exc).__name__}: {exc}")
        offer, held = None, None
        if offers:
            ckpt, held = max(offers, key=lambda o: o[0].step)
            offer = Offer(ckpt.step, ckpt.state_hash, config_digest(ckpt.config))
        resume = await agree_on_resume(self.collective, offer, held, run)
        if self.rank == 0:
            self.report(resume)
        return resume.data

    def report(self, resume: Resume) -> None:
        world, farewells = self.collective.previous_notes("farewell")
        if not world:
            return
        _, progress = self.collective.previous_notes("progress")
        line, self.stopped_at = describe_previous(world, farewells, progress)
        where = (f"resuming from step {resume.step} (the checkpoint of rank(s) "
                 f"{', '.join(map(str, resume.holders))})" if resume.data else
                 "no checkpoint of this run: starting from step 0")
        say(f"elastic restart: {line}; "
            f"{where}; the group now has {self.collective.world_size} rank(s)")
        if resume.ignored:
            say(f"elastic restart: the checkpoints of rank(s) {list(resume.ignored)} belong to "
                "another run or are finished; not used")

    def hooks(self, trainer: Trainer) -> list:
        """on_step hooks: the progress note, --save every N steps on followers, and rank 0's
        line on the first step after a restart."""
        hooks: list = [self.on_step]
        if self.rank != 0 and self.saves:
            hooks.append(Saver(self.args.save, self.args.save_every).hook(trainer))
        return hooks

    def on_step(self, result: StepResult) -> None:
        now = time.time()
        self.collective.note("progress", f"{result.step} {now:.3f}")
        if self.rank == 0 and not self.reported and self.stopped_at is not None:
            self.reported = True
            say(f"elastic restart: step {result.step} done {now - self.stopped_at:.1f} s after "
                f"the previous attempt stopped ({clock(self.stopped_at)} -> {clock(now)})")
