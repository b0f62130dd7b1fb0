"""`python -m pynode generate`: continue a prompt with a checkpoint's model, streamed."""

from __future__ import annotations

import argparse
import codecs
import sys
from pathlib import Path
from typing import TextIO

from pynode.cli.flags import add_arithmetic_flags
from pynode.run.generate import Generator, Sampling, load_generator, prompt_window


def add_generate_parser(sub) -> None:
    gen = sub.add_parser("generate", help="continue a prompt with a trained model (.pt)")
    gen.add_argument("--checkpoint", required=True, help="the .pt file a run saved (--save)")
    gen.add_argument("--prompt", required=True, help="the text to continue (UTF-8 bytes)")
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


def generate_command(args: argparse.Namespace) -> int:
    sampling = Sampling(tokens=args.tokens, temperature=args.temperature, top_k=args.top_k,
                        seed=args.seed)
    prompt = args.prompt.encode("utf-8", "surrogateescape")  # the bytes the shell passed
    data = Path(args.checkpoint).read_bytes()
    generator = load_generator(data, backend=args.backend, kernels=args.kernels,
                               check_products=args.check_products)
    stream_text(generator, prompt, sampling, sys.stdout)
    return 0


def stream_text(generator: Generator, prompt: bytes, sampling: Sampling, out: TextIO) -> bytes:
    """Write the continuation of `prompt` to `out` as it comes, whole characters only
    (UTF-8 decoded incrementally; an invalid byte shows as U+FFFD); returns its bytes."""
    if len(prompt) > generator.context:
        seen = prompt_window(prompt, generator.context)
        print(f"note: the prompt is {len(prompt)} bytes and the model's context "
              f"{generator.context}: it continues the last {len(seen)}", file=sys.stderr)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    produced = bytearray()
    for token in generator.generate(prompt, sampling):
        produced.append(token)
        text = decoder.decode(bytes([token]))
        if text:
            out.write(text)
            out.flush()
    out.write(decoder.decode(b"", final=True) + "\n")
    out.flush()
    return bytes(produced)
