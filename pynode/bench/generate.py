"""`python -m pynode bench generate [--json]`: generation speed natively, KV cache vs none.

Bytes per second of `generate` (the int8 forward with its KV cache, pynode/run/generate.py)
against the best alternative with the same bits: the whole window recomputed through
`GPT.forward_logits` for every byte. Both sample the same bytes (checked); each is timed
best of `--repeats` after a warm-up. The model is the default config's (or `--config`'s)
at init, or a checkpoint's (`--checkpoint`): the speed depends on its shape, not weights.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from pynode.bench.machine import machine_info, machine_line
from pynode.config import RunConfig

PROMPT = b"The "


def uncached_bytes(generator, prompt: bytes, sampling) -> bytes:
    """The same rule as Generator.generate with no cache: the padded window each byte."""
    from pynode.run.generate import sample_token

    model, params = generator.decoder.model, generator.decoder.params
    s, keep = model.cfg.seq, max(1, model.cfg.seq // 2)
    history, start = list(prompt), max(0, len(prompt) - s)
    for _ in range(sampling.tokens):
        if len(history) - start > s:
            start = len(history) - keep
        window = history[start:]
        padded = np.array([window + [0] * (s - len(window))])
        logits = model.forward_logits(params, padded)[0, len(window) - 1]
        history.append(sample_token(logits, sampling, len(history), model.ops))
    return bytes(history[len(prompt):])


def best_of(repeats: int, fn) -> tuple[float, object]:
    fn()  # warm-up: first allocations, kernel variants
    best, out = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - started)
    return best, out


def measure(args: argparse.Namespace) -> dict:
    from pynode.core.gpt import gpt_init_params
    from pynode.run.assemble import load_units_and_gemm
    from pynode.run.generate import Generator, Sampling, load_generator
    from pynode.tasks.gpt import gpt_config

    arithmetic = load_units_and_gemm(args.backend, args.kernels)
    if args.checkpoint:
        with open(args.checkpoint, "rb") as f:
            generator = load_generator(f.read(), arithmetic=arithmetic)
    else:
        cfg = RunConfig.from_dict(json.loads(args.config))
        generator = Generator(cfg, gpt_init_params(gpt_config(cfg), cfg.seed), arithmetic[1])
    sampling = Sampling(tokens=args.tokens, temperature=0.8)
    cached_s, cached = best_of(args.repeats,
                               lambda: bytes(generator.generate(PROMPT, sampling)))
    uncached_s, uncached = best_of(max(1, args.repeats // 2),
                                   lambda: uncached_bytes(generator, PROMPT, sampling))
    if cached != uncached:
        raise AssertionError("the cached and uncached forwards sampled different bytes")
    return {
        "runtime": "native",
        "backend": generator.decoder.model.gemm.backend_name,
        "kernels": generator.decoder.model.ops.name,
        "config": json.loads(generator.cfg.to_json()),
        "tokens": args.tokens,
        "tokens_per_s": args.tokens / cached_s,
        "uncached_tokens_per_s": args.tokens / uncached_s,
        "cached_over_uncached": uncached_s / cached_s,
        "machine": machine_info(),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pynode bench generate")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--tokens", type=int, default=256, help="bytes per timed generation")
    parser.add_argument("--repeats", type=int, default=3, help="timed generations (best of)")
    parser.add_argument("--config", default="{}", help="RunConfig overrides as JSON")
    parser.add_argument("--checkpoint", help="time this .pt's model instead")
    parser.add_argument("--backend", help="force a GEMM backend (default: the best gated)")
    parser.add_argument("--kernels", choices=["numba", "numpy"], help="force the kernels")
    args = parser.parse_args(argv)
    row = measure(args)
    if args.json:
        print(json.dumps(row, sort_keys=True))
        return 0
    print(f"machine: {machine_line(row['machine'])}")
    print(f"config: {json.dumps(row['config'])}")
    print(f"backend {row['backend']}, kernels {row['kernels']}, {row['tokens']} bytes "
          f"after {PROMPT!r} (temperature 0.8)")
    print(f"KV cache: {row['tokens_per_s']:.0f} bytes/s; whole window each byte: "
          f"{row['uncached_tokens_per_s']:.0f} bytes/s ({row['cached_over_uncached']:.1f}x)")
    return 0
