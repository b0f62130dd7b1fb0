"""int8 / float learning parity over a grid of schedules, widths and seeds.

    python benchmarks/parity_grid.py                       # the issue #19 grid, 2 workers
    python benchmarks/parity_grid.py --steps 150 --widths 64 --seeds 1 2 3 --jobs 1
    python benchmarks/parity_grid.py --json > grid.json    # every run, then the cells
    python benchmarks/parity_grid.py --float-runs float.json    # reuse the float task's runs

One cell is (steps, width): the default task (`gpt`, int8) and the plain-float task
(`float`, torch) train the same config, seed and data; the measure is the mean loss of the
last 10 steps of each, and the cell's figure is the mean over seeds of int8 / float.
Everything but `steps`, `width` and `seed` is the default RunConfig (or --config).

Runs are independent processes (--jobs at a time), each on one thread: this measures
loss, not speed, and a shared machine gives the same losses whatever its load.
The float task's losses do not depend on the int8 numerics: with --float-runs FILE its runs
are read from FILE when there (same steps, width, seed and overrides) and written to it
when new, so a change of the int8 model re-runs only the int8 half of the grid.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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


def grid(steps, widths, seeds, overrides="{}", jobs=2,
         float_runs: str | None = None, tasks=("gpt", "float")) -> tuple[list[dict], list[dict]]:
    """Train every (task, steps, width, seed), `jobs` processes at a time; (runs, cells).

    float_runs: a JSON file of float-task runs to reuse and extend (None: run them all);
    tasks: ("float",) only fills that file (no cells then)."""
    cached = _read_float_runs(float_runs, overrides)
    work = [(task, s, w, seed, overrides) for w in sorted(widths, reverse=True)
            for s in sorted(steps, reverse=True) for seed in seeds for task in tasks
            if (task, s, w, seed) not in cached]
    runs: list[dict] = []
    with contextlib.ExitStack() as stack:
        if jobs == 1:
            results = map(run_cell, work)
        else:  # longest first
            pool = stack.enter_context(ProcessPoolExecutor(jobs, initializer=one_thread))
            results = pool.map(run_cell, work)
        for run in results:
            runs.append(run)
            if float_runs is not None and run["task"] == "float":
                _add_float_run(float_runs, overrides, run)  # kept as soon as it is done
    wanted = {(s, w, seed) for s in steps for w in widths for seed in seeds}
    runs += [r for key, r in cached.items() if key[1:] in wanted]
    return runs, cells(runs) if "gpt" in tasks else []


def _read_float_runs(path: str | None, overrides: str) -> dict[tuple, dict]:
    if path is None or not os.path.exists(path):
        return {}
    with open(path) as f:
        stored = json.load(f)
    return {("float", r["steps"], r["width"], r["seed"]): r for r in stored["runs"]
            if r["task"] == "float" and r["config"] == json.loads(overrides)}


def _add_float_run(path: str, overrides: str, run: dict) -> None:
    stored = {"runs": []}
    if os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
    stored["runs"].append({**run, "config": json.loads(overrides)})
    with open(path, "w") as f:
        json.dump(stored, f, sort_keys=True, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, nargs="+", default=list(STEPS))
    parser.add_argument("--widths", type=int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--config", default="{}", help="other RunConfig overrides as JSON")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--float-runs", metavar="FILE",
                        help="float-task runs to reuse, and to add the new ones to (JSON)")
    parser.add_argument("--float-only", action="store_true",
                        help="only fill --float-runs FILE with the float task's runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    one_thread()
    started = time.perf_counter()
    runs, table = grid(args.steps, args.widths, args.seeds, args.config, args.jobs,
                       args.float_runs, ("float",) if args.float_only else ("gpt", "float"))
    if args.float_only:
        print(f"{len(runs)} float runs in {args.float_runs or '(not kept)'}")
        return
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
