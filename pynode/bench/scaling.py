"""`python -m pynode bench scaling [--json]`: tokens/s with 1 vs 2 local peers, one run.

Each configuration runs `python -m pynode train --peers N` with every peer pinned to its
own core (PYNODE_PIN_CORES=1); step times come from the run's own --log (the first step,
which pays for start-up, is left out). Traffic is what each peer's transport sent per
step, packed by the int64 codec (pynode.comm.wire), and what it would have sent as raw
int64 (before the codec), against the ring all-reduce optimum 2(N-1)/N x gradient bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pynode.bench.machine import machine_info, machine_line
from pynode.config import RunConfig

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
    timed = [r["seconds"] for r in rows[1:]] or [rows[0]["seconds"]]
    tokens = cfg.microbatches * cfg.microbatch_size * cfg.seq
    info = json.loads(summary.read_text())
    return {
        "peers": peers,
        "tokens_per_s": tokens * len(timed) / sum(timed),
        "final_hash": info["hash"],
        "traffic": info["traffic"],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pynode bench scaling")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--config", default="{}", help="RunConfig overrides as JSON")
    args = parser.parse_args(argv)
    cfg = RunConfig.from_dict({"microbatches": 8, **json.loads(args.config), "steps": args.steps})
    with tempfile.TemporaryDirectory(prefix="pynode-bench-") as tmp:
        one, two = run_peers(1, cfg, Path(tmp)), run_peers(2, cfg, Path(tmp))
    traffic = two["traffic"]
    worst = max(traffic["per_rank_bytes_per_step"].values())
    raw = max(traffic["per_rank_unpacked_bytes_per_step"].values())
    result = {
        "config": json.loads(cfg.to_json()),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "tokens_per_s_1": one["tokens_per_s"],
        "tokens_per_s_2": two["tokens_per_s"],
        "scaling_2_over_1": two["tokens_per_s"] / one["tokens_per_s"],
        "same_final_hash": one["final_hash"] == two["final_hash"],
        "bytes_per_peer_per_step": traffic["per_rank_bytes_per_step"],
        "unpacked_bytes_per_peer_per_step": traffic["per_rank_unpacked_bytes_per_step"],
        "packing_ratio": raw / worst,
        "ring_optimum_bytes_per_step": traffic["ring_optimum_bytes_per_step"],
        "traffic_over_optimum": worst / traffic["ring_optimum_bytes_per_step"],
        "machine": machine_info(),
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(f"machine: {machine_line(result['machine'])}")
    print(f"config: {cfg.to_json()}")
    print(f"1 peer : {one['tokens_per_s']:9.0f} tokens/s")
    print(f"2 peers: {two['tokens_per_s']:9.0f} tokens/s   "
          f"scaling x{result['scaling_2_over_1']:.2f}")
    print(f"same final hash: {result['same_final_hash']}")
    print(f"bytes per peer per step: {raw / 1e6:.3f} MB as raw int64 (before), "
          f"{worst / 1e6:.3f} MB packed (after): {result['packing_ratio']:.2f}x fewer")
    print(f"ring optimum of raw int64 {traffic['ring_optimum_bytes_per_step'] / 1e6:.3f} MB "
          f"(sent x{result['traffic_over_optimum']:.2f})")
    return 0
