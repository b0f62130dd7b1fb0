"""--sync-every H vs per-step training at equal tokens: final held-out loss, bytes per token.

    python benchmarks/sync_every.py --steps 400 --sync-every 50 --replicas 1 2 4 \
        --outer-lr 1.0 --outer-momentum 0.0 --seeds 1 2 3

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
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--sync-every", type=int, default=50)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4],
                        help="replica counts to compare (each against the same per-step run)")
    parser.add_argument("--outer-lr", type=float, default=1.0)
    parser.add_argument("--outer-momentum", type=float, default=0.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--config", default='{"microbatches": 8}',
                        help="RunConfig overrides as JSON (both modes)")
    parser.add_argument("--bytes-steps", type=int, default=0,
                        help="steps of the 2-peer byte measurement (default 2 outer steps)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = RunConfig.from_dict({**json.loads(args.config), "steps": args.steps,
                                "eval_every": args.steps})
    outers = {r: base.with_(sync_every=args.sync_every, replicas=r, outer_lr=args.outer_lr,
                            outer_momentum=args.outer_momentum) for r in args.replicas}
    rows = []
    for seed in args.seeds:
        step_loss, t_step = final_heldout(base.with_(seed=seed))
        row = {"seed": seed, "per_step_loss": step_loss, "per_step_seconds": t_step}
        for r, outer in outers.items():
            loss, seconds = final_heldout(outer.with_(seed=seed))
            row[f"R{r}"] = {"loss": loss, "ratio": loss / step_loss, "seconds": seconds}
        rows.append(row)
        if not args.json:
            print(f"seed {seed}: per-step {step_loss:.4f} ({t_step:.0f}s)" + "".join(
                f"  R={r}: {row[f'R{r}']['loss']:.4f} (x{row[f'R{r}']['ratio']:.4f})"
                for r in outers), flush=True)
    short = args.bytes_steps or 2 * args.sync_every
    per_step_bytes = bytes_per_token(base.with_(steps=short, eval_every=0), 2)
    summary = {"config": json.loads(base.to_json()), "sync_every": args.sync_every,
               "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum,
               "rows": rows, "bytes_per_token_per_step": per_step_bytes, "replicas": {}}
    for r, outer in outers.items():
        ratios = [row[f"R{r}"]["ratio"] for row in rows]
        used = bytes_per_token(outer.with_(steps=short, eval_every=0), 2)
        summary["replicas"][r] = {"ratio_mean": sum(ratios) / len(ratios),
                                  "ratio_min": min(ratios), "ratio_max": max(ratios),
                                  "bytes_per_token": used, "fewer_bytes": per_step_bytes / used}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return
    print(f"per-step: {per_step_bytes:.3f} bytes per token per peer (2 peers)")
    for r, got in summary["replicas"].items():
        print(f"--sync-every {args.sync_every} --replicas {r}: loss x{got['ratio_mean']:.4f} "
              f"({got['ratio_min']:.4f}-{got['ratio_max']:.4f}), {got['bytes_per_token']:.4f} "
              f"bytes per token: {got['fewer_bytes']:.1f}x fewer")


if __name__ == "__main__":
    main()
