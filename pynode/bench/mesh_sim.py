"""`python -m pynode bench mesh-sim --peers 4,16,64,256 [--json]`: the cost of growth.

Runs the real run protocol (pynode.run.protocol: RoomPeer, its control word, the webrtc
collective, the hash check) with N peers in this process over the in-memory mesh
(MemoryNetwork), each a real trainer, and counts what each peer sent: bytes and messages
per peer per step, and the collectives (protocol rounds) of a step. The first step, which
carries the run's start, is left out. Compute is not what this measures: the global batch
is fixed by the config, so N peers share the same microbatches (most compute none at large
N); everything runs on one core, so seconds per step are those of the whole simulation.

With --sync-every H [--replicas R] each peer count also runs that config (pynode.run.outer:
one exact reduction every H steps) and the table gets its bytes per peer per step (a step
is one inner step: the same tokens as a per-step run's step) and the reduction factor.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from pynode.bench import CONFIG_HELP, bench_parser
from pynode.bench.machine import machine_info, machine_line
from pynode.comm.mesh import MemoryMesh, MemoryNetwork
from pynode.config import RunConfig
from pynode.run.protocol import RoomPeer

DEFAULT_CONFIG = {"microbatches": 8, "steps": 3}
START_WAIT_S = 600.0  # hellos of N peers: N^2 messages, all in this process


class SimPeer:
    """A RoomPeer over the memory mesh, with the mesh's counters at each of its steps."""

    def __init__(self, net: MemoryNetwork, peer_id: str, make_trainer: Any) -> None:
        self.mesh: MemoryMesh = net.join(peer_id)
        self.peer = RoomPeer(self.mesh, make_trainer, self.record)
        self.task = asyncio.ensure_future(self.peer.serve())
        self.at_step: dict[int, tuple[int, int]] = {}  # step -> (bytes, messages) sent by then
        self.hashes: dict[int, str] = {}
        self.finished = asyncio.Event()
        self.error = ""

    def record(self, kind: str, fields: dict) -> None:
        if kind == "step":
            self.at_step[fields["step"]] = (self.mesh.sent_bytes, self.mesh.sent_messages)
            self.hashes[fields["step"]] = fields["hash"]
        elif kind in ("done", "failed"):
            self.error = fields.get("error", "")
            self.finished.set()


async def simulate(peers: int, cfg: RunConfig, make_trainer: Any) -> dict[str, Any]:
    """One run of `cfg` by `peers` peers; what each sent per step after the first reported
    one (with --sync-every: per inner step, after the first outer step)."""
    if cfg.steps < 2 * cfg.sync_every:
        raise ValueError("mesh-sim needs 2 or more (outer) steps: the first is left out")
    net = MemoryNetwork()
    sims = [SimPeer(net, f"p{i:04d}", make_trainer) for i in range(peers)]
    leader = sims[0]
    try:
        deadline = time.monotonic() + START_WAIT_S
        while len(leader.peer.hellos) < peers - 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        ranks = await leader.peer.start(json.loads(cfg.to_json()))
        await asyncio.gather(*(s.finished.wait() for s in sims))
    finally:
        for sim in sims:
            sim.peer.router.stop()
            sim.task.cancel()
    failed = [s.error for s in sims if s.error]
    if failed or len(ranks) != peers:
        raise RuntimeError(f"{peers} peers: {len(ranks)} took part; {failed[:1]}")
    reported = sorted(leader.hashes)
    first, last = reported[0], reported[-1]
    steps = last - first
    per_bytes = [(s.at_step[last][0] - s.at_step[first][0]) / steps for s in sims]
    per_messages = [(s.at_step[last][1] - s.at_step[first][1]) / steps for s in sims]
    coll = leader.peer.last_trainer.collective
    params = leader.peer.last_trainer.size
    return {
        "peers": peers,
        "params": params,
        "raw_gradient_bytes": 8 * params,
        "bytes_per_peer_per_step_max": max(per_bytes),
        "bytes_per_peer_per_step_mean": sum(per_bytes) / peers,
        "leader_bytes_per_step": per_bytes[0],
        "messages_per_peer_per_step_max": max(per_messages),
        "collectives_per_step": coll.seq / len(reported),  # per sync (outer step)
        "same_hash_everywhere": len({s.hashes[last] for s in sims}) == 1,
        "final_hash": leader.hashes[last],
    }


def run_sizes(sizes: list[int], cfg: RunConfig,
              outer: RunConfig | None = None) -> list[dict[str, Any]]:
    """One row per peer count; with `outer` (a --sync-every config) its row under
    "sync_every" in each."""
    from pynode.browser import run_checks

    checks = run_checks()
    if not checks.ready:
        raise RuntimeError("the start-up checks failed on this machine")
    rows = []
    for peers in sizes:
        started = time.perf_counter()
        row = asyncio.run(simulate(peers, cfg, checks.make_trainer))
        row["seconds_per_step"] = (time.perf_counter() - started) / cfg.steps
        if outer is not None:
            row["sync_every"] = asyncio.run(simulate(peers, outer, checks.make_trainer))
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| peers | sent per peer per step (max / mean) | leader | x raw gradient (max) "
             "| messages per peer per step | collectives per step | s per step (all peers) |",
             "|---|---|---|---|---|---|---|"]
    if rows and "sync_every" in rows[0]:
        lines[0] += " sync-every: sent per peer per step (max / mean) | fewer bytes (mean) |"
        lines[1] += "---|---|"
    for r in rows:
        lines.append(
            f"| {r['peers']} | {r['bytes_per_peer_per_step_max'] / 1e6:.3f} / "
            f"{r['bytes_per_peer_per_step_mean'] / 1e6:.3f} MB "
            f"| {r['leader_bytes_per_step'] / 1e6:.3f} MB "
            f"| {r['bytes_per_peer_per_step_max'] / r['raw_gradient_bytes']:.2f} "
            f"| {r['messages_per_peer_per_step_max']:.0f} | {r['collectives_per_step']:.1f} "
            f"| {r['seconds_per_step']:.1f} |")
        if "sync_every" in r:
            o = r["sync_every"]
            fewer = r["bytes_per_peer_per_step_mean"] / max(o["bytes_per_peer_per_step_mean"], 1)
            lines[-1] += (f" {o['bytes_per_peer_per_step_max'] / 1e6:.4f} / "
                          f"{o['bytes_per_peer_per_step_mean'] / 1e6:.4f} MB | x{fewer:.0f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = bench_parser("mesh-sim", __doc__)
    parser.add_argument("--peers", default="4,16,64,256", help="peer counts, comma-separated")
    parser.add_argument("--config", default="{}", help=CONFIG_HELP)
    parser.add_argument("--sync-every", type=int, metavar="H",
                        help="also run each peer count with one reduction every H steps")
    parser.add_argument("--replicas", type=int, metavar="R", default=1,
                        help="virtual replicas of the --sync-every runs (default 1)")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    try:
        sizes = [int(p) for p in args.peers.split(",")]
    except ValueError:
        parser.error(f"--peers takes whole numbers separated by commas, got {args.peers!r}")
    if any(p < 1 for p in sizes):
        parser.error(f"--peers takes counts of 1 or more, got {args.peers!r}")
    cfg = RunConfig.from_dict({**DEFAULT_CONFIG, **json.loads(args.config)})
    outer = None
    if args.sync_every is not None:
        outer = cfg.with_(sync_every=args.sync_every, replicas=args.replicas,
                          steps=max(cfg.steps, 2 * args.sync_every))
    rows = run_sizes(sizes, cfg, outer)
    result = {"config": json.loads(cfg.to_json()), "rows": rows, "machine": machine_info()}
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(f"machine: {machine_line(result['machine'])}")
    print(f"config: {cfg.to_json()}")
    print(f"gradient: {rows[0]['params']:,} parameters, {rows[0]['raw_gradient_bytes'] / 1e6:.3f} "
          "MB as raw int64; sync every step"
          + (f", and every {outer.sync_every} steps over {outer.replicas} replicas "
             f"({outer.steps} steps)" if outer else ""))
    print(table(rows))
    same = all(r["same_hash_everywhere"] and r.get("sync_every", r)["same_hash_everywhere"]
               for r in rows)
    across = len({r["final_hash"] for r in rows}) == 1 and len(
        {r.get("sync_every", rows[0])["final_hash"] for r in rows}) == 1
    print(f"same final hash on every peer: {same}; across peer counts: {across}")
    return 0
