"""Command line: `python -m pynode {train,verify,bench,cluster,join} ...`.

The CLI is the only place that reads argv and prints results; the library logs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from dataclasses import fields

from pynode.config import ConfigError, RunConfig
from pynode.core.errors import DaisyError

CONFIG_FLAGS = {f.name: f for f in fields(RunConfig)}


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field (--microbatch-size for microbatch_size, ...)."""
    defaults = RunConfig()
    for name, f in CONFIG_FLAGS.items():
        kind = {"int": int, "float": float, "str": str}[str(f.type)]
        flag = "--" + name.replace("_", "-")
        default = getattr(defaults, name)
        parser.add_argument(flag, type=kind, default=None, help=f"(default {default})")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    values = {n: getattr(args, n) for n in CONFIG_FLAGS if getattr(args, n, None) is not None}
    if "task" not in values and os.environ.get("PYNODE_TASK"):
        values["task"] = os.environ["PYNODE_TASK"]
    return RunConfig(**values)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pynode", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train on this machine (one or more local peers)")
    add_config_flags(train)
    train.add_argument("--backend", help="force a GEMM backend (default: best that passes)")
    train.add_argument("--log", help="append one JSON object per step to this file")
    train.add_argument("--save", help="write a .pt checkpoint here at the end")
    train.add_argument("--save-every", type=int, metavar="N",
                       help="also write --save every N steps (resume it after a crash)")
    train.add_argument("--resume", help="continue from this .pt checkpoint")
    train.add_argument("--peers", type=int, default=1, help="local peer processes (loopback)")
    train.add_argument("--capacity", help="relative speeds of the local peers, e.g. 1,2,5")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--summary", help="write a JSON summary (final hash, traffic) here")

    cluster = sub.add_parser(
        "cluster", help="gloo cluster from MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK"
    )
    add_config_flags(cluster)
    cluster.add_argument("--backend", help="force a GEMM backend")
    cluster.add_argument("--log", help="(rank 0) append one JSON object per step to this file")
    cluster.add_argument("--save", help="(rank 0) write a .pt checkpoint here at the end, or "
                         "of the last agreed step if the cluster breaks")
    cluster.add_argument("--save-every", type=int, metavar="N",
                         help="also write --save every N steps")
    cluster.add_argument("--resume", help="(rank 0) continue from this .pt checkpoint")
    cluster.add_argument("--capacity", help="relative speeds of the ranks, e.g. 1,2")
    cluster.add_argument("--timeout", type=float, default=60.0,
                         help="seconds a rank waits for the others before giving up")
    cluster.add_argument("--no-progress", action="store_true", help="no progress bar")
    cluster.add_argument("--summary", help="(rank 0) write a JSON summary here")

    peer = sub.add_parser("_peer")  # internal: a loopback follower spawned by train --peers
    peer.add_argument("--rank", type=int, required=True)
    peer.add_argument("--world", type=int, required=True)
    peer.add_argument("--address", required=True)
    peer.add_argument("--backend")
    peer.add_argument("--capacity")

    from pynode.cli_join import add_join_parser

    add_join_parser(sub)

    verify = sub.add_parser("verify", help="check units, LUTs and GEMM backends; exit 1 on failure")
    verify.add_argument("--json", action="store_true", help="print rows as JSON lines")

    bench = sub.add_parser("bench", help="benchmarks: gemm, train, scaling, browser")
    bench.add_argument("name", choices=["gemm", "train", "scaling", "browser"])
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "train":
            from pynode.cli_train import train_command

            return asyncio.run(train_command(args, config_from_args(args)))
        if args.command == "cluster":
            from pynode.cli_group import cluster_command

            return asyncio.run(cluster_command(args, config_from_args(args)))
        if args.command == "_peer":
            from pynode.cli_group import peer_command

            return asyncio.run(peer_command(args))
        if args.command == "join":
            from pynode.cli_join import join_command

            return asyncio.run(join_command(args))
        if args.command == "verify":
            from pynode.verify import verify_command

            return verify_command(json_rows=args.json)
        if args.command == "bench":
            import importlib

            module = importlib.import_module(f"pynode.bench.{args.name}")
            return module.main(args.rest)
    except (DaisyError, ConfigError, FileNotFoundError, IsADirectoryError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def print_json(obj: dict) -> None:
    print(json.dumps(obj, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
