"""Train the three unit networks and export them as integer weights (units/SPEC.md section 6).

Run from the repository root (torch needed; native only):

    python -m units.train_units [--out DIR]

Each network is trained with Adam until every float output is within TOLERANCE of its
target, then rounded to dyadic integer weights. The integer form is checked over the
full unit domain by pynode.core.units (the code every peer runs at start-up); files are
written only if all three units are exact with margin >= MIN_MARGIN.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pynode.core.errors import UnitVerificationError
from pynode.core.units import ENCODINGS, FORMAT_VERSION, MAGIC, UNIT_NAMES, load_units, run_unit
from pynode.unitfiles import weights_dir, write_unit_weights

TOLERANCE = 0.1  # stop training once every float output is this close to its target
MIN_MARGIN = 0.25  # exported integer form: every output at least this far from a rounding edge
FRAC_BITS_TRIED = (8, 10, 12, 14, 16, 20)  # fewest fractional bits that keep the margin win
ATTEMPTS = 3  # seeds tried per unit before giving up


@dataclass(frozen=True)
class Recipe:
    hidden: int  # hidden ReLU units of the single hidden layer
    steps: int  # Adam steps at most (cosine schedule over this many)
    lr: float  # peak Adam learning rate
    out_scale: float  # network output is multiplied by this (keeps weights O(1))
    structured: bool  # start from the known exact construction plus noise
    out_init: float = 1.0  # std of the random output weights
    hinge: float = 1.0  # weight of the hinge term that pushes the worst outputs


RECIPES = {
    "mul8": Recipe(hidden=64, steps=4000, lr=3e-2, out_scale=1.0, structured=False),
    "requant16": Recipe(hidden=2, steps=2000, lr=3e-2, out_scale=1.0, structured=True,
                        hinge=100.0),
    "relu8": Recipe(hidden=8, steps=4000, lr=1e-2, out_scale=128.0, structured=False,
                    out_init=0.35),
}


def _bits(v: torch.Tensor, width: int) -> torch.Tensor:
    return torch.stack([(v >> i) & 1 for i in range(width)], 1).double()


def training_set(unit: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Network inputs and integer targets over the whole domain the network sees."""
    if unit == "mul8":
        x, y = torch.arange(16).repeat_interleave(16), torch.arange(16).repeat(16)
        onehot = torch.zeros(256, 32, dtype=torch.float64)
        onehot[torch.arange(256), x] = 1.0
        onehot[torch.arange(256), 16 + y] = 1.0
        return onehot, (x * y).double()
    if unit == "requant16":
        x = torch.arange(-32768, 32768)
        return _bits(x, 16), torch.clamp((x + 128) >> 8, -128, 127).double()
    x = torch.arange(-128, 128)
    return _bits(x, 8), torch.relu(x).double()


def _structured_requant(hidden: int) -> list[torch.Tensor]:
    # h0 = relu(L + 128) passes L = (x >> 8) + bit7 through; h1 = relu(2L - 255) is the
    # saturation corner (kink midway between L = 127 and 128, so bias noise cannot kill it);
    # out = h0 - h1 - 128 = min(L, 127) = sat8((x + 128) >> 8).
    line = torch.zeros(16, dtype=torch.float64)
    line[7], line[15] = 1.0, -128.0
    line[8:15] = 2.0 ** torch.arange(7, dtype=torch.float64)
    w0 = torch.zeros(16, hidden, dtype=torch.float64)
    w0[:, 0], w0[:, 1] = line, 2.0 * line
    b0 = torch.zeros(hidden, dtype=torch.float64)
    b0[0], b0[1] = 128.0, -255.0
    w1 = torch.zeros(hidden, 1, dtype=torch.float64)
    w1[0, 0], w1[1, 0] = 1.0, -1.0
    return [w0, b0, w1, torch.tensor([-128.0], dtype=torch.float64)]


def initial_params(unit: str, width: int, recipe: Recipe, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    if recipe.structured:
        params = _structured_requant(recipe.hidden)
        # Noise on every weight (2% relative plus 0.02) and bias (0.25): initial errors of
        # several units that Adam has to remove.
        for w in (params[0], params[2]):
            w += (w.abs() * 0.02 + 0.02) * torch.randn(w.shape, generator=gen, dtype=torch.float64)
        for b in (params[1], params[3]):
            b += 0.25 * torch.randn(b.shape, generator=gen, dtype=torch.float64)
    else:
        params = [
            torch.randn(width, recipe.hidden, generator=gen, dtype=torch.float64),
            torch.zeros(recipe.hidden, dtype=torch.float64),
            torch.randn(recipe.hidden, 1, generator=gen, dtype=torch.float64) * recipe.out_init,
            torch.zeros(1, dtype=torch.float64),
        ]
    return [p.requires_grad_() for p in params]


def forward(params: list[torch.Tensor], inputs: torch.Tensor, out_scale: float) -> torch.Tensor:
    w0, b0, w1, b1 = params
    return ((torch.relu(inputs @ w0 + b0) @ w1 + b1) * out_scale)[:, 0]


def train(unit: str, recipe: Recipe, seed: int) -> tuple[list[np.ndarray], int, float] | None:
    """Adam until every output is within TOLERANCE; None if it never gets there."""
    inputs, target = training_set(unit)
    params = initial_params(unit, inputs.shape[1], recipe, seed)
    opt = torch.optim.Adam(params, lr=recipe.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, recipe.steps)
    scale = recipe.out_scale
    for step in range(1, recipe.steps + 1):
        err = forward(params, inputs, scale) - target
        # MSE for the bulk, plus a hinge that pushes whichever outputs are still far off.
        hinge = (err.abs() - TOLERANCE / 2).relu().square().mean()
        loss = (err / scale).square().mean() + recipe.hinge * hinge
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
        if step % 50 == 0:
            with torch.no_grad():
                worst = (forward(params, inputs, scale) - target).abs().max().item()
            if worst < TOLERANCE:
                w0, b0, w1, b1 = (p.detach() for p in params)
                layers = [w0.numpy(), b0.numpy(), (w1 * scale).numpy(), (b1 * scale).numpy()]
                return layers, step, worst
    return None


def export(unit: str, layers: list[np.ndarray], frac_bits: int) -> dict[str, np.ndarray]:
    """Round float layers to dyadic integers in the SPEC 4.3 layout (biases at scale 2**S_l)."""
    w0, b0, w1, b1 = layers
    return {
        "magic": np.array(MAGIC),
        "format_version": np.array(FORMAT_VERSION, dtype=np.int64),
        "unit": np.array(unit),
        "encoding": np.array(ENCODINGS[unit][0]),
        "frac_bits": np.array([frac_bits, frac_bits], dtype=np.int64),
        "w0": np.rint(w0 * 2.0**frac_bits).astype(np.int64),
        "b0": np.rint(b0 * 2.0**frac_bits).astype(np.int64),
        "w1": np.rint(w1 * 2.0**frac_bits).astype(np.int64),
        "b1": np.rint(b1 * 2.0 ** (2 * frac_bits)).astype(np.int64),
    }


def build_unit(unit: str, seed0: int) -> tuple[dict[str, np.ndarray], str]:
    recipe = RECIPES[unit]
    for seed in range(seed0, seed0 + ATTEMPTS):
        started = time.perf_counter()
        trained = train(unit, recipe, seed)
        if trained is None:
            print(f"{unit}: seed {seed} did not reach {TOLERANCE} in {recipe.steps} steps")
            continue
        layers, steps, worst = trained
        for frac_bits in FRAC_BITS_TRIED:
            arrays = export(unit, layers, frac_bits)
            try:
                _, margin = run_unit(unit, arrays)
            except UnitVerificationError as exc:  # rounding too coarse: try more bits
                last = str(exc)
                continue
            if margin >= MIN_MARGIN:
                note = (f"seed {seed}, {steps} Adam steps, float max err {worst:.4f}, "
                        f"{frac_bits} frac bits, margin {margin:.4f}, "
                        f"{time.perf_counter() - started:.1f} s")
                return arrays, note
            last = f"margin {margin:.4f} < {MIN_MARGIN}"
        print(f"{unit}: seed {seed} trained but no rounding was exact ({last})")
    raise SystemExit(f"{unit}: no exact network after {ATTEMPTS} seeds; nothing written")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=weights_dir(),
                        help="weights folder (default: $PYNODE_UNITS_DIR or pynode/data/units)")
    parser.add_argument("--seed", type=int, default=0, help="first seed tried per unit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    weights = {}
    for unit in UNIT_NAMES:
        weights[unit], note = build_unit(unit, args.seed)
        print(f"{unit}: exact over its full domain; {note}")
    units = load_units(weights)  # the whole chain once more, exactly as a peer runs it
    sizes = write_unit_weights(weights, args.out)
    for check in units.verify_report():
        print(f"verified {check.unit}: {check.domain:,} inputs in {check.seconds:.3f} s")
    for name, size in sizes.items():
        print(f"wrote {args.out / name} ({size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
