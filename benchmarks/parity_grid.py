"""int8 / float learning parity over a grid of schedules, widths and seeds.

    python benchmarks/parity_grid.py                       # the issue #19 grid, 2 workers
    python benchmarks/parity_grid.py --steps 150 --widths 64 --seeds 1 2 3 --jobs 1
    python benchmarks/parity_grid.py --json > grid.json    # every run, then the cells

One cell is (steps, width): the default task (`gpt`, int8) and the plain-float task
(`float`, torch) train the same config, seed and data; the measure is the mean loss of the
last 10 steps of each, and the cell's figure is the mean over seeds of int8 / float.
Everything but `steps`, `width` and `seed` is the default RunConfig (or --config).

Runs are independent processes (--jobs at a time), each on one thread: this measures
loss, not speed, and a shared machine gives the same losses whatever its load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor

from pynode.config import RunConfig
from pynode.run.assemble import build_trainer

STEPS = (100, 150, 300, 600)
WIDTHS = (64, 256)
SEEDS = (1, 2, 3)
TAIL = 10  # the measure: mean loss of the last 10 steps


def run_losses(cfg: RunConfig) -> list[float]:
    """The loss of every step of a fresh run of cfg in this process."""
    trainer = build_trainer(cfg)
    losses: list[float] = []

    async def loop() -> None:
        while trainer.state.step < cfg.steps:
            losses.append(float((await trainer.step()).loss))

    asyncio.run(loop())
    return losses


def tail_mean(losses: list[float], tail: int = TAIL) -> float:
    return sum(losses[-tail:]) / len(losses[-tail:])


def one_thread() -> None:
    """BLAS and torch on one thread (torch's pool spin-waits for cores a shared machine
    does not have). In a worker before any BLAS call; the CLI calls it first thing."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    import torch

    torch.set_num_threads(1)


def run_cell(job: tuple[str, int, int, int, str]) -> dict:
    """One training run: (task, steps, width, seed, config overrides JSON) -> its result."""
    task, steps, width, seed, overrides = job
    cfg = RunConfig.from_dict({**json.loads(overrides), "task": task, "steps": steps,
                               "width": width, "seed": seed})
    started = time.perf_counter()
    losses = run_losses(cfg)
    return {"task": task, "steps": steps, "width": width, "seed": seed,
            "loss": tail_mean(losses), "seconds": time.perf_counter() - started}


def cells(runs: list[dict]) -> list[dict]:
    """Per (steps, width): each seed's int8 / float ratio and their mean."""
    by_key = {(r["task"], r["steps"], r["width"], r["seed"]): r["loss"] for r in runs}
    out = []
    for steps, width in sorted({(r["steps"], r["width"]) for r in runs}):
        seeds = sorted({r["seed"] for r in runs if (r["steps"], r["width"]) == (steps, width)})
        ratios = [by_key["gpt", steps, width, s] / by_key["float", steps, width, s]
                  for s in seeds]
        out.append({"steps": steps, "width": width, "seeds": seeds, "ratios": ratios,
                    "mean": sum(ratios) / len(ratios), "max": max(ratios)})
    return out


def grid(steps, widths, seeds, overrides="{}", jobs=2) -> tuple[list[dict], list[dict]]:
    """Train every (task, steps, width, seed), `jobs` processes at a time; (runs, cells)."""
    work = [(task, s, w, seed, overrides) for w in sorted(widths, reverse=True)
            for s in sorted(steps, reverse=True) for seed in seeds for task in ("gpt", "float")]
    if jobs == 1:
        runs = [run_cell(job) for job in work]
    else:
        with ProcessPoolExecutor(jobs, initializer=one_thread) as pool:  # longest first
            runs = list(pool.map(run_cell, work))
    return runs, cells(runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, nargs="+", default=list(STEPS))
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--config", default="{}", help="other RunConfig overrides as JSON")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    one_thread()
    started = time.perf_counter()
    runs, table = grid(args.steps, args.widths, args.seeds, args.config, args.jobs)
    if args.json:
        print(json.dumps({"config": json.loads(args.config), "runs": runs, "cells": table},
                         sort_keys=True))
        return
    print("| steps | width | int8 / float per seed | mean | max |")
    print("|---|---|---|---|---|")
    for c in table:
        per_seed = ", ".join(f"{r:.4f}" for r in c["ratios"])
        print(f"| {c['steps']} | {c['width']} | {per_seed} | {c['mean']:.4f} | {c['max']:.4f} |")
    worst = max(table, key=lambda c: c["mean"])
    print(f"worst cell mean {worst['mean']:.4f} at {worst['steps']} steps, width "
          f"{worst['width']}; {len(runs)} runs in {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
