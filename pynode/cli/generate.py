"""`python -m pynode generate`: continue a prompt with a checkpoint's model, streamed."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from pynode.cli.flags import add_arithmetic_flags
from pynode.config import ConfigError, RunConfig
from pynode.run.assemble import checkpoint_bytes, checkpoint_named
from pynode.run.generate import (
    GenerateError,
    Generator,
    Sampling,
    load_generator,
    prompt_window,
    text_pieces,
)
from pynode.run.trainer import Trainer


def add_generate_parser(sub) -> None:
    gen = sub.add_parser("generate", help="continue a prompt with a trained model (.pt)",
                         description="Continue a prompt byte by byte with a checkpoint's "
                         "model: the same bytes on every runtime for the same seed. The "
                         "continuation goes to stdout, then a newline.")
    gen.add_argument("--checkpoint", required=True, help="the .pt file a run saved (--save)")
    given = gen.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", help="the text to continue (UTF-8 bytes)")
    given.add_argument("--prompt-file", metavar="FILE",
                       help="continue the bytes of FILE (- reads stdin): a prompt a shell "
                       "would mangle, or one too long for the command line")
    add_sampling_flags(gen)
    add_arithmetic_flags(gen)


def add_sampling_flags(parser: argparse.ArgumentParser, tokens: int = 200) -> None:
    """--temperature, --top-k, --seed (and --tokens unless `tokens` is None)."""
    defaults = Sampling()
    if tokens is not None:
        parser.add_argument("--tokens", type=int, default=tokens,
                            help=f"bytes to generate (default {tokens})")
    parser.add_argument("--temperature", type=float, default=defaults.temperature,
                        help=f"0 is greedy (default {defaults.temperature})")
    parser.add_argument("--top-k", type=int, default=defaults.top_k,
                        help="sample among the k most likely bytes (default 0: all)")
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help="sampling seed: same seed, same text on every runtime "
                        f"(default {defaults.seed})")


SAMPLE_PROMPT = "The "  # what `train --sample` continues unless --prompt says otherwise


def add_train_sample_flags(parser: argparse.ArgumentParser) -> None:
    """train's --sample N and --prompt: text from the trained model at the end of the run."""
    parser.add_argument("--sample", type=int, metavar="N",
                        help="at the end, print N bytes the trained model writes (stderr; "
                        "gpt task, one peer; temperature "
                        f"{Sampling().temperature}, seed {Sampling().seed})")
    parser.add_argument("--prompt", help=f"what --sample continues (default {SAMPLE_PROMPT!r})")


def check_train_sample_flags(args: argparse.Namespace, cfg: RunConfig) -> None:
    """ConfigError for --sample or --prompt that the run cannot honour, before it starts."""
    if args.sample is None:
        if args.prompt is not None:
            raise ConfigError("--prompt is what --sample continues: give --sample N too")
        return
    if args.sample < 1:
        raise ConfigError(f"--sample needs a positive number of bytes, got {args.sample}")
    if cfg.task != "gpt" and not args.resume:  # a resumed run's task is the checkpoint's
        raise ConfigError(f"--sample needs the gpt task (this run trains {cfg.task!r})")
    if args.peers != 1:
        raise ConfigError("--sample needs one local peer: with --peers, --save the run and "
                          "use python -m pynode generate --checkpoint")
    if args.prompt == "":
        raise ConfigError("--prompt is empty: give at least one byte to continue")


def print_train_sample(args: argparse.Namespace, trainer: Trainer) -> None:
    """After the run: --sample bytes from the trained weights, streamed to stderr."""
    if args.sample is None:
        return
    if trainer.cfg.task != "gpt":
        print(f"no sample: --sample needs the gpt task, this run trains {trainer.cfg.task!r}",
              file=sys.stderr)
        return
    prompt = args.prompt if args.prompt is not None else SAMPLE_PROMPT
    generator = Generator(trainer.cfg, trainer.state.params, trainer.gemm)
    sampling = Sampling(tokens=args.sample)
    print(f"sample (temperature {sampling.temperature}, seed {sampling.seed}):", file=sys.stderr)
    data = prompt.encode("utf-8", "surrogateescape")  # the bytes the shell passed
    # shown as the continuation is: an invalid byte as U+FFFD (stderr wrote "\udcff")
    sys.stderr.write(data.decode("utf-8", "replace"))
    stream_text(generator, data, sampling, sys.stderr)


SAMPLING_FLAGS = {"tokens": "--tokens", "temperature": "--temperature", "top_k": "--top-k",
                  "seed": "--seed"}


def generate_command(args: argparse.Namespace) -> int:
    try:
        sampling = Sampling(tokens=args.tokens, temperature=args.temperature,
                            top_k=args.top_k, seed=args.seed)
    except GenerateError as exc:  # in the words of the command line: `--top-k must be ...`
        name, _, rest = str(exc).partition(" ")
        raise ConfigError(f"{SAMPLING_FLAGS.get(name, name)} {rest}") from None
    prompt = prompt_bytes(args)
    if not prompt:  # said before the model loads (and before an empty line of output)
        given = "--prompt" if args.prompt is not None else f"--prompt-file {args.prompt_file}"
        raise ConfigError(f"{given} is empty: give at least one byte to continue")
    data = checkpoint_bytes(args.checkpoint, "--checkpoint")
    with checkpoint_named(f"--checkpoint {args.checkpoint}"):
        generator = load_generator(data, backend=args.backend, kernels=args.kernels,
                                   check_products=args.check_products)
    stream_text(generator, prompt, sampling, sys.stdout)
    return 0


def prompt_bytes(args: argparse.Namespace) -> bytes:
    """The prompt's bytes: --prompt's as the shell passed them, or --prompt-file's as they
    are (- : stdin). ConfigError for a file that cannot be read."""
    if args.prompt is not None:
        return args.prompt.encode("utf-8", "surrogateescape")
    if args.prompt_file == "-":
        return sys.stdin.buffer.read()
    try:
        with open(args.prompt_file, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"--prompt-file {args.prompt_file}: {exc.strerror or exc}") from None


def stream_text(generator: Generator, prompt: bytes, sampling: Sampling, out: TextIO) -> bytes:
    """Write the continuation of `prompt` to `out` as it comes, whole characters only
    (UTF-8 decoded incrementally; an invalid byte shows as U+FFFD); returns its bytes."""
    if len(prompt) > generator.context:
        seen = prompt_window(prompt, generator.context)
        print(f"note: the prompt is {len(prompt)} bytes and the model's context "
              f"{generator.context}: it continues the last {len(seen)}", file=sys.stderr)
    produced = bytearray()

    def tokens():
        for token in generator.generate(prompt, sampling):
            produced.append(token)
            yield token

    try:
        for text in text_pieces(tokens()):
            if text:
                out.write(text)
                out.flush()
    finally:  # Ctrl-C too: "interrupted" went onto the line of the text
        out.write("\n")
        out.flush()
    return bytes(produced)
