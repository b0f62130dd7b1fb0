"""The collective interface every transport implements, and the checks they share.

Legend: a contribution is `(n,) int64`, one peer's flattened fixed-point partial sum.
Integer sums do not depend on order or topology, so every transport may reduce however it
likes; what they must share is *when* they refuse, so that all members refuse together.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from pynode.core.errors import DaisyError, FixedPointOverflowError, ShapeError

INT64_LIMIT = 2**63


class CommError(DaisyError):
    """A transport failed or a peer broke the wire protocol."""


class PeerLost(CommError):
    """Members did not take part in a collective before its deadline (died, hung or left).

    `ranks` holds the ranks that failed to contribute, as far as this peer can tell.
    """

    def __init__(self, ranks: Iterable[int], message: str = "") -> None:
        self.ranks: tuple[int, ...] = tuple(sorted({int(r) for r in ranks}))
        super().__init__(message or f"lost peer(s) {list(self.ranks)}")


class CollectiveUsageError(CommError, ValueError):
    """A collective was called wrongly: a bad argument, or members disagree on the call."""


class ReduceResult(NamedTuple):
    """What `allreduce_int64` returns: the exact sum and whose contributions it holds."""

    total: np.ndarray  # (n,) int64
    contributors: tuple[int, ...]  # sorted ranks whose arrays are in `total`


# A member that refuses its own input still takes part, sending one of these codes instead
# of data, so that every member raises the same error for the same call.
_REFUSALS: tuple[type[DaisyError], ...] = (
    ShapeError,
    FixedPointOverflowError,
    CollectiveUsageError,
    PeerLost,
)


def refusal_code(exc: DaisyError) -> int:
    """Wire code (1..4) of a refusal; codes are shared by every transport."""
    for code, cls in enumerate(_REFUSALS, start=1):
        if type(exc) is cls:
            return code
    raise TypeError(f"{type(exc).__name__} has no wire code")


def refusal_error(code: int, message: str, ranks: Iterable[int] = ()) -> DaisyError:
    """The error a member raises for a refusal `code` received from the group."""
    if not 1 <= code <= len(_REFUSALS):
        return CommError(f"unknown refusal code {code}: {message}")
    cls = _REFUSALS[code - 1]
    if cls is PeerLost:
        return PeerLost(ranks, message)
    return cls(message)


def payload_or_refusal(check: Callable[..., bytes], *args: Any) -> bytes | DaisyError:
    """`check(*args)`, or the DaisyError it raised: a member with bad input still takes part
    and hands the group its refusal, so that every member raises the same error."""
    try:
        return check(*args)
    except DaisyError as exc:
        return exc


def check_headroom(x: np.ndarray, world_size: int) -> None:
    """Raise FixedPointOverflowError unless `world_size` copies of max|x| fit int64.

    int64 sums wrap silently (gloo: 2**62 + 2**62 == -2**63), so this runs before any
    reduction. If every member passes it, no partial or final sum can wrap.
    """
    if world_size < 1:
        raise CollectiveUsageError(f"world_size must be >= 1, got {world_size}")
    if x.size == 0:
        return
    # Python ints: abs(-2**63) does not fit int64.
    peak = max(abs(int(x.max())), abs(int(x.min())))
    if world_size * peak >= INT64_LIMIT:
        raise FixedPointOverflowError(
            f"int64 reduction could wrap: {world_size} peers x max|x| = {peak} "
            f"reaches 2**63 (use a smaller fixed-point exponent)"
        )


def check_contribution(x: Any, world_size: int) -> np.ndarray:
    """Validate one member's input of `allreduce_int64`; returns it as (n,) contiguous int64."""
    if not isinstance(x, np.ndarray):
        raise ShapeError(f"allreduce_int64 needs a numpy array, got {type(x).__name__}")
    if x.dtype != np.int64:
        raise ShapeError(
            f"allreduce_int64 sums int64 only, got {x.dtype} "
            "(convert gradients to fixed point before reducing)"
        )
    if x.ndim != 1:
        raise ShapeError(f"allreduce_int64 needs a 1-D array, got shape {x.shape}")
    check_headroom(x, world_size)
    return np.ascontiguousarray(x)


def check_bytes(data: Any, what: str) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CollectiveUsageError(f"{what} needs bytes, got {type(data).__name__}")
    return bytes(data)


def check_timeout(timeout: Any) -> float:
    if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise CollectiveUsageError(f"timeout must be a positive number of seconds, got {timeout}")
    return float(timeout)


def check_rank(rank: Any, world_size: int, what: str = "rank") -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise CollectiveUsageError(f"{what} must be an int, got {type(rank).__name__}")
    if not 0 <= rank < world_size:
        raise CollectiveUsageError(f"{what} {rank} is outside 0..{world_size - 1}")
    return int(rank)


class Collective(ABC):
    """A group of peers that reduce and exchange data in lockstep.

    Every member calls the same collectives in the same order (SPMD). `timeout` is how long
    one member waits for the others to take part; arguments that would be wrong on every
    member (bad timeout, bad root) raise CollectiveUsageError locally before anything is
    sent. A member whose *data* is bad still takes part, and every member raises the same
    named error for that call; the group stays usable.
    """

    rank: int
    world_size: int
    name: str
    bytes_sent: int  # bytes this peer handed to the wire (frames and metadata included)
    # bytes the int64 codec (wire.pack_int64) kept off the wire: raw int64 would have been
    # bytes_sent + bytes_saved
    bytes_saved: int = 0
    # bytes this peer handed to another through shared memory (a loopback pair's vectors,
    # pynode/comm/shared.py): on no wire, and not packed
    bytes_shared: int = 0
    # bytes this peer took from the wire (frames and metadata included); None where the
    # collective does not count them
    bytes_received: int | None = None

    @property
    @abstractmethod
    def members(self) -> tuple[int, ...]:
        """Ranks currently alive in the group, sorted."""

    @abstractmethod
    async def allreduce_int64(self, x: np.ndarray, *, timeout: float) -> ReduceResult:
        """Exact elementwise sum of every member's (n,) int64 array.

        Raises ShapeError (not int64, not 1-D, lengths differ) or FixedPointOverflowError
        (a sum could wrap) on every member, nothing reduced. A member that fails to
        contribute is missing from `contributors`, or PeerLost is raised where the
        transport cannot continue without it.
        """

    @abstractmethod
    async def broadcast_bytes(self, data: bytes | None, *, root: int = 0, timeout: float) -> bytes:
        """Every member receives `data` of member `root` (the others pass None)."""

    @abstractmethod
    async def allgather_bytes(self, data: bytes, *, timeout: float) -> list[bytes | None]:
        """Entry r is member r's `data`, None for a rank that failed or left."""

    @abstractmethod
    async def barrier(self, *, timeout: float) -> None:
        """Return once every live member has reached the barrier."""

    @abstractmethod
    async def close(self) -> None:
        """Leave the group; later calls raise CommError. Safe to call twice."""

    async def __aenter__(self) -> Collective:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
