"""`python -m pynode bench scaling [--json]`: tokens/s with 1 vs 2 local peers.

Each configuration runs `python -m pynode train --peers N` with every peer pinned to its
own core (PYNODE_PIN_CORES=1). A step's time is its whole time (its agreement round
included) on the slowest rank, from the run's --summary (step_ms: every step but the
first, which pays for start-up). Two things make a short run's mean a poor figure, so:
- The steps of a group that have a cross-check round recompute a microbatch (~c more);
  which steps those are is drawn from (seed, step), so a short run holds more or fewer of
  them than a long run would (seed 1's steps 2-20 hold one, where 2.4 are expected). A
  run's step is its plain steps' median plus the share of steps that have a round under
  its plans (crosscheck.picked_share) times what its steps with one took more (the other
  rounds' median where a run timed one kind only).
- A shared machine stalls a step now and then (tens of ms where a step takes 60): the
  median of the steps, not their mean. The report gives the scaling with each run's mean
  step too, which counts the stalls.
The two configurations alternate for --rounds rounds, and the scaling is the median over
rounds of each 2-peer run against the 1-peer run just before it: a shared machine's speed
drifts 10-40 % between runs, which a single pair takes for scaling (x1.31, x1.87 and
x1.41 in three single pairs of one hour). Traffic is what each peer's transport sent per
step in the last round and what it handed over in shared memory (a pair of local peers
puts its vectors there: pynode/comm/shared.py), against the ring all-reduce optimum
2(N-1)/N x gradient bytes. What a wire would carry is measured on a peer's real step
vector: one step trained here, the vector of half its microbatches (a peer of two) packed
by the int64 codec as the network transports send it (pynode.comm.wire), and unpacked again
to the same values.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pynode.bench import CONFIG_HELP, bench_parser
from pynode.bench.machine import machine_info, machine_line
from pynode.config import RunConfig
from pynode.run.stepclock import PHASES

# Each peer on its own core, and its BLAS with one thread so it stays there.
ONE_CORE_EACH = {"PYNODE_PIN_CORES": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def run_peers(peers: int, cfg: RunConfig, folder: Path) -> dict:
    """One `train --peers N` run: its timed steps by kind (group_steps), and its final
    hash, traffic and phases."""
    log, summary = folder / f"log{peers}.jsonl", folder / f"summary{peers}.json"
    log.unlink(missing_ok=True)  # --log appends: this run's rows only, not the last round's
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
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return {
        "peers": peers,
        "plain": [ms for ms, checked, _ in steps if not checked],
        "checked": [ms for ms, checked, _ in steps if checked],
        # the share of steps with a check round under the run's plans (0 alone, and where
        # nothing was timed)
        "share": statistics.fmean(share for _, _, share in steps) if steps else 0.0,
        # where nothing was timed (one step, or --sync-every): the log's, which end at the probe
        "log_ms": 1000 * statistics.median(r["seconds"] for r in rows[1:] or rows),
        "final_hash": info["hash"],
        "traffic": info["traffic"],
        "phases": info.get("phase_ms_per_step") or {},
    }


def group_steps(step_ms: dict[str, list]) -> list[tuple[float, bool, float]]:
    """The group's timed steps, (ms, whether it had a check round, the share of steps with
    one under its plan): each step's time on its slowest rank, for the steps every rank
    timed (a summary's step_ms)."""
    ranks = [{int(s): (float(ms), bool(checked), float(share))
              for s, ms, checked, share in rows} for rows in step_ms.values()]
    if not ranks:
        return []
    common = sorted(set.intersection(*(set(times) for times in ranks)))
    return [(max(times[s][0] for times in ranks), any(times[s][1] for times in ranks),
             ranks[0][s][2]) for s in common]


def round_extra(runs: list[dict], typical) -> float | None:
    """What a step with a check round took more than a plain one (`typical` of each: the
    median or the mean), the median over the runs that timed both kinds; None if none."""
    extra = [typical(r["checked"]) - typical(r["plain"])
             for r in runs if r["checked"] and r["plain"]]
    return statistics.median(extra) if extra else None


def typical_step_ms(run: dict, typical, extra: float | None) -> float:
    """A run's step: `typical` of its plain steps, with a check round's cost (the run's own,
    else `extra`, the other runs') in the share of steps that have one. Only where it timed
    no step, its log's."""
    share, plain, checked = run["share"], run["plain"], run["checked"]
    if plain and checked:
        return typical(plain) + share * (typical(checked) - typical(plain))
    if plain:
        return typical(plain) + share * (extra or 0.0)
    if checked:  # a round in every step timed
        return typical(checked) - (1.0 - share) * (extra or 0.0)
    return run["log_ms"]


def scaling(pairs: list[tuple[dict, dict]], tokens: int,
            typical) -> tuple[list, list, float | None]:
    """Each round's tokens/s at (1 peer, 2 peers) and its ratio, `typical` step of each, and
    what a check round cost the 2-peer runs (round_extra)."""
    extra = round_extra([two for _, two in pairs], typical)
    speeds = [(1000 * tokens / typical_step_ms(one, typical, None),
               1000 * tokens / typical_step_ms(two, typical, extra)) for one, two in pairs]
    return speeds, [two / one for one, two in speeds], extra


def phase_table(one: dict, two: dict) -> list[str]:
    """Milliseconds per step in each phase (pynode.run.stepclock.PHASES) and their sum: the
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
    parser = bench_parser("scaling", __doc__)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--steps", type=int, default=20,
                        help="steps of each run (the first, which starts up, is not timed)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternations of 1 and 2 peers; the scaling is their median")
    parser.add_argument("--config", default="{}", help=CONFIG_HELP)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be 1 or more, got {args.rounds}")
    cfg = RunConfig.from_dict({"microbatches": 8, **json.loads(args.config), "steps": args.steps})
    codec = measure_codec(cfg)
    pairs = []  # (1 peer, 2 peers) of each round
    with tempfile.TemporaryDirectory(prefix="pynode-bench-") as tmp:
        for _ in range(args.rounds):
            pairs.append((run_peers(1, cfg, Path(tmp)), run_peers(2, cfg, Path(tmp))))
    result = report(pairs, cfg, codec)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print("\n".join(report_lines(result, cfg)))
    return 0


def measure_codec(cfg: RunConfig) -> dict:
    """The int64 codec on a real step vector: one step of `cfg` trained here, then the
    vector a peer of two contributes (half the microbatches) packed as the network
    transports pack it, in bytes before and after, and whether it unpacks to itself."""
    import asyncio

    from pynode.comm.wire import pack_message, unpack_message
    from pynode.run.assemble import build_trainer

    trainer = build_trainer(cfg)
    asyncio.run(trainer.step())
    vector = trainer.microbatch_partial(list(range(cfg.microbatches // 2 or 1)))
    packed = pack_message({}, vector)
    _, back = unpack_message(packed)
    return {"values": int(vector.size), "raw_bytes": len(pack_message({})) + vector.nbytes,
            "packed_bytes": len(packed), "identical": bool(np.array_equal(back, vector))}


def report(pairs: list[tuple[dict, dict]], cfg: RunConfig, codec: dict) -> dict:
    """The JSON report of the rounds' runs; `codec` is measure_codec's."""
    # a --sync-every run times its full outer steps, H steps' tokens each
    tokens = cfg.microbatches * cfg.microbatch_size * cfg.seq * cfg.sync_every
    speeds, ratios, extra = scaling(pairs, tokens, statistics.median)
    _, by_means, _ = scaling(pairs, tokens, statistics.fmean)
    twos = [two for _, two in pairs]
    one, two = pairs[-1]
    traffic = two["traffic"]
    worst = max(traffic["per_rank_bytes_per_step"].values())
    return {
        "config": json.loads(cfg.to_json()),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "tokens_per_s_1": statistics.median(one for one, _ in speeds),
        "tokens_per_s_2": statistics.median(two for _, two in speeds),
        "scaling_2_over_1": statistics.median(ratios),
        "scaling_rounds": ratios,
        # the same with each run's mean step instead of its median (its stalls counted)
        "scaling_2_over_1_means": statistics.median(by_means),
        # the cross-check's rounds in the 2-peer runs: the share of steps that have one,
        # what such a step took more than a plain one (median over the runs that timed
        # both kinds; None: none did, and the figures leave the rounds out), and each run's
        # [steps with a round, steps timed]
        "check_round_share": statistics.median(r["share"] for r in twos),
        "check_round_ms": extra,
        "check_rounds_timed": [[len(r["checked"]), len(r["checked"]) + len(r["plain"])]
                               for r in twos],
        "same_final_hash": len({run["final_hash"] for pair in pairs for run in pair}) == 1,
        "bytes_per_peer_per_step": traffic["per_rank_bytes_per_step"],
        "unpacked_bytes_per_peer_per_step": traffic["per_rank_unpacked_bytes_per_step"],
        "shared_bytes_per_peer_per_step": traffic.get("per_rank_shared_bytes_per_step", {}),
        # the codec on a peer's step vector (measure_codec): raw int64 over packed bytes
        "codec": codec,
        "packing_ratio": codec["raw_bytes"] / codec["packed_bytes"],
        "ring_optimum_bytes_per_step": traffic["ring_optimum_bytes_per_step"],
        "traffic_over_optimum": worst / traffic["ring_optimum_bytes_per_step"],
        # ms per step in each phase (pynode.run.stepclock.PHASES), by rank, of the last
        # round's 1-peer and 2-peer runs
        "phase_ms_per_step_1": one["phases"],
        "phase_ms_per_step_2": two["phases"],
        "machine": machine_info(),
    }


def report_lines(result: dict, cfg: RunConfig) -> list[str]:
    """The report for a reader."""
    rounds = result["scaling_rounds"]
    lines = [f"machine: {machine_line(result['machine'])}", f"config: {cfg.to_json()}",
             f"1 peer : {result['tokens_per_s_1']:9.0f} tokens/s (median of {len(rounds)})",
             f"2 peers: {result['tokens_per_s_2']:9.0f} tokens/s   "
             f"scaling x{result['scaling_2_over_1']:.2f} (median of rounds: "
             + ", ".join(f"x{r:.2f}" for r in rounds) + "); with each run's mean step "
             f"instead of its median: x{result['scaling_2_over_1_means']:.2f}"]
    held, timed = (sum(n[i] for n in result["check_rounds_timed"]) for i in (0, 1))
    share, extra = result["check_round_share"], result["check_round_ms"]
    if extra is not None:
        lines.append(f"cross-check rounds: {held} of the 2-peer runs' {timed} timed steps; "
                     f"each took {extra:.1f} ms more (median), weighed by the "
                     f"{100 * share:.1f} % of steps that have one")
    elif share:
        lines.append(f"cross-check rounds: {held} of the 2-peer runs' {timed} timed steps, "
                     f"not both kinds in one run, so these figures leave out the "
                     f"{100 * share:.1f} % of steps that have one; run more --steps")
    worst = max(result["bytes_per_peer_per_step"].values())
    shared = max(result["shared_bytes_per_peer_per_step"].values(), default=0.0)
    codec = result["codec"]
    lines += [f"same final hash: {result['same_final_hash']}",
              f"bytes per peer per step: {worst / 1e6:.3f} MB sent, {shared / 1e6:.3f} MB "
              "handed over in shared memory (local peers)",
              f"int64 codec on a peer's step vector ({codec['values']:,} values), as a network "
              f"transport sends it: {codec['raw_bytes'] / 1e6:.3f} MB as raw int64 (before), "
              f"{codec['packed_bytes'] / 1e6:.3f} MB packed (after): "
              f"{result['packing_ratio']:.2f}x fewer; unpacks to the same values: "
              f"{codec['identical']}",
              f"ring optimum of raw int64 {result['ring_optimum_bytes_per_step'] / 1e6:.3f} "
              f"MB (sent x{result['traffic_over_optimum']:.2f})"]
    table = phase_table(result["phase_ms_per_step_1"], result["phase_ms_per_step_2"])
    if table:
        lines.append("where a step goes (last round; the first step, which starts up, left out):")
        lines += table
    else:
        lines.append("where a step goes: not measured (only a run's first step, which starts "
                     "up, ran; use --steps 2 or more)")
    return lines
