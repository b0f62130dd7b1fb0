"""int8 GPT vs the plain-float task: final loss ratio over several seeds (default config).

    python benchmarks/int8_vs_float.py --steps 300 --seeds 1 2 3 [--json]

For each seed both tasks train the same config on the same data; the script reports the
mean loss of the last 10 steps of each and their ratio (int8 / float).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from pynode.config import RunConfig
from pynode.run.assemble import build_trainer


def final_loss(cfg: RunConfig, tail: int = 10) -> tuple[float, float]:
    trainer = build_trainer(cfg)
    losses: list[float] = []

    async def run() -> None:
        while trainer.state.step < cfg.steps:
            losses.append((await trainer.step()).loss)

    started = time.perf_counter()
    asyncio.run(run())
    return sum(losses[-tail:]) / len(losses[-tail:]), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--config", default="{}", help="RunConfig overrides as JSON")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = RunConfig.from_dict({**json.loads(args.config), "steps": args.steps})
    rows = []
    for seed in args.seeds:
        int8, t_int8 = final_loss(base.with_(task="gpt", seed=seed))
        flt, t_flt = final_loss(base.with_(task="float", seed=seed))
        rows.append({"seed": seed, "int8_loss": int8, "float_loss": flt, "ratio": int8 / flt,
                     "int8_seconds": t_int8, "float_seconds": t_flt})
        if not args.json:
            print(f"seed {seed}: int8 {int8:.4f}  float {flt:.4f}  ratio {int8 / flt:.4f}  "
                  f"({t_int8:.0f}s vs {t_flt:.0f}s)", flush=True)
    ratios = [r["ratio"] for r in rows]
    summary = {"config": json.loads(base.to_json()), "rows": rows,
               "ratio_min": min(ratios), "ratio_max": max(ratios),
               "ratio_mean": sum(ratios) / len(ratios)}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"ratio int8/float: mean {summary['ratio_mean']:.4f}, "
              f"range {summary['ratio_min']:.4f}-{summary['ratio_max']:.4f}")


if __name__ == "__main__":
    main()
