"""A gloo cluster behind one rank of a room: which runs it trains, and how its ranks follow.

Cluster rank 0 is the *bridge*: its room peer (`pynode join --cluster`) runs the room's run
protocol, and its trainer's collective is a pynode.comm.bridge.BridgeCollective over the
cluster and the room. Ranks > 0 run `follow_bridge`: they wait for the bridge's `go` (config
and state, read like every start by pynode.run.protocol.read_start), build the same trainer
and mirror each collective it calls. To the room the cluster is one rank; that rank's
microbatches, and its share of the cross-check's recomputations, are split over the
cluster (TrainOptions.share). Before every step the bridge tells its ranks the room's view
and the planning capacities (`ClusterBridge.before_step`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from pynode.comm.base import Collective, PeerLost
from pynode.comm.bridge import FOLLOW_WAIT_S, BridgeCollective, ClusterLink, RunEnded
from pynode.config import RunConfig
from pynode.core.errors import DaisyError
from pynode.run.loop import OnStep, train
from pynode.run.protocol import decode, encode, read_start, start_message
from pynode.run.speed import UNKNOWN, is_known
from pynode.run.trainer import Trainer


def agreement_entry(entries: list[bytes | None]) -> bytes:
    """What the cluster publishes for the trainer's (state hash, probe | speed) exchange:
    the common vote with the summed speed, or a vote no peer can share if ranks differ.
    For the cross-check's digests (`{microbatch: digest}|0`, each rank recomputing its
    share of the cluster's picks) it publishes their union, or, where a rank is missing
    or two give one microbatch different digests, an entry nobody reads as digests."""
    votes = [e.partition(b"|") for e in entries if e is not None]
    if votes and all(v[0].startswith(b"{") for v in votes):
        return _digest_union([v[0] for v in votes], len(votes) == len(entries))
    if len(votes) == len(entries) and len({v[0] for v in votes}) == 1:
        return votes[0][0] + b"|" + repr(cluster_speed([v[2] for v in votes])).encode()
    return b"cluster ranks disagree:" + b",".join(v[0] for v in votes) + b"|1.0"


def cluster_speed(speeds: list[bytes]) -> float:
    """The cluster's speed from its ranks': their sum, each rank that knows none yet
    (speed.UNKNOWN, past only its warm-up) counted at the known ranks' mean; UNKNOWN when
    no rank knows."""
    known = [s for s in map(float, speeds) if is_known(s)]
    return sum(known) * len(speeds) / len(known) if known else UNKNOWN


def _digest_union(shares: list[bytes], complete: bool) -> bytes:
    union: dict[int, int] = {}
    try:
        for share in shares:
            for index, digest in json.loads(share).items():
                if union.setdefault(int(index), digest) != digest:
                    complete = False
    except (ValueError, TypeError, AttributeError):
        complete = False
    if not complete:
        return b"cluster ranks disagree on their digests|0"
    return json.dumps({str(i): union[i] for i in sorted(union)}).encode() + b"|0"


class ClusterBridge:
    """Rank 0's side of the cluster: announces runs and keeps the other ranks in step."""

    def __init__(self, inner: Collective) -> None:
        self.inner = inner
        self.link = ClusterLink(inner)
        self.pending: bytes | None = None  # the next run's `go`, sent at its first step

    def start(self) -> None:
        self.link.start()

    def wrap(self, outer: Collective, cfg: RunConfig, state: bytes | None) -> BridgeCollective:
        """The collective of the bridge's trainer for a run of `cfg` from `state`
        (checkpoint bytes, None for a fresh run); the others hear of it at the first step."""
        self.link.active = True
        self.pending = start_message("go", cfg, state)
        return BridgeCollective(self.inner, outer, self.link, publish=agreement_entry)

    async def before_step(self, trainer: Trainer) -> None:
        """A loop hook: the run's `go` (first step only), then the room's view: the planning
        capacities and the distrusted ranks, so every rank plans the step alike."""
        timeout = trainer.deadline()
        if self.pending is not None:
            message, self.pending = self.pending, None
            await self.link.broadcast(message, timeout)
        caps = {str(r): c for r, c in trainer.capacities.items()}
        view = {"t": "view", "capacities": caps, "distrusted": sorted(trainer.distrusted)}
        await trainer.collective.share(view, b"", timeout)

    async def end_run(self) -> None:
        """The bridge's run is over (done or failed): release the other ranks."""
        if self.link.active:
            self.link.active = False
            if self.pending is None:  # they heard of the run: they may wait inside it
                await self.link.broadcast(encode("end"), FOLLOW_WAIT_S)
            self.pending = None

    async def stop(self) -> None:
        self.link.close()
        await self.link.broadcast(encode("stop"), FOLLOW_WAIT_S)


async def follow_view(trainer: Trainer) -> None:
    """A loop hook of ranks > 0: the bridge's view, capacities and distrusted ranks for the
    coming step (its plan, and with it the cross-check's sample, follow from them)."""
    head, _ = await trainer.collective.receive(trainer.deadline())
    trainer.adopt_capacities(head["capacities"])
    trainer.distrusted = {int(r) for r in head.get("distrusted", ())}


# make_trainer(config, collective, checkpoint or None) -> a Trainer of this rank's share
TrainerFactory = Callable[[RunConfig, BridgeCollective, Any], Trainer]


async def follow_bridge(inner: Collective, make_trainer: TrainerFactory,
                        report: Callable[[str], None], on_step: Sequence[OnStep] = ()) -> None:
    """Ranks > 0: train every run the bridge announces, until it says stop.

    report(text) tells what happens, on_step hooks get every step (pynode.run.loop).
    """
    while True:
        head, blob = decode(await inner.broadcast_bytes(None, root=0, timeout=FOLLOW_WAIT_S))
        if head["t"] == "stop":
            return
        if head["t"] != "go":
            continue
        _, cfg, ckpt = read_start(head=head, blob=blob)
        trainer = make_trainer(cfg, BridgeCollective(inner), ckpt)
        report(f"training: run of {trainer.cfg.steps} steps from step {trainer.state.step}")
        try:
            await train(trainer, before_step=(follow_view,), on_step=on_step)
        except RunEnded:
            report("the bridge's run ended")
        except PeerLost:
            raise  # the cluster itself broke: nothing to follow
        except DaisyError as exc:
            report(f"stopped: {type(exc).__name__}: {exc}")
