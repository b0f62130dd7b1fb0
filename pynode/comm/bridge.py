"""A native cluster as one peer of a room: reduce inside the cluster (gloo), across the room
over WebRTC on one rank, and share the result inside.

Integer sums are associative, so (sum inside the cluster) + (the other room peers' sums) is
the same int64 vector as every partial summed flat: the cluster changes no bit.

Cluster rank 0 is the *bridge*: its room peer (`pynode join --cluster`) runs the room
protocol, and its trainer's collective is a `BridgeCollective` over the cluster (`inner`)
and the room (`outer`). Ranks > 0 run `follow_bridge`: they wait for the bridge to announce
a run (config and state), build the same trainer and mirror each collective it calls. To
the room the cluster is one rank; that rank's microbatches are split over the cluster
(`ClusterTrainer`). Every inner exchange is a collective of the cluster, in the same order
on every rank; the bridge's result (or its error) reaches the others by an inner broadcast.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from pynode.comm.base import (
    Collective,
    CommError,
    PeerLost,
    ReduceResult,
    refusal_code,
    refusal_error,
)
from pynode.core.errors import DaisyError
from pynode.trainer import StepResult, Trainer

log = logging.getLogger(__name__)

IDLE_S = 5.0  # between runs the bridge says "idle" this often, so the others' waits never lapse
FOLLOW_WAIT_S = 60.0  # a follower between runs gives up after this long without a word
RESULT_WAIT = 10  # a follower waits this many of its deadlines for a room collective's result
_LEN = struct.Struct("<I")


class RunEnded(CommError):
    """The bridge's run stopped (finished early, lost the room): the followers stop too."""


def pack(head: dict[str, Any], blob: bytes = b"") -> bytes:
    text = json.dumps(head, separators=(",", ":")).encode()
    return _LEN.pack(len(text)) + text + blob


def unpack(data: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = _LEN.unpack_from(data)
    return json.loads(data[_LEN.size : _LEN.size + n]), data[_LEN.size + n :]


def error_head(exc: DaisyError) -> dict[str, Any]:
    try:
        code = refusal_code(exc)
    except TypeError:
        code = 0
    return {"error": str(exc), "code": code, "ranks": list(getattr(exc, "ranks", ()))}


def raise_error(head: dict[str, Any]) -> None:
    if "error" in head:
        if head["code"]:
            raise refusal_error(head["code"], head["error"], head["ranks"])
        raise CommError(head["error"])


def agreement_entry(entries: list[bytes | None]) -> bytes:
    """What the cluster publishes for the trainer's (state hash, probe | speed) exchange:
    the common vote with the summed speed, or a vote no peer can share if ranks differ."""
    votes = [e.partition(b"|") for e in entries if e is not None]
    if len(votes) == len(entries) and len({v[0] for v in votes}) == 1:
        speed = sum(float(v[2]) for v in votes)
        return votes[0][0] + b"|" + repr(speed).encode()
    return b"cluster ranks disagree:" + b",".join(v[0] for v in votes) + b"|1.0"


class BridgeCollective(Collective):
    """One cluster rank's view of the room: the room's ranks, the cluster's arithmetic.

    On the bridge `outer` is its room collective and `bridge` its ClusterBridge; on the
    other ranks both are None and rank / members follow what the bridge shares.
    """

    name = "bridge"

    def __init__(self, inner: Collective, outer: Collective | None = None,
                 bridge: ClusterBridge | None = None) -> None:
        self.inner, self.outer, self.bridge = inner, outer, bridge
        self.view: dict[str, Any] = {"rank": 0, "world": 1, "members": [0]}
        self.bytes_sent = 0

    @property
    def rank(self) -> int:  # type: ignore[override]
        return self.outer.rank if self.outer is not None else self.view["rank"]

    @property
    def world_size(self) -> int:  # type: ignore[override]
        return self.outer.world_size if self.outer is not None else self.view["world"]

    @property
    def members(self) -> tuple[int, ...]:
        return tuple(self.outer.members if self.outer is not None else self.view["members"])

    # ----------------------------------------------------------------- the inner channel
    async def share(self, head: dict[str, Any], blob: bytes, timeout: float) -> None:
        """Bridge: send `head` (with the room's view) and `blob` to the other cluster ranks."""
        assert self.outer is not None and self.bridge is not None
        head["view"] = {"rank": self.rank, "world": self.world_size,
                        "members": list(self.members)}
        await self.bridge.broadcast(pack(head, blob), timeout)

    async def receive(self, timeout: float) -> tuple[dict[str, Any], bytes]:
        """Follower: the bridge's next word; RunEnded if it says the run is over."""
        head, blob = unpack(await self.inner.broadcast_bytes(
            None, root=0, timeout=RESULT_WAIT * timeout))
        if head.get("t") == "end":
            raise RunEnded("the bridge's run ended")
        if "view" in head:
            self.view = head["view"]
        raise_error(head)
        return head, blob

    async def outer_call(self, call: Callable[[], Any], encode: Callable[[Any], tuple],
                         timeout: float) -> Any:
        """Bridge: run the room collective `call`, share its encoded result or error."""
        try:
            result = await call()
        except DaisyError as exc:
            await self.share(error_head(exc), b"", timeout)
            raise
        head, blob = encode(result)
        await self.share(head, blob, timeout)
        return result

    async def sync_view(self, trainer: Trainer, timeout: float) -> None:
        """At each step's start: the room's members and the planning capacities."""
        if self.outer is not None:
            await self.bridge.announce(timeout)
            caps = {str(r): c for r, c in trainer.capacities.items()}
            await self.share({"t": "view", "capacities": caps}, b"", timeout)
        else:
            head, _ = await self.receive(timeout)
            trainer.capacities = {int(r): float(c) for r, c in head["capacities"].items()}

    # ----------------------------------------------------------------- collectives
    async def allreduce_int64(self, x: np.ndarray, *, timeout: float) -> ReduceResult:
        cluster = await self.inner.allreduce_int64(x, timeout=timeout)
        if self.outer is None:
            head, blob = await self.receive(timeout)
            total = np.frombuffer(blob, "<i8").astype(np.int64)  # (n,) int64
            return ReduceResult(total, tuple(head["contributors"]))
        return await self.outer_call(
            lambda: self.outer.allreduce_int64(cluster.total, timeout=timeout),
            lambda r: ({"contributors": list(r.contributors)}, r.total.astype("<i8").tobytes()),
            timeout)

    async def broadcast_bytes(self, data: bytes | None, *, root: int = 0, timeout: float) -> bytes:
        if self.outer is None:
            return (await self.receive(timeout))[1]
        own = data if self.rank == root else None
        return await self.outer_call(
            lambda: self.outer.broadcast_bytes(own, root=root, timeout=timeout),
            lambda b: ({}, b), timeout)

    async def allgather_bytes(self, data: bytes, *, timeout: float) -> list[bytes | None]:
        entries = await self.inner.allgather_bytes(data, timeout=timeout)
        if self.outer is None:
            head, blob = await self.receive(timeout)
            return split_entries(head["sizes"], blob)
        published = agreement_entry(entries)
        return await self.outer_call(
            lambda: self.outer.allgather_bytes(published, timeout=timeout),
            lambda got: ({"sizes": [None if e is None else len(e) for e in got]},
                         b"".join(e for e in got if e is not None)), timeout)

    async def barrier(self, *, timeout: float) -> None:
        await self.inner.barrier(timeout=timeout)
        if self.outer is None:
            await self.receive(timeout)
            return
        await self.outer_call(lambda: self.outer.barrier(timeout=timeout),
                              lambda _: ({}, b""), timeout)

    async def close(self) -> None:
        """The room's collective is closed by the room; the cluster lives on between runs."""


def split_entries(sizes: list[int | None], blob: bytes) -> list[bytes | None]:
    out: list[bytes | None] = []
    start = 0
    for size in sizes:
        if size is None:
            out.append(None)
            continue
        out.append(blob[start : start + size])
        start += size
    return out


class ClusterBridge:
    """Rank 0's side of the cluster: announces runs, keeps the other ranks awake between
    runs, and serialises every inner exchange (one cluster collective at a time)."""

    def __init__(self, inner: Collective) -> None:
        self.inner = inner
        self.lock = asyncio.Lock()
        self.active = False
        self.pending: bytes | None = None  # the next run's announcement
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._keep_awake())

    async def _keep_awake(self) -> None:
        while True:
            await asyncio.sleep(IDLE_S)
            async with self.lock:
                if not self.active:
                    await self.inner.broadcast_bytes(pack({"t": "idle"}), timeout=FOLLOW_WAIT_S)

    def wrap(self, outer: Collective, config: str, state: bytes | None) -> BridgeCollective:
        """The collective of the bridge's trainer for a run of `config` (JSON) from `state`
        (checkpoint bytes, None for a fresh run); the others hear of it at the first step."""
        self.active = True
        self.pending = pack({"t": "run", "config": json.loads(config),
                             "resume": state is not None}, state or b"")
        return BridgeCollective(self.inner, outer, self)

    async def announce(self, timeout: float) -> None:
        if self.pending is not None:
            message, self.pending = self.pending, None
            await self.broadcast(message, timeout)

    async def broadcast(self, message: bytes, timeout: float) -> None:
        async with self.lock:
            await self.inner.broadcast_bytes(message, timeout=timeout)

    async def end_run(self) -> None:
        """The bridge's run is over (done or failed): release the other ranks."""
        if self.active:
            self.active = False
            if self.pending is None:  # they heard of the run: they may wait inside it
                await self.broadcast(pack({"t": "end"}), FOLLOW_WAIT_S)
            self.pending = None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.broadcast(pack({"t": "stop"}), FOLLOW_WAIT_S)


class ClusterTrainer(Trainer):
    """A cluster rank's trainer: its share of the microbatches the room plans for the
    cluster's room rank, with the room's view refreshed at the start of every step."""

    cluster_rank = 0
    cluster_size = 1

    async def step(self) -> StepResult:
        await self.collective.sync_view(self, self.deadline())
        return await super().step()

    def microbatch_partial(self, indices: list[int]) -> np.ndarray:
        return super().microbatch_partial(indices[self.cluster_rank :: self.cluster_size])


TrainerFactory = Callable[[Any, Collective, Any], ClusterTrainer]


async def follow_bridge(inner: Collective, make_trainer: TrainerFactory,
                        report: Callable[[str], None],
                        on_step: Callable[[StepResult], None] | None = None) -> None:
    """Ranks > 0: train every run the bridge announces, until it says stop.

    make_trainer(config dict, collective, checkpoint bytes or None) -> ClusterTrainer;
    report(text) tells what happens, on_step(result) gets every step.
    """
    while True:
        head, blob = unpack(await inner.broadcast_bytes(None, root=0, timeout=FOLLOW_WAIT_S))
        if head["t"] == "stop":
            return
        if head["t"] != "run":
            continue
        coll = BridgeCollective(inner)
        trainer = make_trainer(head["config"], coll, blob if head["resume"] else None)
        report(f"training: run of {trainer.cfg.steps} steps from step {trainer.state.step}")
        try:
            while trainer.state.step < trainer.cfg.steps:
                result = await trainer.step()
                if on_step is not None:
                    on_step(result)
        except RunEnded:
            report("the bridge's run ended")
        except PeerLost:
            raise  # the cluster itself broke: nothing to follow
        except DaisyError as exc:
            report(f"stopped: {type(exc).__name__}: {exc}")
