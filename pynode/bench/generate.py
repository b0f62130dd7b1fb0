"""`python -m pynode bench generate [--json] [--browser]`: generation speed, KV cache vs none.

Bytes per second of `generate` (the int8 forward with its KV cache, pynode/run/generate.py)
against the best alternative with the same bits: the whole window recomputed through
`GPT.forward_logits` for every byte. Both sample the same bytes (checked); each is timed
best of `--repeats` after a warm-up. The model is the default config's (or `--config`'s)
at init, or a checkpoint's (`--checkpoint`): the speed depends on its shape, not weights.

`--browser` adds headless Chromium (pynode.bench.browser's session, on 127.0.0.1): the
page's generation worker (Pyodide; the time of a 0-byte request, which reads the .pt and
fills the window, is subtracted) and the inference kit opened from file://, each checked
to give the native bytes.
"""

from __future__ import annotations

import argparse
import base64
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from pynode.bench import CONFIG_HELP, bench_parser
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


PAGE_TIMING = """async ([b64, request, repeats]) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const best = async (tokens) => {
        let top = Infinity, text = null;
        for (let i = 0; i <= repeats; i++) {  // the first is the warm-up
            const started = performance.now();
            const done = await daisychain.generate({...request, tokens}, bytes.slice().buffer);
            if (i) top = Math.min(top, performance.now() - started);
            text = done.bytes;
        }
        return [top / 1000, text];
    };
    const [empty] = await best(0);
    const [full, hex] = await best(request.tokens);
    return {seconds: full - empty, hex};
}"""
KIT_TIMING = """([prompt, sampling, repeats]) => {
    let top = Infinity, hex = null;
    for (let i = 0; i <= repeats; i++) {
        const started = performance.now();
        hex = kit.generate(prompt, sampling);
        if (i) top = Math.min(top, performance.now() - started);
    }
    return {seconds: top / 1000, hex};
}"""


def browser_rows(data: bytes, sampling, repeats: int, want: bytes) -> dict:
    """Bytes per second in the page's generation worker and in the kit, with their bytes
    checked against `want` (native)."""
    from pynode.bench.browser import BrowserSession
    from pynode.run.kit import build_kit

    request = {"prompt": PROMPT.decode(), "tokens": sampling.tokens,
               "temperature": sampling.temperature, "top_k": sampling.top_k,
               "seed": sampling.seed}
    with tempfile.TemporaryDirectory(prefix="pynode-bench-generate-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "server").mkdir()
        kit = tmp / "kit.html"
        kit.write_bytes(build_kit(data).encode("utf-8"))
        kit_bytes = kit.stat().st_size
        session = BrowserSession(tmp)
        try:
            page = session.tab()
            page.wait_for_function("() => ['ready', 'failed'].includes("
                                   "daisychain.status().state)", timeout=300_000)
            page.evaluate("() => daisychain.bootGenerator()")
            in_page = page.evaluate(PAGE_TIMING, [base64.b64encode(data).decode(), request,
                                                  repeats])
            kit_page = session.browser.new_context().new_page()
            kit_page.goto(kit.as_uri())
            in_kit = kit_page.evaluate(KIT_TIMING, [PROMPT.decode(), request, repeats])
            version = session.browser.version
        finally:
            session.close()
    for where, got in (("page", in_page), ("kit", in_kit)):
        if bytes.fromhex(got["hex"]) != want:
            raise AssertionError(f"the {where} generated other bytes than native")
    return {"pyodide_tokens_per_s": sampling.tokens / in_page["seconds"],
            "kit_tokens_per_s": sampling.tokens / in_kit["seconds"],
            "kit_bytes": kit_bytes, "chromium": version}


def measure(args: argparse.Namespace) -> dict:
    from pynode.core.gpt import gpt_init_params
    from pynode.run.assemble import load_units_and_gemm
    from pynode.run.generate import Generator, Sampling, load_generator
    from pynode.tasks.gpt import gpt_config

    arithmetic = load_units_and_gemm(args.backend, args.kernels)
    if args.checkpoint:
        data = Path(args.checkpoint).read_bytes()
        generator = load_generator(data, arithmetic=arithmetic)
    else:
        cfg = RunConfig.from_dict(json.loads(args.config))
        generator = Generator(cfg, gpt_init_params(gpt_config(cfg), cfg.seed), arithmetic[1])
        data = init_checkpoint(cfg, generator.decoder.params) if args.browser else b""
    sampling = Sampling(tokens=args.tokens, temperature=0.8)
    cached_s, cached = best_of(args.repeats,
                               lambda: bytes(generator.generate(PROMPT, sampling)))
    uncached_s, uncached = best_of(max(1, args.repeats // 2),
                                   lambda: uncached_bytes(generator, PROMPT, sampling))
    if cached != uncached:
        raise AssertionError("the cached and uncached forwards sampled different bytes")
    browser = browser_rows(data, sampling, args.repeats, cached) if args.browser else {}
    return {
        **browser,
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


def init_checkpoint(cfg: RunConfig, params: dict) -> bytes:
    from pynode.run.trainer import Trainer, TrainState
    from pynode.tasks import load_task

    trainer = Trainer(cfg, load_task("gpt"), None)
    trainer.state = TrainState(step=0, params=params, opt=trainer.state.opt)
    return trainer.state_bytes()


def main(argv: list[str]) -> int:
    parser = bench_parser("generate", __doc__)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--tokens", type=int, default=256, help="bytes per timed generation")
    parser.add_argument("--repeats", type=int, default=3, help="timed generations (best of)")
    parser.add_argument("--config", default="{}", help=CONFIG_HELP)
    parser.add_argument("--checkpoint", help="time this .pt's model instead")
    parser.add_argument("--backend", help="force a GEMM backend (default: the best gated)")
    parser.add_argument("--kernels", choices=["numba", "numpy"], help="force the kernels")
    parser.add_argument("--browser", action="store_true",
                        help="also the page (Pyodide) and the inference kit, in Chromium")
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
    if args.browser:
        print(f"Chromium {row['chromium']}: the page (Pyodide) {row['pyodide_tokens_per_s']:.0f} "
              f"bytes/s; the inference kit {row['kit_tokens_per_s']:.0f} bytes/s "
              f"({row['kit_bytes'] / 1024:.0f} KiB); same bytes as native")
    return 0
