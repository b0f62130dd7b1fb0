"""--sync-every H vs per-step training at equal tokens: final held-out loss, bytes per token.

    python benchmarks/sync_every.py --steps 600 --sync-every 50 --replicas 4 --seeds 1 2 3

For each seed both runs train the same config on the same data (the same microbatches of
every step: R replicas of --sync-every together read what the per-step run reads) and are
measured by the held-out loss of their final weights (eval_every = steps). Bytes are
measured once per mode: the real run protocol with 2 peers over the in-memory mesh
(pynode.bench.mesh_sim: webrtc collective, packed int64 codec, control word, hash check),
bytes sent per peer after the first (outer) step, divided by the tokens trained meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from pynode.config import RunConfig
from pynode.run.assemble import build_trainer


def final_heldout(cfg: RunConfig) -> tuple[float, float]:
    """(held-out loss of the final weights, seconds) of a run of `cfg` on one peer."""
    trainer = build_trainer(cfg)

    async def run() -> float:
        last = None
        while trainer.state.step < cfg.steps:
            last = await trainer.step()
        return last.heldout

    started = time.perf_counter()
    loss = asyncio.run(run())
    return loss, time.perf_counter() - started


def bytes_per_token(cfg: RunConfig, peers: int) -> float:
    """Mean bytes a peer sends per training token in a run of `cfg` by `peers` room peers
    in memory, after its first (outer) step (pynode.bench.mesh_sim.simulate)."""
    from pynode.bench.mesh_sim import run_sizes

    row = run_sizes([peers], cfg)[0]
    return row["bytes_per_peer_per_step_mean"] / (cfg.microbatches * cfg.microbatch_size
                                                  * cfg.seq)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--sync-every", type=int, default=50)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--config", default='{"microbatches": 8}',
                        help="RunConfig overrides as JSON (both modes)")
    parser.add_argument("--bytes-steps", type=int, default=0,
                        help="steps of the 2-peer byte measurement (default 2 outer steps)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = RunConfig.from_dict({**json.loads(args.config), "steps": args.steps,
                                "eval_every": args.steps})
    outer = base.with_(sync_every=args.sync_every, replicas=args.replicas)
    rows = []
    for seed in args.seeds:
        step_loss, t_step = final_heldout(base.with_(seed=seed))
        outer_loss, t_outer = final_heldout(outer.with_(seed=seed))
        rows.append({"seed": seed, "per_step_loss": step_loss, "sync_every_loss": outer_loss,
                     "ratio": outer_loss / step_loss, "per_step_seconds": t_step,
                     "sync_every_seconds": t_outer})
        if not args.json:
            print(f"seed {seed}: per-step {step_loss:.4f}  sync-every {outer_loss:.4f}  ratio "
                  f"{outer_loss / step_loss:.4f}  ({t_step:.0f}s vs {t_outer:.0f}s)", flush=True)
    short = args.bytes_steps or 2 * args.sync_every
    per_step_bytes = bytes_per_token(base.with_(steps=short, eval_every=0), 2)
    outer_bytes = bytes_per_token(outer.with_(steps=short, eval_every=0), 2)
    ratios = [r["ratio"] for r in rows]
    summary = {"config": json.loads(outer.to_json()), "rows": rows,
               "ratio_min": min(ratios), "ratio_max": max(ratios),
               "ratio_mean": sum(ratios) / len(ratios),
               "bytes_per_token_per_step": per_step_bytes,
               "bytes_per_token_sync_every": outer_bytes,
               "bytes_reduction": per_step_bytes / outer_bytes}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return
    print(f"loss ratio sync-every/per-step: mean {summary['ratio_mean']:.4f}, range "
          f"{summary['ratio_min']:.4f}-{summary['ratio_max']:.4f}")
    print(f"bytes per token per peer (2 peers, {short} steps): per-step {per_step_bytes:.2f}, "
          f"sync-every {outer_bytes:.3f}: {summary['bytes_reduction']:.1f}x fewer")


if __name__ == "__main__":
    main()
