"""What every member of a training group runs (SPMD), whatever the transport.

Leader-follower: rank 0 broadcasts the run's `go` message (pynode.run.protocol: the config
and, when resuming, the checkpoint); a member that cannot train it (its memory, its task
module, its data) says why in the members' roll, so every member stops naming it;
then all members train in lockstep (pynode.run.loop) and rank 0 reports the plan, the loss
and the cluster-wide unit-invocation counts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pynode import platform
from pynode.comm.base import CommError, PeerLost
from pynode.config import RunConfig
from pynode.run.assemble import build_trainer
from pynode.run.loop import OnStep, train
from pynode.run.protocol import read_start, start_message
from pynode.run.trainer import ALONE, Trainer, TrainOptions

log = logging.getLogger("pynode.run")

SETUP_TIMEOUT = 120.0
SETUP_FAILED = b"setup failed: "  # a PeerInfo entry that says why its member cannot start
UNIT_NAMES = ("mul", "requant", "relu")


@dataclass(frozen=True)
class PeerInfo:
    rank: int          # member rank in the group
    device: str        # short hardware description
    cores: int         # usable cores
    ram: int           # available RAM in bytes (0 = unknown)

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PeerInfo:
        return cls(**json.loads(data))


async def share_start(collective, cfg: RunConfig | None, resume: bytes | None) -> bytes:
    """Rank 0's `go` message (its config, and checkpoint if resuming) to every member; read
    it with read_start."""
    leader = collective.rank == 0
    return await collective.broadcast_bytes(
        start_message("go", cfg, resume) if leader else None, timeout=SETUP_TIMEOUT
    )


async def run_member(
    collective,
    cfg: RunConfig | None,
    *,
    resume: bytes | None = None,
    backend: str | None = None,
    kernels: str | None = None,
    check_products: bool = True,
    options: TrainOptions = ALONE,
    on_step: Sequence[OnStep] = (),
    report: Callable[[str], None] = print,
    prepare: Callable[[Trainer], None] | None = None,
) -> tuple[Trainer, dict, dict[str, dict[int, Any]]]:
    """Join the group's run and train it to the end; returns the trainer (final state),
    the traffic each member sent (see report_traffic) and where each member's steps went
    (report_timings)."""
    message = await share_start(collective, cfg, resume)
    try:  # once every member holds the message, each says whether it can train it
        _, cfg, state = read_start(message)
        trainer = build_trainer(cfg, collective, state, backend=backend, kernels=kernels,
                                options=options, check_products=check_products)
        if prepare is not None:
            prepare(trainer)
    except Exception as exc:  # its task, data or memory: the others hear why, not a timeout
        await tell_setup_failed(collective, exc)
        raise
    available = platform.memory_bytes()  # what it lacks was refused by build_trainer
    me = PeerInfo(collective.rank, platform.device_name(), platform.cpu_count(), available)
    infos = await collective.allgather_bytes(me.to_bytes(), timeout=SETUP_TIMEOUT)
    peers = read_peer_infos(infos)
    if collective.rank == 0:
        report(plan_table(peers, trainer.plan()))
    await train(trainer, on_step=on_step)
    await report_unit_counts(collective, trainer, report)
    first_step = state.step if state is not None else 0
    traffic = await report_traffic(collective, trainer, report, steps=cfg.steps - first_step)
    return trainer, traffic, await report_timings(collective, trainer)


async def tell_setup_failed(collective, exc: Exception) -> None:
    """Take part in the members' roll (run_member's PeerInfo allgather) with why this member
    cannot set the run up, so every other member stops at once naming it (read_peer_infos)
    instead of waiting SETUP_TIMEOUT for it; a group already broken hears nothing more."""
    said = str(exc).removeprefix(f"rank {collective.rank}: ")  # read_peer_infos names it
    reason = f"{type(exc).__name__}: {said}".encode(errors="replace")
    try:
        await collective.allgather_bytes(SETUP_FAILED + reason, timeout=SETUP_TIMEOUT)
    except CommError:
        pass


def read_peer_infos(infos: list[bytes | None]) -> list[PeerInfo]:
    """The members' PeerInfo entries; PeerLost naming the first member that could not set
    the run up (tell_setup_failed), with its reason."""
    for rank, entry in enumerate(infos):
        if entry is not None and entry.startswith(SETUP_FAILED):
            reason = entry[len(SETUP_FAILED):].decode(errors="replace")
            raise PeerLost([rank], f"rank {rank} could not take part in the run: {reason}")
    return [PeerInfo.from_bytes(b) for b in infos if b is not None]


def plan_table(peers: list[PeerInfo], plan: dict[int, list[int]]) -> str:
    total = sum(len(v) for v in plan.values()) or 1
    lines = ["rank  device            cores  RAM(MiB)  microbatches  share"]
    for p in peers:
        mine = len(plan.get(p.rank, []))
        lines.append(
            f"{p.rank:<5} {p.device:<17} {p.cores:>5}  {p.ram >> 20:>8}  "
            f"{mine:>12}  {100 * mine / total:4.0f}%"
        )
    return "\n".join(lines)


async def report_unit_counts(collective, trainer: Trainer, report: Callable[[str], None]) -> None:
    """Sum every member's unit counters exactly; rank 0 reports them (refusing zeros)."""
    units = trainer.units
    counts = units.counts.snapshot() if units is not None else {}
    mine = np.array([counts.get(n, 0) for n in UNIT_NAMES], dtype=np.int64)
    total = (await collective.allreduce_int64(mine, timeout=SETUP_TIMEOUT)).total
    if collective.rank == 0 and units is not None:
        if int(total[0]) == 0:
            report("unit invocations: none counted (counting failed); not reported")
            return
        pretty = "  ".join(f"{n} {int(v):,}" for n, v in zip(UNIT_NAMES, total, strict=True))
        report(f"cluster-wide unit invocations: {pretty}")


async def report_timings(collective, trainer: Trainer) -> dict[str, dict[int, Any]]:
    """Where every member's steps went (StepClock.timings), by rank: phase_ms_per_step
    (pynode.run.stepclock.PHASES) and step_ms (each kept step as [step, ms, whether it had a
    check round, the share of steps with one]); a member that sent nothing readable is
    left out."""
    sent = await collective.allgather_bytes(json.dumps(trainer.clock.timings()).encode(),
                                            timeout=SETUP_TIMEOUT)
    timings: dict[str, dict[int, Any]] = {"phase_ms_per_step": {}, "step_ms": {}}
    for rank, blob in enumerate(sent):
        if blob is None:  # it left the group: its own line said so (members_watch)
            continue
        try:
            said = json.loads(blob)
            phases = {str(k): float(v) for k, v in said["phase_ms_per_step"].items()}
            steps = [[int(s), float(ms), bool(checked), float(share)]
                     for s, ms, checked, share in said["step_ms"]]
        except (TypeError, ValueError, AttributeError, KeyError):
            log.warning("rank %d sent no readable step times", rank)
            continue
        timings["phase_ms_per_step"][rank] = phases
        timings["step_ms"][rank] = steps
    return timings


async def report_traffic(collective, trainer: Trainer, report, steps: int) -> dict:
    """Bytes each member sent per step, as packed by the int64 codec and as they would be
    raw (pynode.comm.wire), next to the ring all-reduce optimum 2(N-1)/N x G of raw int64,
    and what it handed over in shared memory (a loopback pair: no wire)."""
    sent = await collective.allgather_bytes(
        f"{collective.bytes_sent} {collective.bytes_saved} {collective.bytes_shared}".encode(),
        timeout=SETUP_TIMEOUT,
    )
    counts = {r: [int(v) for v in b.split()] for r, b in enumerate(sent) if b is not None}
    n, per = len(sent), max(steps, 1)  # a rank that left counts among the peers, not its bytes
    grad_bytes = 8 * sum(p.size for p in trainer.state.params.values())
    optimum = 2 * (n - 1) / n * grad_bytes if n > 1 else 0.0
    traffic = {"per_rank_bytes_per_step": {r: c[0] / per for r, c in counts.items()},
               "per_rank_unpacked_bytes_per_step": {r: (c[0] + c[1]) / per
                                                    for r, c in counts.items()},
               "per_rank_shared_bytes_per_step": {r: c[2] / per for r, c in counts.items()},
               "ring_optimum_bytes_per_step": optimum, "gradient_bytes": grad_bytes}
    if collective.rank == 0 and n > 1:
        worst = max(c[0] for c in counts.values()) / per
        raw = max(c[0] + c[1] for c in counts.values()) / per
        shared = max(c[2] for c in counts.values()) / per
        if shared:  # a local pair: its vectors cross no wire, so no ratio to the optimum
            report(f"traffic: up to {shared / 1e6:.2f} MB per peer per step handed over in "
                   f"shared memory (local peers), {worst / 1e6:.3f} MB sent on the socket")
        else:
            report(f"traffic: up to {worst / 1e6:.2f} MB sent per peer per step, "
                   f"{raw / 1e6:.2f} MB as raw int64 (ring all-reduce optimum "
                   f"{optimum / 1e6:.2f} MB, ratio {worst / optimum:.2f})")
    return traffic
