"""Flags the commands share, and the checks made on them before anything starts."""

from __future__ import annotations

import argparse
import os
from dataclasses import fields
from pathlib import Path

from pynode.config import ConfigError, RunConfig
from pynode.run.trainer import TrainOptions

CONFIG_FLAGS = {f.name: f for f in fields(RunConfig)}


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field (--microbatch-size for microbatch_size, ...)."""
    defaults = RunConfig()
    for name, f in CONFIG_FLAGS.items():
        kind = {"int": int, "float": float, "str": str}[str(f.type)]
        flag = "--" + name.replace("_", "-")
        default = getattr(defaults, name)
        parser.add_argument(flag, type=kind, default=None, help=f"(default {default})")


def add_output_flags(parser: argparse.ArgumentParser, who: str = "") -> None:
    """--log, --save, --save-every, --no-progress; `who` prefixes the help ("(rank 0) ")."""
    parser.add_argument("--log", help=f"{who}append one JSON object per step to this file")
    parser.add_argument("--save", help=f"{who}write a .pt checkpoint here at the end (of the "
                        "last agreed step if the run stops)")
    parser.add_argument("--save-every", type=int, metavar="N",
                        help="also write --save every N steps (resume it after a crash)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_arithmetic_flags(parser: argparse.ArgumentParser) -> None:
    """--backend, --kernels, --check-products: what a user may force about the arithmetic
    (each choice is still checked exactly before it is used)."""
    from pynode.gemm_backends import NATIVE_ORDER

    parser.add_argument("--backend", metavar="NAME",
                        help="force a GEMM backend: " + ", ".join(NATIVE_ORDER)
                        + " (default: the fastest that passes its gate, per shape)")
    parser.add_argument("--kernels", choices=["numba", "numpy"],
                        help="force the hot kernels: numba (fused) or numpy (the reference, "
                        "no numba import: about a second less to start) (default: numba "
                        "where it is installed and passes its gate)")
    parser.add_argument("--check-products", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="check every GEMM product before it is used (Freivalds; a wrong "
                        "one is recomputed on another backend): on by default, a few %% of "
                        "a step (bench train prints it)")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    values = explicit_config(args)
    if "task" not in values and os.environ.get("PYNODE_TASK"):
        values["task"] = os.environ["PYNODE_TASK"]
    return RunConfig(**values)


def explicit_config(args: argparse.Namespace) -> dict:
    """Config flags the user actually gave (the rest come from a resumed checkpoint)."""
    return {n: getattr(args, n) for n in CONFIG_FLAGS if getattr(args, n, None) is not None}


def check_output_flags(args: argparse.Namespace) -> None:
    """ConfigError for --save or --log into a missing folder, --save-every without --save."""
    for flag, path in (("--save", args.save), ("--log", args.log)):
        parent = Path(path).resolve().parent if path else None
        if parent is not None and not parent.is_dir():
            raise ConfigError(f"{flag}: folder {parent} does not exist")
    if args.save_every is not None and (args.save_every < 1 or not args.save):
        raise ConfigError("--save-every needs --save and a positive number of steps")


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


def train_options(args: argparse.Namespace, **fields) -> TrainOptions:
    """TrainOptions of `fields`, with --timeout (where the command has it) as the least
    time to wait for the others in a step."""
    if getattr(args, "timeout", None) is not None:
        fields["min_deadline"] = args.timeout
    return TrainOptions(**fields)
