"""A native cluster as one peer of a room: reduce inside the cluster (gloo), across the room
over WebRTC on one rank, and share the result inside.

Integer sums are associative, so (sum inside the cluster) + (the other room peers' sums) is
the same int64 vector as every partial summed flat: the cluster changes no bit.

Cluster rank 0 is the *bridge*: its collective is a `BridgeCollective` over the cluster
(`inner`) and the room (`outer`); the other ranks' is one over `inner` alone that mirrors
each collective the bridge calls. Every inner exchange is a collective of the cluster, in
the same order on every rank; the bridge's result (or its error) reaches the others by an
inner broadcast (`ClusterLink`, one at a time). Which runs the cluster trains, and what it
publishes for them, is the run layer's (pynode.run.cluster).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from pynode.comm.base import (
    Collective,
    CommError,
    ReduceResult,
    refusal_code,
    refusal_error,
)
from pynode.comm.wire import pack_message, unpack_message
from pynode.core.errors import DaisyError

log = logging.getLogger(__name__)

IDLE_S = 5.0  # between runs the bridge says "idle" this often, so the others' waits never lapse
FOLLOW_WAIT_S = 60.0  # a follower between runs gives up after this long without a word
RESULT_WAIT = 10  # a follower waits this many of its deadlines for a room collective's result


class RunEnded(CommError):
    """The bridge's run stopped (finished early, lost the room): the followers stop too."""


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


class BridgeCollective(Collective):
    """One cluster rank's view of the room: the room's ranks, the cluster's arithmetic.

    On the bridge `outer` is its room collective, `link` its ClusterLink and
    `publish(entries)` what the cluster's allgather entries become in the room's allgather;
    on the other ranks all three are None and rank / members follow what the bridge shares.
    """

    name = "bridge"

    def __init__(self, inner: Collective, outer: Collective | None = None,
                 link: ClusterLink | None = None,
                 publish: Callable[[list[bytes | None]], bytes] | None = None) -> None:
        self.inner, self.outer, self.link, self.publish = inner, outer, link, publish
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
    async def share(self, head: dict[str, Any], blob: Any, timeout: float) -> None:
        """Bridge: send `head` (with the room's view) and `blob` to the other cluster ranks."""
        assert self.outer is not None and self.link is not None
        head["view"] = {"rank": self.rank, "world": self.world_size,
                        "members": list(self.members)}
        await self.link.broadcast(pack_message(head, blob), timeout)

    async def receive(self, timeout: float) -> tuple[dict[str, Any], Any]:
        """Follower: the bridge's next word (its blob bytes, or an int64 array as
        pack_message carried it); RunEnded if it says the run is over."""
        head, blob = unpack_message(await self.inner.broadcast_bytes(
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

    # ----------------------------------------------------------------- collectives
    async def allreduce_int64(self, x: np.ndarray, *, timeout: float) -> ReduceResult:
        cluster = await self.inner.allreduce_int64(x, timeout=timeout)
        if self.outer is None:
            head, total = await self.receive(timeout)  # (n,) int64, packed on the way
            if not isinstance(total, np.ndarray):
                raise CommError("the bridge's all-reduce result carries no int64 vector")
            return ReduceResult(total, tuple(head["contributors"]))
        return await self.outer_call(
            lambda: self.outer.allreduce_int64(cluster.total, timeout=timeout),
            lambda r: ({"contributors": list(r.contributors)}, r.total), timeout)

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
        assert self.publish is not None
        published = self.publish(entries)
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


class ClusterLink:
    """Rank 0's end of the cluster's inner channel: one broadcast at a time, and between
    runs an `idle` word every IDLE_S, so the other ranks' waits never lapse."""

    def __init__(self, inner: Collective) -> None:
        self.inner = inner
        self.lock = asyncio.Lock()
        self.active = False  # in a run: its collectives keep the others awake
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._keep_awake())

    async def _keep_awake(self) -> None:
        while True:
            await asyncio.sleep(IDLE_S)
            async with self.lock:
                if not self.active:
                    await self.inner.broadcast_bytes(pack_message({"t": "idle"}),
                                                     timeout=FOLLOW_WAIT_S)

    async def broadcast(self, message: bytes, timeout: float) -> None:
        async with self.lock:
            await self.inner.broadcast_bytes(message, timeout=timeout)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
