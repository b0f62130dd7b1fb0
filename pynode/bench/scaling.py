"""`python -m pynode bench scaling [--json]`: tokens/s with 1 vs 2 local peers.

Each configuration runs `python -m pynode train --peers N` with every peer pinned to its
own core (PYNODE_PIN_CORES=1); a step's time is the slowest rank's sum of its phases (its
agreement round included), from the run's --summary (the first step, which pays for
start-up, is left out). The two configurations alternate for --rounds
rounds, and the scaling is the median over rounds of each 2-peer run against the 1-peer run
just before it: a shared machine's speed drifts 10-40 % between runs, which a single pair
takes for scaling (x1.31, x1.87 and x1.41 in three single pairs of one hour). Traffic is
what each peer's transport sent per step in the last round, packed by the int64 codec
(pynode.comm.wire), and what it would have sent as raw int64 (before the codec), against
the ring all-reduce optimum 2(N-1)/N x gradient bytes.
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
from pynode.run.trainer import PHASES

# Each peer on its own core, and its BLAS with one thread so it stays there.
ONE_CORE_EACH = {"PYNODE_PIN_CORES": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def run_peers(peers: int, cfg: RunConfig, folder: Path) -> dict:
    log, summary = folder / f"log{peers}.jsonl", folder / f"summary{peers}.json"
    flags = []
    for key, value in json.loads(cfg.to_json()).items():
        flags += ["--" + key.replace("_", "-"), str(value)]
    subprocess.run(
        [sys.executable, "-m", "pynode", "train", *flags, "--peers", str(peers),
         "--log", str(log), "--summary", str(summary), "--no-progress"],
        check=True, capture_output=True, env={**os.environ, **ONE_CORE_EACH},
    )
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    tokens = cfg.microbatches * cfg.microbatch_size * cfg.seq
    info = json.loads(summary.read_text())
    phases = info.get("phase_ms_per_step") or {}
    # the whole step, its agreement round included: the slowest rank's phases; where none
    # was timed (one step), the log's, which end at the probe
    whole = [sum(ms.values()) / 1000 for ms in phases.values() if ms]
    seconds = max(whole) if whole else statistics.mean(r["seconds"] for r in rows[1:] or rows)
    return {
        "peers": peers,
        "tokens_per_s": tokens / seconds,
        "final_hash": info["hash"],
        "traffic": info["traffic"],
        "phases": phases,
    }


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
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3,
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
    ratios = [two["tokens_per_s"] / one["tokens_per_s"] for one, two in pairs]
    one, two = pairs[-1]
    traffic = two["traffic"]
    worst = max(traffic["per_rank_bytes_per_step"].values())
    raw = max(traffic["per_rank_unpacked_bytes_per_step"].values())
    result = {
        "config": json.loads(cfg.to_json()),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "tokens_per_s_1": statistics.median(one["tokens_per_s"] for one, _ in pairs),
        "tokens_per_s_2": statistics.median(two["tokens_per_s"] for _, two in pairs),
        "scaling_2_over_1": statistics.median(ratios),
        "scaling_rounds": ratios,
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
