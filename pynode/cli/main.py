"""Command line: `python -m pynode {train,generate,kit,verify,bench,cluster,join} ...`."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import select
import signal
import sys
from typing import NoReturn

import pynode
from pynode import platform
from pynode.cli import signals
from pynode.cli.elastic import add_elastic_flags
from pynode.cli.flags import (
    add_arithmetic_flags,
    add_config_flags,
    add_dashboard_flag,
    add_output_flags,
    config_from_args,
    release_logs,
)
from pynode.cli.generate import add_generate_parser, add_train_sample_flags
from pynode.cli.join import add_join_parser
from pynode.cli.kit import add_kit_parser
from pynode.cli.report import ReportHandler, plain, say
from pynode.cli.signals import sigterm_as_interrupt, terminated
from pynode.config import ConfigError
from pynode.core.errors import DaisyError
from pynode.extras import explain


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m pynode", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"pynode {pynode.__version__}")
    # The metavar lists the commands a user runs (the internal `_peer` stays out of help).
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{train,generate,kit,cluster,join,verify,bench}")
    parser.set_defaults(commands=sub.choices)  # name -> its parser, for parse_args

    train = sub.add_parser("train", help="train on this machine (one or more local peers)",
                           description="Train one model on this machine: one peer, or "
                           "--peers N local processes that reduce exactly as a cluster does; "
                           "the final state hash goes to stdout, the report to stderr.")
    add_config_flags(train)
    add_arithmetic_flags(train)
    add_output_flags(train)
    train.add_argument("--resume", help="continue from this .pt checkpoint")
    train.add_argument("--peers", type=int, default=1, help="local peer processes (loopback)")
    train.add_argument("--capacity", help="relative speeds of the local peers, e.g. 1,2,5")
    train.add_argument("--summary", metavar="FILE",
                       help="write a JSON summary here: final hash, traffic, and each rank's "
                       "ms per step in each phase (all steps but the first; a --sync-every "
                       "run's full outer steps)")
    train.add_argument("--schedule", metavar="FILE",
                       help="apply these changes at their steps: a JSON list of {\"step\": S, "
                       "\"lr\": X, \"steps\": N} (a room's live changes, replayed; "
                       "pynode/run/schedule.py)")
    add_dashboard_flag(train)
    add_train_sample_flags(train)

    cluster = sub.add_parser(
        "cluster", help="gloo cluster from MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK",
        description="One rank of a torch.distributed gloo cluster across machines. Every "
        "rank gets the same MASTER_ADDR (rank 0's machine), MASTER_PORT and WORLD_SIZE, and "
        "its own RANK (0 .. WORLD_SIZE-1); rank 0 chooses the run and writes the files.")
    add_config_flags(cluster)
    add_arithmetic_flags(cluster)
    add_output_flags(cluster, who="(rank 0) ")
    cluster.add_argument("--resume", help="(rank 0) continue from this .pt checkpoint")
    cluster.add_argument("--capacity", help="relative speeds of the ranks, e.g. 1,2")
    cluster.add_argument("--timeout", type=float, default=60.0,
                         help="seconds a rank waits for the others before giving up "
                         "(default 60)")
    cluster.add_argument("--summary", help="(rank 0) write a JSON summary here")
    add_dashboard_flag(cluster, who="(rank 0; the other ranks learn it from rank 0) ")
    add_elastic_flags(cluster)

    peer = sub.add_parser("_peer")  # internal: a loopback follower spawned by train --peers
    peer.add_argument("--rank", type=int, required=True)
    peer.add_argument("--world", type=int, required=True)
    peer.add_argument("--address", required=True)
    add_arithmetic_flags(peer)
    peer.add_argument("--capacity")

    add_join_parser(sub)
    add_generate_parser(sub)
    add_kit_parser(sub)

    verify = sub.add_parser("verify", help="check units, LUTs and GEMM backends; exit 1 on failure",
                            description="Check this machine's arithmetic as training uses "
                            "it: the unit networks against their lookup tables, every GEMM "
                            "backend and hot kernel against the reference on right and wrong "
                            "products. One row per check; exit 0 if all pass, 1 if any fails "
                            "(training never uses a backend that fails its gate).")
    verify.add_argument("--json", action="store_true", help="print rows as JSON lines")

    bench = sub.add_parser("bench", help="benchmarks: gemm, train, scaling, mesh-sim, browser, "
                                         "generate")
    bench.add_argument("name", choices=["gemm", "train", "scaling", "mesh-sim", "browser",
                                        "generate"])
    bench.add_argument("args", nargs=argparse.REMAINDER, metavar="...",
                       help="the benchmark's own flags (python -m pynode bench NAME --help)")
    return parser


class CommandParser(argparse.ArgumentParser):
    """The top level's parser: a mistyped command is told with the commands users run
    (argparse would list the internal `_peer` among them)."""

    def error(self, message: str) -> NoReturn:
        super().error(re.sub(r"'?_peer'?, ", "", message))


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed command line. A flag the command does not know is told with that
    command's usage (argparse tells it with the top level's, which lists no flag)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        hints = [OTHER_FLAGS[flag.split("=")[0]] for flag in unknown
                 if flag.split("=")[0] in OTHER_FLAGS]
        args.commands[args.command].error(
            f"unrecognized arguments: {' '.join(unknown)}" + "".join(f" ({h})" for h in hints))
    return args


# flags of `python -m server` a trainer is given by mistake: host and trainer name one
# thing differently
OTHER_FLAGS = {"--data-url": "--data-url is the server's; a run takes --data with the "
                             "server's address, http://HOST:PORT, or a file"}


def stdout_gone() -> bool:
    """Whether the pipe stdout writes into lost its reader (`| head`); then nothing more is
    written to it, at exit either. (A BrokenPipeError from any other pipe is a bug.)"""
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        if not any(event & select.POLLERR for _, event in poll.poll(0)):
            return False
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    except (AttributeError, OSError, ValueError):  # no poll (Windows), no file descriptor
        return False
    return True


def whole_lines() -> None:
    """Each write call of text ending in a newline leaves stderr in one write (a print: its
    text and newline). Unbuffered (PYTHONUNBUFFERED=1 or -u, as containers and CI often
    run), Python's stderr writes print's text and its newline apart, and the local peers of
    `train --peers`, which share one stderr, came out spliced ("rank 1: ...rank 2: ..."
    over an empty line). Text without a newline now waits for one, a "\r" or a flush (the
    progress bar flushes itself). A stderr a caller replaced (pytest's capture) is left as
    it is."""
    if sys.stderr is sys.__stderr__ and hasattr(sys.stderr, "reconfigure"):
        sys.stderr.reconfigure(write_through=False, line_buffering=True)


# The commands whose lines carry the time of day: each runs on its own terminal, among
# others, and its lines are read against theirs.
STAMPED_COMMANDS = ("join", "cluster")
# The commands that train in this process: their cross-check recomputes in a worker thread.
TRAINING_COMMANDS = ("train", "cluster", "_peer", "join")


def main(argv: list[str] | None = None) -> int:
    # torch's C++ warnings (gloo's socket retries and timeouts, with stack frames) say
    # nothing our own error lines do not; set before torch loads, a user's choice kept.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    whole_lines()
    args = parse_args(build_parser(), argv)
    if args.command in TRAINING_COMMANDS:  # before the cross-check's worker thread allocates
        platform.share_malloc_arena()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        # a join's and a cluster rank's own lines carry the time (report.say): so do their
        # log records, which came untimed among them
        format=("%(asctime)s " if args.command in STAMPED_COMMANDS else "")
        + "%(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
        handlers=[ReportHandler()],  # above a progress bar, as the report's own lines
    )
    # the dashboard reporter's notices are for the user (its warning of an outage promises
    # that the next report taken says so): shown at INFO without -v
    logging.getLogger("pynode.dashboard").setLevel(
        logging.DEBUG if args.verbose else logging.INFO)
    try:
        with (sigterm_as_interrupt() if args.command in TRAINING_COMMANDS
              else contextlib.nullcontext()):
            return run_command(args, argv)
    except (DaisyError, ConfigError, FileNotFoundError, IsADirectoryError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # an optional dependency a path needed and no check caught
        missing = explain(f"`{args.command}`", exc)
        if missing is None:
            raise
        print(f"error: {type(missing).__name__}: {missing}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # a local peer of train --peers says which (the whole group hears a terminal's Ctrl-C)
        who = f"rank {args.rank}: " if args.command == "_peer" else ""
        if args.command == "_peer":  # leaving: a terminal's Ctrl-C and its leader's (which
            # passes one on) both reach it; the second landed in torch's exit hooks, a
            # traceback, in 2 of 3 tries (a trial)
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)
        # join's lines carry the time (report.say): its last one too
        tell = say if args.command == "join" else plain
        if terminated():
            tell(f"{who}terminated")
            return 128 + terminated()
        tell(f"{who}interrupted")
        return 130
    except BrokenPipeError:
        if not stdout_gone():
            raise
        return 128 + 13  # what a shell reports for a command SIGPIPE stopped
    finally:
        release_logs()  # the --log locks of this command (another main() in the process)


def run_command(args: argparse.Namespace, argv: list[str] | None) -> int:
    """The command `args` names, run; main says how it ended."""
    if args.command == "train":
        from pynode.cli.train import train_command

        return signals.run(train_command(args))
    if args.command == "cluster":
        from pynode.cli.group import cluster_command

        # with --resume, the checkpoint's config and the flags given over it: rank 0 reads it
        cfg = None if args.resume else config_from_args(args)
        return signals.run(cluster_command(args, cfg, argv))
    if args.command == "_peer":
        from pynode.cli.group import peer_command

        return signals.run(peer_command(args))
    if args.command == "join":
        from pynode.cli.join import join_command

        return signals.run(join_command(args))
    if args.command == "generate":
        from pynode.cli.generate import generate_command

        return generate_command(args)
    if args.command == "kit":
        from pynode.cli.kit import kit_command

        return kit_command(args)
    if args.command == "verify":
        from pynode.verify import verify_command

        return verify_command(json_rows=args.json)
    if args.command == "bench":
        import importlib

        module = importlib.import_module(f"pynode.bench.{args.name.replace('-', '_')}")
        return module.main(args.args)
    return 0
