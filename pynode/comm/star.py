"""What the hub of a star computes from the members' frames, and how members read it.

Pure functions (no sockets), so every star-shaped transport shares one behaviour:
`combine` turns the contributions of one collective into (status, meta, blob), and
`decode` turns that back into the value the collective returns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pynode.comm.base import (
    CollectiveUsageError,
    CommError,
    PeerLost,
    ReduceResult,
    refusal_code,
    refusal_error,
)
from pynode.comm.wire import Frame, Kind, MessageError, unpack_message
from pynode.core.errors import DaisyError, ShapeError


def refusal_frame(kind: Kind, seq: int, rank: int, exc: DaisyError, arg: int = 0) -> Frame:
    """A contribution that refuses its own input; the hub turns it into a group-wide error."""
    return Frame(kind, refusal_code(exc), seq, rank, arg, str(exc).encode())


def error_result(exc: DaisyError, members: tuple[int, ...]) -> tuple[int, dict[str, Any], bytes]:
    ranks = list(exc.ranks) if isinstance(exc, PeerLost) else []
    return refusal_code(exc), {"members": list(members), "error": str(exc), "ranks": ranks}, b""


def combine(
    own: Frame, frames: dict[int, Frame], members: tuple[int, ...], world_size: int
) -> tuple[int, dict[str, Any], Any]:
    """Result of one collective from the frames of the members that took part: (status,
    meta, blob), blob the (n,) int64 sum of an all-reduce (pack_message packs it).

    `own` is the hub's frame (also in `frames`); `members` are the live ranks afterwards.
    A refusal or mismatch becomes an error result that every member raises.
    """
    try:
        _check_same_call(own, frames)
        for rank in sorted(frames):
            frame = frames[rank]
            if frame.status:
                raise refusal_error(frame.status, f"rank {rank}: {frame.payload.decode()}")
        meta: dict[str, Any] = {"members": list(members), "contributors": sorted(frames)}
        if own.kind == Kind.ALLREDUCE:
            return 0, meta, _sum_int64(frames)
        if own.kind == Kind.BROADCAST:
            if own.arg not in frames:
                raise PeerLost([own.arg], f"broadcast root {own.arg} did not take part")
            return 0, meta, frames[own.arg].payload
        if own.kind == Kind.ALLGATHER:
            meta["lengths"] = [
                len(frames[r].payload) if r in frames else None for r in range(world_size)
            ]
            return 0, meta, b"".join(frames[r].payload for r in sorted(frames))
        return 0, meta, b""
    except DaisyError as exc:
        return error_result(exc, members)


def _check_same_call(own: Frame, frames: dict[int, Frame]) -> None:
    for rank, frame in sorted(frames.items()):
        if frame.kind != own.kind or frame.seq != own.seq:
            raise CollectiveUsageError(
                f"rank {rank} called {frame.kind.name} #{frame.seq} while the hub called "
                f"{own.kind.name} #{own.seq}: members must call collectives in the same order"
            )
        if frame.arg != own.arg:
            raise CollectiveUsageError(
                f"rank {rank} passed root {frame.arg}, the hub passed root {own.arg}"
            )


def _sum_int64(frames: dict[int, Frame]) -> np.ndarray:
    parts = {rank: contribution(rank, frame.payload) for rank, frame in sorted(frames.items())}
    lengths = {rank: part.shape[0] for rank, part in parts.items()}
    if len(set(lengths.values())) > 1:
        raise ShapeError(f"allreduce_int64 lengths differ between ranks: {lengths}")
    vectors = list(parts.values())  # every member passed check_headroom: no sum wraps
    total = vectors[0] + vectors[1] if len(vectors) > 1 else vectors[0].copy()  # (n,) int64
    for part in vectors[2:]:
        total += part
    return total


def contribution(rank: int, payload: Any) -> np.ndarray:
    """A member's contribution: the hub's own (n,) int64 array, or a packed one's (also
    the hub's, in loopback's PART frame); ShapeError if it does not read as one."""
    if isinstance(payload, np.ndarray):
        return payload
    try:
        _, vector = unpack_message(payload)
    except MessageError as exc:
        raise ShapeError(f"rank {rank} sent no readable int64 vector: {exc}") from None
    if not isinstance(vector, np.ndarray):
        raise ShapeError(f"rank {rank} sent bytes, not an int64 vector")
    return vector


def decode(kind: Kind, status: int, meta: dict[str, Any], blob: Any) -> Any:
    """Value a member returns for a result (blob as unpack_message gives it), or raise the
    group's error."""
    if status:
        raise refusal_error(status, str(meta.get("error", "")), meta.get("ranks", ()))
    if kind == Kind.ALLREDUCE:
        if not isinstance(blob, np.ndarray):
            raise CommError("an all-reduce result without its int64 vector")
        return ReduceResult(blob, tuple(meta["contributors"]))  # (n,) int64
    if kind == Kind.BROADCAST:
        return bytes(blob)
    if kind == Kind.ALLGATHER:
        out: list[bytes | None] = []
        offset = 0
        for n in meta["lengths"]:
            out.append(None if n is None else bytes(blob[offset : offset + n]))
            offset += n or 0
        return out
    return None
