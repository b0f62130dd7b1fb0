"""`python -m pynode bench train [--json]`: int8 GPT vs the plain-float task, one run.

Each task trains the same config on the same data in its own fresh process (so peak
memory is that task's alone); the report gives training tokens per second, the ratio
int8 / float measured in this one run, peak resident memory and the final loss.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time

from pynode.bench import CONFIG_HELP, bench_parser
from pynode.bench.machine import machine_info, machine_line
from pynode.config import RunConfig
from pynode.extras import require

# steps per block of the check-on / check-off alternation: one, so a run of 80 steps gives
# 40 adjacent pairs (blocks of 5 gave 6, whose median moved 4-11 % from run to run)
BLOCK = 1


def measure(task: str, cfg: RunConfig, steps: int) -> dict:
    """Train `steps` steps of `task` here; returns tokens/s (after one warm-up step). The
    int8 task trains every other block of steps with the per-call GEMM check off
    (--no-check-products), for the check's cost; tokens/s counts the checked steps, the
    default users run."""
    from pynode.run.assemble import build_trainer

    cfg = cfg.with_(task=task, steps=steps + 1)
    trainer = build_trainer(cfg, check_products=True)
    if trainer.gemm is not None:
        from pynode.gemm_tuning import summary

        gemm = summary(trainer.gemm)
        kernels = trainer.gemm.kernels.name
    else:
        gemm, kernels = "torch float32", "torch"

    check = getattr(trainer.gemm, "check", None)

    async def go() -> tuple[dict, dict, list, float]:
        """Steps and seconds with the per-call GEMM check off and on, in alternating blocks
        so drift falls on both; each block's seconds per step; the loss after the last step."""
        await trainer.step()  # warm-up: imports, first allocations, kernel variants
        if check is not None:
            check.seconds = 0.0
        done, timed = {True: 0, False: 0}, {True: 0.0, False: 0.0}
        blocks: list[tuple[bool, float]] = []
        loss, on = 0.0, False
        while done[True] + done[False] < steps:
            block = min(BLOCK, steps - done[True] - done[False])
            if check is not None:
                trainer.gemm.check = check if on else None
            started = time.perf_counter()
            for _ in range(block):
                loss = (await trainer.step()).loss
            took = time.perf_counter() - started
            timed[on] += took
            done[on] += block
            blocks.append((on, took / block))
            on = not on and check is not None
        if check is not None:
            trainer.gemm.check = check
        return done, timed, blocks, loss

    done, timed, blocks, loss = asyncio.run(go())
    unchecked = timed[False] / done[False]
    per_step = cfg.microbatches * cfg.microbatch_size * cfg.seq
    seconds, checking, share = unchecked, None, None
    if done[True]:  # the int8 task: its default is checked
        seconds = timed[True] / done[True]
        # each checked block against the unchecked block before it: load that drifts
        # during the run falls on both of a pair, and the median drops a disturbed pair
        pairs = [on[1] / off[1] for off, on in zip(blocks[::2], blocks[1::2], strict=False)]
        checking = statistics.median(pairs) - 1.0
        share = check.seconds / done[True] / unchecked  # the check's own clock
    fused = bool(getattr(getattr(trainer.gemm, "kernels", None), "fuses_check", False))
    return {
        "check_overhead": checking,  # step time checked / unchecked - 1 (median of block pairs)
        "check_share": share,  # seconds spent checking per step / an unchecked step
        # the check's sums ride in the kernels' quantize and epilogue passes (Gemm.scaled):
        # its own clock then holds only the products checked on their own
        "check_fused": fused,
        "task": task,
        "backend": getattr(trainer.gemm, "backend_name", "torch-float"),
        "gemm": gemm,
        "kernels": kernels,
        "tokens_per_s": per_step / seconds,
        "seconds_per_step": seconds,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "final_loss": loss,
        "config": json.loads(cfg.to_json()),  # as trained: the warm-up step counted
    }


def main(argv: list[str]) -> int:
    parser = bench_parser("train", __doc__)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per task")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one task here
    parser.add_argument("--config", default="{}", help=CONFIG_HELP)
    args = parser.parse_args(argv)
    require("bench train (it compares the int8 GPT with the float task)", "torch")
    cfg = RunConfig.from_dict(json.loads(args.config))
    if args.one:
        print(json.dumps(measure(args.one, cfg, args.steps)))
        return 0
    rows = {}
    for task in ("gpt", "float"):
        out = subprocess.run(
            [sys.executable, "-m", "pynode", "bench", "train", "--one", task,
             "--steps", str(args.steps), "--config", args.config],
            check=True, capture_output=True, text=True,
        ).stdout
        rows[task] = json.loads(out.strip().splitlines()[-1])
    ratio = rows["gpt"]["tokens_per_s"] / rows["float"]["tokens_per_s"]
    machine = machine_info()
    for row in rows.values():
        row["ratio_to_float"] = row["tokens_per_s"] / rows["float"]["tokens_per_s"]
        row["machine"] = machine
    if args.json:
        for row in rows.values():
            print(json.dumps(row, sort_keys=True))
        return 0
    print(f"machine: {machine_line(machine)}")
    print(f"config: {json.dumps(rows['gpt']['config'], sort_keys=True)}")
    print(f"each task trains it in its own process: 1 warm-up step, then {args.steps} timed "
          "(the float row: task \"float\", the same model in torch float32)")
    print(f"{'task':<6} {'backend':<12} {'tokens/s':>10} {'s/step':>8} {'peak MiB':>9} {'loss':>7}")
    for row in rows.values():
        print(f"{row['task']:<6} {row['backend']:<12} {row['tokens_per_s']:>10.0f} "
              f"{row['seconds_per_step']:>8.3f} {row['peak_rss_mib']:>9.0f} "
              f"{row['final_loss']:>7.4f}")
    print(f"int8 GEMM: {rows['gpt']['gemm']}; kernels: {rows['gpt']['kernels']}")
    overhead, share = rows["gpt"]["check_overhead"], rows["gpt"]["check_share"]
    if overhead is not None:
        own = (f"the checks' own work: {100 * share:.1f} % of an unchecked step"
               if not rows["gpt"].get("check_fused") else
               "its sums ride in the quantize and epilogue passes, so only the steps' "
               f"difference measures it (products checked apart: {100 * share:.1f} %)")
        print("product check (every GEMM product, on by default): "
              f"{100 * overhead:+.1f} % step time (median of adjacent checked / unchecked "
              f"blocks of {BLOCK} step(s)); {own}")
    print(f"int8 / float tokens per second: {ratio:.3f}")
    return 0
