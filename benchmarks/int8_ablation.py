"""Which int8 product costs the int8 GPT its loss? Each product switched to float, one at a time.

    python benchmarks/int8_ablation.py --steps 150 --seeds 3 [--config JSON] [--json]
    python benchmarks/int8_ablation.py --steps 150 --seeds 1 2 3 --only none all qk av
    python benchmarks/int8_ablation.py --steps 600 --seeds 1 2 3 --only qkv2_0 --float-runs F
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
Narrower and other forms of that fix (QKV_VARIANTS): `qkv2_0` block 0's qkv only,
`qkv2a_0` / `qkv2w_0` only its activations / only its weight in two slices, `qkvsr_0` /
`qkvsr` the qkv activations stochastically rounded (block 0 / every block), `qkv2_early` /
`qkv2_late` qkv2 in the first / second half of the schedule only.

--float-runs FILE takes the float task's losses from parity_grid.py's file of float runs
(and adds the ones it trains): they do not depend on the int8 numerics.

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
from parity_grid import _add_float_run, _read_float_runs, one_thread, run_losses, tail_mean

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


def _two_slice(gemm, a, b, multiply, a2: bool = True, b2: bool = True):
    """a times b, the operands flagged in two int8 slices (three or two exact int8 GEMMs:
    hi.hi, hi.lo, lo.hi, in that order), the others in one."""
    ops = layers.kernels_of(gemm)
    sa = _slices(ops, a, -1) if a2 else [ops.quantize(a, -1, None)]
    sb = _slices(ops, b, -2) if b2 else [ops.quantize(b, -2, None)]
    (qa1, sa1), (qb1, sb1) = sa[0], sb[0]
    y = ops.epilogue(multiply(qa1, qb1), sa1, sb1)
    if b2:
        y += ops.epilogue(multiply(qa1, sb[1][0]), sa1, sb[1][1])
    if a2:
        y += ops.epilogue(multiply(sa[1][0], qb1), sa[1][1], sb1)
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


# qkv projection variants (issue #19): which blocks (None: every one) and how its forward
# rounds: "ab" both operands in two int8 slices (as qkv2), "a" / "b" only the activations /
# only the weight in two slices, "sr" the activations stochastically rounded (keyed like the
# backward's draws: the step's key, the layer id, then QKV_FORWARD), the weight to nearest;
# a third element (start, end), the shares of the schedule between which the variant
# applies, as shipped outside (the learning rate is half its peak about midway).
QKV_FORWARD = 2  # product code of that draw, after LINEAR_DX and LINEAR_DW
QKV_VARIANTS = {
    "qkv2_0": ({0}, "ab"), "qkv2a_0": ({0}, "a"), "qkv2w_0": ({0}, "b"),
    "qkvsr_0": ({0}, "sr"), "qkvsr": (None, "sr"),
    "qkv2_late": (None, "ab", (0.5, 1.0)), "qkv2_early": (None, "ab", (0.0, 0.5)),
}


@contextlib.contextmanager
def qkv_variant(blocks: set[int] | None, mode: str, steps: range | None = None):
    """Within the block, the qkv projection's forward of the given blocks rounds as `mode`
    says (QKV_VARIANTS), in the training steps given (None: always); every other product
    as shipped."""
    from pynode.core import gpt

    linear_forward, block_forward, loss_and_grads = (
        layers.linear_forward, gpt.GPT._block_forward, gpt.GPT.loss_and_grads)
    where = {"block": None, "key": None}

    def block(self, params, i, x, b):
        where["block"] = i
        try:
            return block_forward(self, params, i, x, b)
        finally:
            where["block"] = None

    def grads(self, params, tokens, key):
        where["key"] = key
        try:
            return loss_and_grads(self, params, tokens, key)
        finally:
            where["key"] = None

    def patched(gemm, x, w, b=None):
        i = where["block"]
        key = where["key"]
        if (i is None or w.shape[1] != 3 * w.shape[0] or (blocks is not None and i not in blocks)
                or (steps is not None and (key is None or key[1] not in steps))):
            return linear_forward(gemm, x, w, b)
        if mode == "sr":
            if key is None:  # forward only (held-out loss): round to nearest
                return linear_forward(gemm, x, w, b)
            key = tuple(where["key"]) + (1 + gpt.SLOTS * i + gpt.QKV, QKV_FORWARD)
            y = layers.int8_matmul(gemm, x, w, a_key=key)
        else:
            y = _two_slice(gemm, x, w, gemm.matmul, "a" in mode, "b" in mode)
        return (y if b is None else y + b), layers.LinearCache(x, w, b is not None)

    layers.linear_forward, gpt.GPT._block_forward, gpt.GPT.loss_and_grads = (
        patched, block, grads)
    try:
        yield
    finally:
        layers.linear_forward, gpt.GPT._block_forward, gpt.GPT.loss_and_grads = (
            linear_forward, block_forward, loss_and_grads)


def patch_of(name: str, switched: set[str], steps: int = 0):
    """The patch of variant `name` for a run of `steps` steps."""
    if name in TWO_SLICE:
        return two_slice_forward(TWO_SLICE[name])
    if name == "qkv2":
        return two_slice_qkv()
    if name in QKV_VARIANTS:
        blocks, mode, *share = QKV_VARIANTS[name]
        when = range(round(share[0][0] * steps), round(share[0][1] * steps)) if share else None
        return qkv_variant(blocks, mode, when)
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
        with patch_of(name, switched, cfg.steps):
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
    table.update({name: set() for name in QKV_VARIANTS})
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
    parser.add_argument("--float-runs", metavar="FILE",
                        help="float-task runs to reuse and add to (parity_grid.py's file)")
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
        reference = float_task_loss(base.with_(task="float", seed=seed), args.config,
                                    args.float_runs)
        if not args.json:
            print(f"seed {seed}: float task {reference:.4f} "
                  f"({time.perf_counter() - started:.0f}s)", flush=True)
        for name, switched in table.items():
            started = time.perf_counter()
            with patch_of(name, switched, base.steps):
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


def float_task_loss(cfg: RunConfig, overrides: str, path: str | None) -> float:
    """The float task's last-10 mean at cfg: from parity_grid's --float-runs file when it
    holds this run (same steps, width, seed and overrides), else trained (and kept there)."""
    cached = _read_float_runs(path, overrides).get(("float", cfg.steps, cfg.width, cfg.seed))
    if cached is not None:
        return cached["loss"]
    started = time.perf_counter()
    loss = tail_mean(run_losses(cfg))
    if path is not None:
        _add_float_run(path, overrides, {"task": "float", "steps": cfg.steps, "width": cfg.width,
                                         "seed": cfg.seed, "loss": loss,
                                         "seconds": time.perf_counter() - started})
    return loss


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
