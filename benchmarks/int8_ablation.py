"""Which int8 product costs the int8 GPT its loss? Each product switched to float, one at a time.

    python benchmarks/int8_ablation.py --steps 150 --seeds 3 [--config JSON] [--json]
    python benchmarks/int8_ablation.py --steps 150 --seeds 1 2 3 --only none all qk av
    python benchmarks/int8_ablation.py --steps 600 --seeds 1 --gradient-error --only none qkv2 fwd

Every matrix product of the int8 GPT (pynode/core/layers.py) is an int8 GEMM. This script
trains the default task with one product (or one group) computed as a float32 matmul of the
unquantized operands instead, everything else unchanged (same init, data, optimizer, the
same stochastic-rounding draws for the products still in int8), and reports the mean loss
of the last 10 steps of each variant next to the plain-float task's. A product whose switch
closes the gap is what the int8 path loses there.

The switch is a patch of pynode.core.layers in this process only: the float products are
neither exact nor reproducible across machines, which a quality ablation does not need.

Products (forward / backward; L: every linear layer incl. the tied head, A: attention):
  lin    L forward  x W             dx     L backward dY W^T       dw    L backward X^T dY
  qk     A forward  q k^T           av     A forward  p v
  dp     A backward dO v^T          dv     A backward p^T dO
  dq     A backward dS k            dk     A backward dS^T q
Groups: fwd (lin qk av), bwd (dx dw dp dv dq dk), attn (qk av dp dv dq dk), all; none is
the int8 model as it ships.

Candidate fix, still exact integer GEMMs: `fwd2` gives every forward operand a second
int8 slice, x ~= s1 q1 + s2 q2 (q1 round-to-nearest, q2 the rounded residual, its own
per-row/column scale), and computes each forward product as hi.hi + hi.lo + lo.hi: three
exact int8 GEMMs and epilogues, summed in that order (p v: four, p being rescaled by each
slice of v); `av2` does so for p v only; `qkv2` for the qkv projection only (three int8
GEMMs where the model has one: the product whose rounding the gradient error points at).

--gradient-error measures without the noise of whole runs: it trains the model as shipped
once per seed, then compares each variant's gradient at those final parameters, on the
batches of the last steps, with a float64 oracle's (pynode.float_gpt), per parameter group.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time

import numpy as np
from parity_grid import one_thread, run_losses, tail_mean

from pynode.config import RunConfig
from pynode.core import layers

PRODUCTS = ("lin", "qk", "av", "dx", "dw", "dp", "dv", "dq", "dk")
TWO_SLICE = {"fwd2": {"lin", "qk", "av"}, "av2": {"av"}}
GROUPS = {
    "none": (),
    "fwd": ("lin", "qk", "av"),
    "bwd": ("dx", "dw", "dp", "dv", "dq", "dk"),
    "attn": ("qk", "av", "dp", "dv", "dq", "dk"),
    "all": PRODUCTS,
}
# the backward products by the last two elements of their rounding key: (kind, product code)
_LINEAR_CODES = {layers.LINEAR_DX: "dx", layers.LINEAR_DW: "dw"}
_ATTN_CODES = {layers.ATTN_DP: "dp", layers.ATTN_DV: "dv", layers.ATTN_DQ: "dq",
               layers.ATTN_DK: "dk"}


def _float_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a.astype(np.float32), b.astype(np.float32))


def _slices(ops, x: np.ndarray, axis: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(q1, s1), (q2, s2)] with x ~= s1 q1 + s2 q2, scales per row (-1) or column (-2)."""
    q1, s1 = ops.quantize(x, axis, None)
    recon = q1.astype(np.float32) * (s1[..., :, None] if axis == -1 else s1[..., None, :])
    return [(q1, s1), ops.quantize(x - recon, axis, None)]


def _two_slice(gemm, a, b, multiply):
    ops = layers.kernels_of(gemm)
    (qa1, sa1), (qa2, sa2) = _slices(ops, a, -1)
    (qb1, sb1), (qb2, sb2) = _slices(ops, b, -2)
    y = ops.epilogue(multiply(qa1, qb1), sa1, sb1)
    y += ops.epilogue(multiply(qa1, qb2), sa1, sb2)
    y += ops.epilogue(multiply(qa2, qb1), sa2, sb1)
    return y


def _two_slice_values(gemm, p, v):
    """attend_values with both operands in two slices (v's per key position)."""
    ops = layers.kernels_of(gemm)
    ones = np.ones(v.shape[::2], np.float32)  # (G, Dh)
    y = None
    for qv, sv in _slices(ops, v, -1):
        p_slices = _slices(ops, p * sv[:, None, :], -1)
        for qp, sp in p_slices:  # p is rescaled per v slice: four products
            part = ops.epilogue(gemm.bmm(qp, qv), sp, ones)
            y = part if y is None else y + part
    return y


@contextlib.contextmanager
def _products(matmul, bmm, values):
    """Within the block, pynode.core.layers' int8_matmul, int8_bmm and attend_values are
    these (each variant wraps the shipped ones)."""
    saved = layers.int8_matmul, layers.int8_bmm, layers.attend_values
    layers.int8_matmul, layers.int8_bmm, layers.attend_values = matmul, bmm, values
    try:
        yield
    finally:
        layers.int8_matmul, layers.int8_bmm, layers.attend_values = saved


def two_slice_forward(names: set[str]):
    """Within the block, the named forward products use two-slice int8 operands."""
    int8_matmul, int8_bmm, attend_values = (
        layers.int8_matmul, layers.int8_bmm, layers.attend_values)

    def matmul(gemm, a, b, *, a_key=None, b_key=None):
        if "lin" in names and a_key is None and b_key is None:
            return _two_slice(gemm, a, b, gemm.matmul)
        return int8_matmul(gemm, a, b, a_key=a_key, b_key=b_key)

    def bmm(gemm, a, b, *, a_key=None, b_key=None):
        if "qk" in names and a_key is None and b_key is None:
            return _two_slice(gemm, a, b, gemm.bmm)
        return int8_bmm(gemm, a, b, a_key=a_key, b_key=b_key)

    def values(gemm, p, v):
        return _two_slice_values(gemm, p, v) if "av" in names else attend_values(gemm, p, v)

    return _products(matmul, bmm, values)


def float_products(names: set[str]):
    """Within the block, the named products of pynode.core.layers are float32 matmuls."""
    int8_matmul, int8_bmm, attend_values = (
        layers.int8_matmul, layers.int8_bmm, layers.attend_values)

    def matmul(gemm, a, b, *, a_key=None, b_key=None):
        key = a_key or b_key
        name = "lin" if key is None else _LINEAR_CODES[key[-1]]
        if name in names:
            return _float_product(a, b)
        return int8_matmul(gemm, a, b, a_key=a_key, b_key=b_key)

    def bmm(gemm, a, b, *, a_key=None, b_key=None):
        key = a_key or b_key
        name = "qk" if key is None else _ATTN_CODES[key[-1]]
        if name in names:
            return _float_product(a, b)
        return int8_bmm(gemm, a, b, a_key=a_key, b_key=b_key)

    def values(gemm, p, v):
        return _float_product(p, v) if "av" in names else attend_values(gemm, p, v)

    return _products(matmul, bmm, values)


@contextlib.contextmanager
def two_slice_qkv():
    """Within the block, the qkv projection's forward (the linear layer whose weight is
    (D, 3D)) takes both operands in two int8 slices, as `fwd2` does for every product."""
    linear_forward = layers.linear_forward

    def patched(gemm, x, w, b=None):
        if w.ndim == 2 and w.shape[1] == 3 * w.shape[0]:
            y = _two_slice(gemm, x, w, gemm.matmul)
            return (y if b is None else y + b), layers.LinearCache(x, w, b is not None)
        return linear_forward(gemm, x, w, b)

    layers.linear_forward = patched
    try:
        yield
    finally:
        layers.linear_forward = linear_forward


def patch_of(name: str, switched: set[str]):
    if name in TWO_SLICE:
        return two_slice_forward(TWO_SLICE[name])
    if name == "qkv2":
        return two_slice_qkv()
    return float_products(switched)


# Parameter groups of the gradient-error table (gpt.gpt_param_shapes names).
PARAM_GROUPS = {"wte": ("wte",), "wpe": ("wpe",), "qkv": ("attn.qkv",), "attn.proj": ("attn.proj",),
                "mlp.fc": ("mlp.fc",), "mlp.proj": ("mlp.proj",), "gains": (".g",)}


def gradient_errors(cfg: RunConfig, table: dict[str, set[str]], last: int = 40,
                    every: int = 5) -> tuple[dict, list[dict]]:
    """Train cfg's int8 model as shipped, then at its final parameters compare each variant's
    step gradient (the mean over the step's microbatches, on the batches of every `every`-th
    of the `last` steps) with a float64 oracle's (pynode.float_gpt in float64).

    Returns (noise, rows): noise[group] is the step-to-step variance of the oracle's
    gradient over those steps, relative to its mean square; a row's error[group] is the
    mean squared error of the variant relative to that variance (0: float64's gradient;
    a few % is a bias a step's own noise does not hide)."""
    import torch

    from pynode.float_gpt import float_loss_and_grads
    from pynode.run.assemble import build_trainer
    from pynode.tasks.gpt import gpt_config

    trainer = build_trainer(cfg)
    asyncio.run(_train(trainer, cfg.steps))
    params, model, task = trainer.state.params, trainer.model, trainer.task
    steps = range(cfg.steps - last, cfg.steps, every)

    def step_grad(loss_and_grads, step):
        grads = [loss_and_grads(task.sample(cfg, step, i), (cfg.seed, step, i))
                 for i in range(cfg.microbatches)]
        return {name: sum(g[name] for g in grads) / len(grads) for name in grads[0]}

    oracle = {s: step_grad(lambda b, k: float_loss_and_grads(params, b, gpt_config(cfg),
                                                            torch.float64)[1], s)
              for s in steps}
    names = {group: [n for n in params if any(n.endswith(e) for e in ends)]
             for group, ends in PARAM_GROUPS.items()}

    def total(per_name, group):
        return sum(per_name[n] for n in names[group])

    mean = {n: np.mean([oracle[s][n] for s in steps], axis=0) for n in params}
    variance = {n: np.mean([np.sum((oracle[s][n] - mean[n]) ** 2) for s in steps])
                for n in params}
    square = {n: np.mean([np.sum(oracle[s][n] ** 2) for s in steps]) for n in params}
    noise = {g: total(variance, g) / total(square, g) for g in names}
    rows = []
    for name, switched in table.items():
        with patch_of(name, switched):
            got = {s: step_grad(lambda b, k: model.loss_and_grads(params, b, k)[1], s)
                   for s in steps}
        error = {n: np.mean([np.sum((got[s][n] - oracle[s][n]) ** 2) for s in steps])
                 for n in params}
        rows.append({"variant": name, "error": {g: total(error, g) / total(variance, g)
                                                for g in names}})
    return noise, rows


async def _train(trainer, steps: int) -> None:
    while trainer.state.step < steps:
        await trainer.step()


def variants(only: list[str] | None) -> dict[str, set[str]]:
    table = {name: set(group) for name, group in GROUPS.items()}
    table.update({name: {name} for name in PRODUCTS})
    table.update({name: {name} for name in TWO_SLICE})
    table["qkv2"] = set()
    if only is None:
        return table
    unknown = sorted(set(only) - set(table))
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; use {', '.join(table)}")
    return {name: table[name] for name in only}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, nargs="+", default=[3])
    parser.add_argument("--config", default="{}", help="RunConfig overrides as JSON")
    parser.add_argument("--only", nargs="+", help="variants to run (default: every one)")
    parser.add_argument("--gradient-error", action="store_true",
                        help="train once per seed, then each variant's gradient error there")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    one_thread()
    base = RunConfig.from_dict({**json.loads(args.config), "steps": args.steps})
    table = variants(args.only)
    if args.gradient_error:
        print_gradient_errors(base, args.seeds, table, args.json)
        return
    rows = []
    for seed in args.seeds:
        started = time.perf_counter()
        reference = tail_mean(run_losses(base.with_(task="float", seed=seed)))
        if not args.json:
            print(f"seed {seed}: float task {reference:.4f} "
                  f"({time.perf_counter() - started:.0f}s)", flush=True)
        for name, switched in table.items():
            started = time.perf_counter()
            with patch_of(name, switched):
                losses = run_losses(base.with_(task="gpt", seed=seed))
            floats = sorted(switched)
            row = {"seed": seed, "variant": name, "float_products": floats,
                   "loss": tail_mean(losses), "float_task": reference,
                   "ratio": tail_mean(losses) / reference,
                   "at": {str(s): losses[s - 1] for s in (50, 100, 150, 300, 600)
                          if s <= len(losses)},
                   "seconds": time.perf_counter() - started}
            rows.append(row)
            if not args.json:
                print(f"  {name:5s} {row['loss']:.4f}  ratio {row['ratio']:.4f}  "
                      f"({row['seconds']:.0f}s)", flush=True)
    if args.json:
        print(json.dumps({"config": json.loads(base.to_json()), "rows": rows}, sort_keys=True))


def print_gradient_errors(base: RunConfig, seeds, table, as_json: bool) -> None:
    out = []
    for seed in seeds:
        noise, rows = gradient_errors(base.with_(task="gpt", seed=seed), table)
        out.append({"seed": seed, "noise": noise, "rows": rows})
        if as_json:
            continue
        print(f"seed {seed}, {base.steps} steps: error^2 / step-to-step variance, per group")
        print("| variant | " + " | ".join(noise) + " |")
        print("|---|" + "---|" * len(noise))
        print("| (variance / mean square) | " + " | ".join(f"{v:.3f}" for v in noise.values())
              + " |")
        for row in rows:
            print(f"| {row['variant']} | "
                  + " | ".join(f"{row['error'][g]:.3f}" for g in noise) + " |", flush=True)
    if as_json:
        print(json.dumps({"config": json.loads(base.to_json()), "seeds": out}, sort_keys=True))


if __name__ == "__main__":
    main()
