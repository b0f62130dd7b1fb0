"""Flags the commands share, and the checks made on them before anything starts."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import stat
from dataclasses import fields
from pathlib import Path
from typing import Any

from pynode import datafile
from pynode.cli.report import PLAIN_EVERY_S
from pynode.config import ConfigError, RunConfig, check_outer_given, check_run_length
from pynode.run.errors import OutputError
from pynode.run.trainer import TrainOptions

CONFIG_FLAGS = {f.name: f for f in fields(RunConfig)}


# What a flag's "(default ...)" does not say by itself.
CONFIG_HELP = {
    "task": "what to train: gpt (a byte-level transformer), mlp (a small test classifier), "
            "float (the gpt in torch float32, not bit-reproducible), or module:Class "
            "(docs/CUSTOM_TASK.md) ",
    "steps": "optimizer steps of the run ",
    "seed": "keys the initial weights, the data's order and the stochastic rounding ",
    "width": "model width (embedding size) ",
    "layers": "transformer blocks ",
    "heads": "attention heads; must divide --width ",
    "seq": "context length in bytes ",
    "microbatch_size": "sequences per microbatch ",
    "microbatches": "microbatches per step (the global batch, split among the peers) ",
    "lr": "peak learning rate (AdamW) ",
    "warmup": "steps of linear warm-up before the cosine decay to lr/10 at the last step ",
    "weight_decay": "decoupled (AdamW) weight decay ",
    "clip": "global gradient-norm clip; 0: none ",
    "frac_bits": "fraction bits of the exact int64 fixed-point gradient sum (16..40) ",
    "eval_every": "held-out loss every N steps and at the last (the text's last 1/32 is held "
                  "out); 0: never ",
    "cross_check": "in a group, each microbatch is recomputed by another peer with chance "
                   "1/N; 0: never ",
    "data": "the text: builtin, a DaisyChain server http://HOST:PORT, or a text or parquet "
            "file ",
    "data_fallback": "what a --data server that cannot read its shards may send instead: none "
                     "(the run stops) or builtin ",
    "sync_every": "H: reduce exactly once every H steps (outer steps over --replicas virtual "
                  "replicas, each H AdamW steps); 1: every step ",
    "replicas": "R: virtual replicas of a --sync-every run, each on microbatches/R of every "
                "step's microbatches (fixed by the run, not by the number of peers) ",
    "outer_lr": "learning rate of a --sync-every run's outer Nesterov step ",
    "outer_momentum": "momentum of a --sync-every run's outer Nesterov step ",
}


CONFIG_CHOICES = {"data_fallback": ("none", "builtin")}  # fields of a few fixed values


def add_config_flags(parser: argparse.ArgumentParser, helps: dict[str, str] | None = None) -> None:
    """One flag per RunConfig field (--microbatch-size for microbatch_size, ...); `helps`
    replaces CONFIG_HELP's text of a field where a command reads it differently."""
    defaults = RunConfig()
    texts = {**CONFIG_HELP, **(helps or {})}
    for name, f in CONFIG_FLAGS.items():
        kind = {"int": int, "float": float, "str": str}[str(f.type)]
        flag = "--" + name.replace("_", "-")
        default = getattr(defaults, name)
        parser.add_argument(flag, type=kind, default=None, choices=CONFIG_CHOICES.get(name),
                            help=f"{texts.get(name, '')}(default {default})")


def add_output_flags(parser: argparse.ArgumentParser, who: str = "") -> None:
    """--log, --save, --save-every, --no-progress; `who` prefixes the help ("(rank 0) ")."""
    parser.add_argument("--log", help=f"{who}append one JSON object per step to this file")
    parser.add_argument("--save", help=f"{who}write a .pt checkpoint here at the end (of the "
                        "last agreed step if the run stops)")
    parser.add_argument("--save-every", type=int, metavar="N",
                        help="also write --save every N steps (resume it after a crash)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar on a terminal, nor the plain step line every "
                        f"{PLAIN_EVERY_S:.0f} s elsewhere: the run's first and last lines only "
                        "(--log keeps every step)")


def add_dashboard_flag(parser: argparse.ArgumentParser, who: str = "") -> None:
    """--dashboard URL: report each rank's status to a DaisyChain server (pynode.cli.dashboard)."""
    parser.add_argument("--dashboard", metavar="URL",
                        help=f"{who}report status (step, loss, speed, resources; never weights "
                        "or gradients) to this DaisyChain server's /dashboard")


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
    return config_from_values(explicit_config(args))


def config_from_values(values: dict) -> RunConfig:
    """The config of the flags given (`explicit_config`) over the defaults (PYNODE_TASK, if
    set, for the task)."""
    if "task" not in values and os.environ.get("PYNODE_TASK"):
        values = {**values, "task": os.environ["PYNODE_TASK"]}
    try:
        cfg = RunConfig(**values)
        check_outer_given(values, cfg)
    except ConfigError as exc:
        raise ConfigError(flag_words(str(exc))) from None
    return cfg


def flag_words(text: str) -> str:
    """A config error in the words of the command line: `sync_every must be ...` reads
    `--sync-every must be ...`. A key with an underscore is a flag wherever it stands; a
    plain word (steps, width) only where the message starts with it, as a field's own
    refusal does (elsewhere it may be English)."""
    for name in CONFIG_FLAGS:
        flag = "--" + name.replace("_", "-")
        if "_" in name:
            text = re.sub(rf"(?<![\w-]){name}\b", flag, text)
        elif re.match(rf"{name}\b", text):
            text = flag + text[len(name):]
    return text


def explicit_config(args: argparse.Namespace) -> dict:
    """Config flags the user actually gave (the rest come from a resumed checkpoint);
    --data FILE becomes file:FILE#sha256=... (pynode.datafile)."""
    values = {n: getattr(args, n) for n in CONFIG_FLAGS if getattr(args, n, None) is not None}
    try:
        check_run_length(values)
    except ConfigError as exc:
        raise ConfigError(flag_words(str(exc))) from None
    data = values.get("data")
    if data is not None and data != "builtin" and not data.startswith(
            ("http://", "https://", datafile.PREFIX)):
        values["data"] = datafile.file_spec(data)
    return values


# The files a run writes: (flag, its argparse name)
OUTPUT_FLAGS = (("--save", "save"), ("--log", "log"), ("--summary", "summary"))


def check_output_flags(args: argparse.Namespace, writes: bool = True,
                       lock_log: bool = True) -> None:
    """Before anything runs: OutputError for an output file (--save, --log, --summary) that
    cannot be written, and ConfigError for two of them (or --resume and an output that
    would write into it) naming one file, or --save-every without --save. `writes`: this
    process writes them (a cluster's other ranks only pass them on). `lock_log`: this
    process appends to --log itself (hold_log); not torchrun's launcher, whose rank 0 does,
    nor a rank its agent restarts (the last attempt's may not have let go yet)."""
    outputs = [(flag, getattr(args, name, None)) for flag, name in OUTPUT_FLAGS]
    outputs = [(flag, path) for flag, path in outputs if path is not None and writes]
    named = outputs + ([("--resume", args.resume)] if getattr(args, "resume", None) else [])
    seen: dict[Path, str] = {}
    for flag, path in named:
        key = Path(path).resolve()
        if key in seen and {flag, seen[key]} != {"--save", "--resume"}:  # save over resume
            raise ConfigError(f"{seen[key]} and {flag} name the same file {path}: give each "
                              "its own")
        seen.setdefault(key, flag)
    resumed = seen.get(Path(args.resume).resolve()) if getattr(args, "resume", None) else None
    # A rank under torchrun's agent may be an attempt after the first (a restart, a machine
    # that joined): its --save is its own run's. `cluster --elastic`'s launcher checks once.
    under_agent = bool(os.environ.get("TORCHELASTIC_RUN_ID"))
    for flag, path in outputs:
        check_writable(flag, path, append=flag == "--log")
        check_replaceable(flag, path)
        # a new run saving over a checkpoint, not the one it continues
        if flag == "--save" and resumed != "--save" and not under_agent:
            # join's --resume leads the run, so it needs --start
            check_no_checkpoint(path, "--resume" if getattr(args, "start", True)
                                else "--start --resume", getattr(args, "resume", None))
        if flag == "--log" and lock_log:
            hold_log(path)
    if args.save_every is not None and args.save_every < 1:  # said apart: --save may be there
        raise ConfigError(f"--save-every takes a positive number of steps, got "
                          f"{args.save_every}")
    if args.save_every is not None and not args.save:
        raise ConfigError("--save-every needs --save (the file it writes every N steps)")


_HELD_LOGS: list[tuple[Any, str, bool]] = []  # (file, path, made here), until the end


def hold_log(path: str) -> None:
    """Lock the --log file this command appends to, until release_logs (the command's
    end): OutputError if another run holds it. Two runs given one --log both appended, and
    their rows mixed with nothing to tell them apart. Where the file cannot be locked (no
    flock: Windows) or is no file (a terminal, a pipe) it is left as it was; a file made
    here that is still empty at the end is removed (a refused run leaves nothing)."""
    try:
        import fcntl
    except ImportError:
        return
    made = not os.path.exists(path)
    log = open(path, "ab")  # noqa: SIM115 (held open: the lock lives with it)
    if not stat.S_ISREG(os.fstat(log.fileno()).st_mode):  # /dev/stdout: a terminal, a pipe
        log.close()
        return
    try:
        fcntl.flock(log, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        log.close()
        if isinstance(exc, BlockingIOError):
            raise OutputError(f"--log {path}: another run is writing it (their rows would "
                              "mix): give each run its own --log") from None
        return
    _HELD_LOGS.append((log, path, made))


def release_logs() -> None:
    """The end of a command: its --log locks go (hold_log), and a log it made but never
    wrote to."""
    while _HELD_LOGS:
        log, path, made = _HELD_LOGS.pop()
        with contextlib.suppress(OSError):
            if made and os.fstat(log.fileno()).st_size == 0:
                os.unlink(path)
        log.close()


# What an output flag writes, as the start of a file of that kind reads: a file already
# there is replaced (or, for --log, appended to) only when it is one, or empty. A file of
# another kind named by mistake (`--save train.py`, `-o notes.txt`) is refused and kept.
OUTPUT_KINDS = {
    "--save": ("a DaisyChain checkpoint", lambda head: head.startswith(b"PK\x03\x04")
               and b"DAISYCHAIN-CKPT" in head),
    "--summary": ("a run's --summary", lambda head: head.startswith(b'{"')),
    "--log": ("a run's --log", lambda head: head.startswith(b'{"')),
    "-o": ("a DaisyChain inference kit", lambda head: b"<title>DaisyChain inference kit"
           in head),
}
HEAD_BYTES = 4096


def file_head(path: str) -> bytes | None:
    """The first HEAD_BYTES of the file at `path`; None where there is nothing to lose: no
    file, an empty one, or no plain file (/dev/null, a terminal, a pipe), or one that
    cannot be read (check_writable names what is wrong with it)."""
    target = Path(path)
    try:
        if not target.is_file() or target.stat().st_size == 0:
            return None
        with target.open("rb") as file:
            return file.read(HEAD_BYTES)
    except OSError:
        return None


def check_replaceable(flag: str, path: str) -> None:
    """OutputError if `path` is a file with something in it that `flag` would replace or
    append to and that is not what `flag` writes (OUTPUT_KINDS); nothing is changed."""
    what, is_kind = OUTPUT_KINDS[flag]
    head = file_head(path)
    if head is not None and not is_kind(head):
        verb = "add to" if flag == "--log" else "replace"
        raise OutputError(f"{flag} {path}: that file is there and is not {what}; this "
                          f"command would {verb} it. Give another name, or move it away first")


def check_no_checkpoint(path: str, resume: str = "--resume", resumed: str | None = None,
                        ) -> None:
    """OutputError if --save names a checkpoint a new run would replace (a command line run
    again from the shell's history, then Ctrl-C: the earlier run's model was gone);
    `resume`: the flags that continue it; `resumed`: the checkpoint this run continues."""
    head = file_head(path)
    if head is None or not OUTPUT_KINDS["--save"][1](head):
        return
    if resumed:  # "this new run" and "to continue that run" read as if --resume were off
        raise OutputError(f"--save {path}: another checkpoint is there, and this run (resuming "
                          f"{resumed}) would replace it. To keep the result with the run it "
                          f"continues: --save {resumed}; else give another name, or move "
                          f"{path} away first")
    raise OutputError(f"--save {path}: a checkpoint is there, and this new run would "
                      f"replace it. To continue that run: {resume} {path} (with --save "
                      f"{path} to keep the result there); else give another name, or move "
                      "it away first")


def check_writable(flag: str, path: str, append: bool = False) -> None:
    """OutputError unless a file can be written at `path`, nothing changed: `append` (as
    --log is) to an existing file by opening it to add; else by creating and removing a file
    where pynode.run.assemble.write_atomically puts its own, beside `path` (beside the link,
    if `path` is one)."""
    target = Path(path)
    if not path.strip():  # `--save ''` read "--save : that is a folder"
        raise OutputError(f"{flag} needs a file name, got an empty one")
    if not target.name or target.is_dir():
        raise OutputError(f"{flag} {path}: that is a folder; give a file name")
    try:
        if append and target.exists():  # /dev/stdout too
            target.open("ab").close()
            return
        folder = Path(os.path.abspath(path)).parent
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() else "does not exist"
            raise OutputError(f"{flag} {path}: {folder} {what}")
        probe = folder / f".{target.name}.probe-{os.getpid()}"
        probe.open("xb").close()
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None


def parse_capacity(text: str | None, peers: int) -> dict[int, float] | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError as exc:
        raise ConfigError(f"--capacity must be numbers like 1,2,5, got {text!r}") from exc
    if len(values) != peers or not all(0 < v < math.inf for v in values):  # nan, inf too
        raise ConfigError(f"--capacity needs {peers} positive finite numbers, one per peer "
                          f"(--peers {peers}), got {text!r}")
    return dict(enumerate(values))


def train_options(args: argparse.Namespace, **fields) -> TrainOptions:
    """TrainOptions of `fields`, with --timeout (where the command has it) as the least
    time to wait for the others in a step."""
    if getattr(args, "timeout", None) is not None:
        fields["min_deadline"] = args.timeout
    return TrainOptions(**fields)


def resume_line(path: str, ckpt: Any, steps: int) -> str:
    """The first line of a resumed run (train, join --start): which checkpoint, where."""
    return f"resuming {path}: step {ckpt.step} of {steps}, state hash {ckpt.state_hash[:16]}"


def resume_notes(stored: dict, step: int, given: dict) -> list[str]:
    """What a resume changes: one line per config flag whose value differs from the
    checkpoint's. The flags win (a lower --lr after a NonFiniteError is a fix, not a
    mistake), but from `step` on the run is no longer the checkpoint's own."""
    notes = []
    for name, value in given.items():
        old = stored.get(name)
        if old == value or name == "data" and same_file(old, value):
            continue  # the checkpoint's data file, read from another folder: the same text
        flag = "--" + name.replace("_", "-")
        if name == "data":
            value, old = data_shown(value), data_shown(old)
        if name == "steps":
            # a finished checkpoint has no run of its own left to continue
            own = ("; without --steps the resume is the checkpoint's own run, bit for bit"
                   if isinstance(old, int) and old > step else "")
            notes.append(f"note: --steps {value} (the checkpoint's run has {old}): from step "
                         f"{step} the learning rate follows the schedule of a run of {value} "
                         f"steps{own}")
        else:
            notes.append(f"note: {flag} {value} replaces the checkpoint's {old!r}: from step "
                         f"{step} this is another run than the checkpoint's (drop {flag} to "
                         "continue it bit for bit)")
    return notes


def same_file(old: Any, new: Any) -> bool:
    """Whether two `data` values name files of the same sha256 (their paths may differ)."""
    files = [isinstance(v, str) and datafile.is_file_spec(v) for v in (old, new)]
    return all(files) and datafile.split_spec(old)[1] == datafile.split_spec(new)[1]


def data_shown(value: Any) -> Any:
    """A `data` value as the user gave it: a file's path, not its config form."""
    if isinstance(value, str) and datafile.is_file_spec(value):
        path, digest = datafile.split_spec(value)
        return f"{path} (sha256 {digest[:12]}...)"
    return value


def unsaved_note(args: argparse.Namespace) -> str | None:
    """A resume without --save: the state it trains to would be dropped at its end (what a
    user who continues a run rarely means), said before it starts."""
    if not getattr(args, "resume", None) or getattr(args, "save", None):
        return None
    return (f"note: no --save: the state this run reaches is not kept (--save {args.resume} "
            "writes it back over the checkpoint)")


def replicas_note(cfg: RunConfig, capacities: dict[int, float] | None,
                  peers: int) -> str | None:
    """For `peers` local peers of a --sync-every run, which splits whole replicas, not
    microbatches: None if every peer gets replicas in the capacities' proportion (equal
    without --capacity), else the line that says how they split, who computes none, and
    the --replicas (a divisor of --microbatches) that would give every peer its share."""
    from fractions import Fraction

    from pynode.core.plan import microbatch_plan

    caps = capacities or dict.fromkeys(range(peers), 1.0)
    weights = {r: Fraction(c).limit_denominator(10**6) for r, c in caps.items()}
    total = sum(weights.values())

    def fits(replicas: int) -> tuple[bool, bool]:  # (every peer has some, in proportion)
        plan = microbatch_plan(replicas, caps)
        return (all(plan.values()),
                all(len(plan[r]) == weights[r] / total * replicas for r in plan))

    if fits(cfg.replicas) == (True, True):
        return None
    plan = microbatch_plan(cfg.replicas, caps)
    split = "/".join(str(len(plan[r])) for r in sorted(plan))
    line = (f"note: a --sync-every run splits whole replicas among its peers: --replicas "
            f"{cfg.replicas} over {peers} peers is {split}")
    if capacities:
        line += " (the capacities ask for " + "/".join(
            f"{float(weights[r] / total * cfg.replicas):.3g}" for r in sorted(plan)) + ")"
    idle = [str(r) for r in sorted(plan) if not plan[r]]
    if idle:
        line += f"; rank {idle[0]} computes none" if len(idle) == 1 else \
            f"; ranks {', '.join(idle)} compute none"
    divisors = [d for d in range(1, cfg.microbatches + 1) if cfg.microbatches % d == 0]
    better = next((d for d in divisors if fits(d) == (True, True)), None)
    if better is None and not fits(cfg.replicas)[0]:  # none splits in proportion: some work
        better = next((d for d in divisors if fits(d)[0]), None)
    if better is not None and better != cfg.replicas:
        line += (f"; --replicas {better} gives every peer " +
                 ("its share" if fits(better)[1] else "some") + " (another run: R is part of "
                 "what it computes)")
    return line


def capacity_note(microbatches: int, capacities: dict[int, float] | None,
                  ranks: int = 1) -> str | None:
    """None if --capacity splits the step's microbatches in its exact proportion, else the
    line that says how whole microbatches split and which --microbatches would be exact.
    Without --capacity: the line for fewer microbatches than `ranks` (some compute none)."""
    if capacities is None:
        if microbatches >= ranks:
            return None
        idle = ranks - microbatches
        rest = "the other computes none" if idle == 1 else f"the other {idle} compute none"
        return (f"note: --microbatches {microbatches} for {ranks} ranks: each step's "
                f"microbatches go to {microbatches} of them and {rest} (--microbatches "
                f"{ranks} or more uses every rank)")
    from fractions import Fraction
    from math import lcm

    from pynode.core.plan import microbatch_plan

    plan = microbatch_plan(microbatches, capacities)
    weights = {r: Fraction(c).limit_denominator(10**6) for r, c in capacities.items()}
    fractions = [weights[r] / sum(weights.values()) for r in sorted(weights)]
    if all((f * microbatches).denominator == 1 for f in fractions):
        return None
    exact = lcm(*(f.denominator for f in fractions))
    split = "/".join(str(len(plan[r])) for r in sorted(plan))
    asked = "/".join(f"{float(f * microbatches):.3g}" for f in fractions)
    idle = [str(r) for r in sorted(plan) if not plan[r]]
    line = (f"note: --capacity {','.join(f'{c:g}' for c in capacities.values())} of "
            f"{microbatches} microbatches: whole microbatches split {split} (the capacities "
            f"ask for {asked})")
    if idle:
        line += f"; rank {idle[0]} computes none" if len(idle) == 1 else \
            f"; ranks {', '.join(idle)} compute none"
    if exact <= 4096:
        line += f"; --microbatches {exact} (or a multiple) splits in exact proportion"
    return line
