"""`python -m pynode bench scaling [--json]`: tokens/s with 1 vs 2 local peers.

Each configuration runs `python -m pynode train --peers N` with every peer pinned to its
own core (PYNODE_PIN_CORES=1). A step's time is its whole time (its agreement round
included) on the slowest rank, from the run's --summary, the first step (which pays for
start-up) left out. Two things make a short run's mean a poor figure, so:
- The steps of a group that have a cross-check round recompute a microbatch (~c more);
  which steps those are is drawn from (seed, step), so a short run holds more or fewer of
  them than a long run would (seed 1's steps 2-20 hold one, where 2.4 are expected). The
  2-peer step is its plain steps' median plus picked_share (pynode.run.crosscheck) times
  what a step with a round took more (the median of the run's, or of the other rounds'
  where a run had none).
- A shared machine stalls a step now and then (tens of ms where a step takes 60): the
  median of the steps, not their mean.
The two configurations alternate for --rounds rounds, and the scaling is the median over
rounds of each 2-peer run against the 1-peer run just before it: a shared machine's speed
drifts 10-40 % between runs, which a single pair takes for scaling (x1.31, x1.87 and
x1.41 in three single pairs of one hour). Traffic is what each peer's transport sent per
step in the last round, packed by the int64 codec (pynode.comm.wire), and what it would
have sent as raw int64 (before the codec), against the ring all-reduce optimum
2(N-1)/N x gradient bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pynode.bench.machine import machine_info, machine_line
from pynode.config import RunConfig
from pynode.core.plan import microbatch_plan
from pynode.run import crosscheck
from pynode.run.trainer import PHASES

# Each peer on its own core, and its BLAS with one thread so it stays there.
ONE_CORE_EACH = {"PYNODE_PIN_CORES": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def run_peers(peers: int, cfg: RunConfig, folder: Path) -> dict:
    """One `train --peers N` run: its steps' typical time (plain_ms: the median of the steps
    without a check round; round_ms: what those with one took more, None where it had
    none), final hash, traffic and phases."""
    log, summary = folder / f"log{peers}.jsonl", folder / f"summary{peers}.json"
    flags = []
    for key, value in json.loads(cfg.to_json()).items():
        flags += ["--" + key.replace("_", "-"), str(value)]
    subprocess.run(
        [sys.executable, "-m", "pynode", "train", *flags, "--peers", str(peers),
         "--log", str(log), "--summary", str(summary), "--no-progress"],
        check=True, capture_output=True, env={**os.environ, **ONE_CORE_EACH},
    )
    info = json.loads(summary.read_text())
    steps = group_steps(info.get("step_ms") or {})
    plain = [ms for ms, rounded in steps if not rounded]
    rounds = [ms for ms, rounded in steps if rounded]
    if plain:
        plain_ms = statistics.median(plain)
    else:  # one step (nothing timed), or a round in every step: the log's, to the probe
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        plain_ms = 1000 * statistics.median(r["seconds"] for r in rows[1:] or rows)
    return {
        "peers": peers,
        "plain_ms": plain_ms,
        "round_ms": statistics.median(rounds) - plain_ms if rounds and plain else None,
        "timed_steps": len(steps),
        "round_steps": len(rounds),
        "final_hash": info["hash"],
        "traffic": info["traffic"],
        "phases": info.get("phase_ms_per_step") or {},
    }


def group_steps(step_ms: dict[str, list]) -> list[tuple[float, bool]]:
    """The group's timed steps, (ms, whether it had a check round): each step's time on
    the slowest rank, for the steps every rank timed (its summary's step_ms)."""
    ranks = [{int(s): (float(ms), bool(r)) for s, ms, r in rows} for rows in step_ms.values()]
    if not ranks:
        return []
    common = sorted(set.intersection(*(set(times) for times in ranks)))
    return [(max(times[s][0] for times in ranks), any(times[s][1] for times in ranks))
            for s in common]


def step_ms(run: dict, share: float, pooled: float | None) -> float:
    """A run's typical step: its plain steps, and a check round's cost in `share` of them
    (its own measure, else the other rounds' `pooled`, else none measured)."""
    extra = run["round_ms"] if run["round_ms"] is not None else pooled
    return run["plain_ms"] + share * (extra or 0.0)


def phase_table(one: dict, two: dict) -> list[str]:
    """Milliseconds per step in each phase (pynode.run.trainer.PHASES) and their sum: the
    1-peer run and each rank of the 2-peer run (their summaries' phase_ms_per_step)."""
    runs = [("1 peer", one.get("0", {}))]
    runs += [(f"2 peers, rank {r}", two[r]) for r in sorted(two, key=int)]
    names = [p for p in PHASES if any(p in ms for _, ms in runs)]
    if not names:
        return []
    lines = ["ms per step".ljust(18) + "".join(f"{p:>10}" for p in names) + f"{'sum':>10}"]
    for label, ms in runs:
        lines.append(label.ljust(18) + "".join(f"{ms.get(p, 0.0):10.1f}" for p in names)
                     + f"{sum(ms.values()):10.1f}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pynode bench scaling")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--steps", type=int, default=20,
                        help="steps of each run (the first, which starts up, is not timed)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternations of 1 and 2 peers; the scaling is their median")
    parser.add_argument("--config", default="{}", help="RunConfig overrides as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be 1 or more, got {args.rounds}")
    cfg = RunConfig.from_dict({"microbatches": 8, **json.loads(args.config), "steps": args.steps})
    pairs = []  # (1 peer, 2 peers) of each round
    with tempfile.TemporaryDirectory(prefix="pynode-bench-") as tmp:
        for _ in range(args.rounds):
            pairs.append((run_peers(1, cfg, Path(tmp)), run_peers(2, cfg, Path(tmp))))
    # a step's check round, weighed by the share of steps that have one at 2 equal peers
    share = crosscheck.picked_share(cfg, microbatch_plan(cfg.microbatches, {0: 1.0, 1: 1.0}))
    measured = [two["round_ms"] for _, two in pairs if two["round_ms"] is not None]
    pooled = statistics.median(measured) if measured else None
    tokens = cfg.microbatches * cfg.microbatch_size * cfg.seq
    speeds = [(1000 * tokens / step_ms(one, 0.0, None), 1000 * tokens / step_ms(two, share, pooled))
              for one, two in pairs]
    ratios = [two / one for one, two in speeds]
    one, two = pairs[-1]
    traffic = two["traffic"]
    worst = max(traffic["per_rank_bytes_per_step"].values())
    raw = max(traffic["per_rank_unpacked_bytes_per_step"].values())
    result = {
        "config": json.loads(cfg.to_json()),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "tokens_per_s_1": statistics.median(one for one, _ in speeds),
        "tokens_per_s_2": statistics.median(two for _, two in speeds),
        "scaling_2_over_1": statistics.median(ratios),
        "scaling_rounds": ratios,
        # the cross-check's rounds: the share of steps that have one, what such a step
        # took more than a plain one (median over the 2-peer runs that held one; None:
        # none did, and the figures leave it out), and how many each 2-peer run held
        "check_round_share": share,
        "check_round_ms": pooled,
        "check_rounds_timed": [[two["round_steps"], two["timed_steps"]] for _, two in pairs],
        "same_final_hash": len({run["final_hash"] for pair in pairs for run in pair}) == 1,
        "bytes_per_peer_per_step": traffic["per_rank_bytes_per_step"],
        "unpacked_bytes_per_peer_per_step": traffic["per_rank_unpacked_bytes_per_step"],
        "packing_ratio": raw / worst,
        "ring_optimum_bytes_per_step": traffic["ring_optimum_bytes_per_step"],
        "traffic_over_optimum": worst / traffic["ring_optimum_bytes_per_step"],
        # ms per step in each phase (pynode.run.trainer.PHASES), by rank, of the last round's
        # 1-peer and 2-peer runs
        "phase_ms_per_step_1": one["phases"],
        "phase_ms_per_step_2": two["phases"],
        "machine": machine_info(),
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(f"machine: {machine_line(result['machine'])}")
    print(f"config: {cfg.to_json()}")
    print(f"1 peer : {result['tokens_per_s_1']:9.0f} tokens/s (median of {args.rounds})")
    print(f"2 peers: {result['tokens_per_s_2']:9.0f} tokens/s   "
          f"scaling x{result['scaling_2_over_1']:.2f} (median of rounds: "
          + ", ".join(f"x{r:.2f}" for r in ratios) + ")")
    held = sum(two["round_steps"] for _, two in pairs)
    timed = sum(two["timed_steps"] for _, two in pairs)
    if pooled is not None:
        print(f"cross-check rounds: {held} of the 2-peer runs' {timed} timed steps; each "
              f"took {pooled:.1f} ms more (median), weighed by the {100 * share:.1f} % of "
              "steps that have one")
    elif share:
        print(f"cross-check rounds: none in the 2-peer runs' {timed} timed steps, so these "
              f"figures leave out the {100 * share:.1f} % of steps that have one; run more "
              "--steps")
    print(f"same final hash: {result['same_final_hash']}")
    print(f"bytes per peer per step: {raw / 1e6:.3f} MB as raw int64 (before), "
          f"{worst / 1e6:.3f} MB packed (after): {result['packing_ratio']:.2f}x fewer")
    print(f"ring optimum of raw int64 {traffic['ring_optimum_bytes_per_step'] / 1e6:.3f} MB "
          f"(sent x{result['traffic_over_optimum']:.2f})")
    table = phase_table(one["phases"], two["phases"])
    if table:
        print("where a step goes (last round; the first step, which starts up, left out):")
        print("\n".join(table))
    else:
        print("where a step goes: not measured (only a run's first step, which starts up, "
              "ran; use --steps 2 or more)")
    return 0
