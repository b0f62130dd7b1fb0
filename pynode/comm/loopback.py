"""Peers on one machine, each its own process, joined in a star around rank 0 (the hub).

Members send their contribution to the hub over loopback TCP or a Unix socket; the hub
combines them exactly (star.py) and sends every member the same result. The hub is also
the failure detector: a member whose connection closes, or who has not contributed by
the hub's deadline, is dropped from `members` and the collective completes without it.
If the hub itself goes, every other member raises PeerLost([0]) and the group is over.

A group of two reduces pairwise: the hub packs its own vector while it waits, and once
the member's contribution is in, sends it (a PART frame) and then the result without the
sum, which the member adds itself (int64 addition: the hub's bits). The packed-sum leg
of the codec's chain, packing on the hub and unpacking on the member, leaves the critical
path, and both sides unpack at once. A member that has not contributed is sent nothing
large, so the hub's deadline holds however long it stops reading.

A pair's vectors of SHARED_MIN values or more change hands in shared memory
(pynode/comm/shared.py) once the member has mapped the hub's file (its path comes with
the first such result): the member writes its vector into its row and sends a frame
that says so; the hub, which wrote its own vector into one of its two rows while it
waited, sums from memory and answers with the row that holds its part. The rows are safe
to reuse: the member writes its row in its all-reduce's turn (a queued call waits), after
the result of its last all-reduce, which the hub sends once it has read that row; the hub
alternates its rows, and it can only write one again after the member contributed to a
later all-reduce, that is, after the member finished reading it. Everything else (the
deadline, drops, refusals) is the socket's, as before; the first such all-reduce, and a
member that cannot map the file, go packed over the socket.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pynode.comm import star
from pynode.comm.base import (
    Collective,
    CollectiveUsageError,
    CommError,
    PeerLost,
    ReduceResult,
    check_bytes,
    check_contribution,
    check_rank,
    check_timeout,
    payload_or_refusal,
    refusal_error,
)
from pynode.comm.shared import MEMBER, SharedVectors
from pynode.comm.streams import (
    Address,
    Link,
    LinkGone,
    bound_address,
    open_connection,
    read_frame,
    start_server,
)
from pynode.comm.wire import (
    VERSION,
    Frame,
    Kind,
    MessageError,
    encode_header,
    int64_saving,
    pack_message,
    unpack_message,
)
from pynode.core.errors import DaisyError, ShapeError

# all-reduces of this many values or more go through shared memory in a pair: below it,
# packing costs less than the file (the gradient of the default model is 119,121 values)
SHARED_MIN = 4096

log = logging.getLogger(__name__)

DEFAULT_MAX_FRAME = 1 << 32  # a gradient of 500M parameters; anything larger is foreign
_HELLO_MAX = 1 << 16
# The hub may enter a collective up to `timeout` after a member and then wait `timeout` for
# the slowest member, so a member gives it twice that, plus this, before calling it lost.
HUB_GRACE_S = 1.0
_RETRY_S = 0.05


class LoopbackCollective(Collective):
    """One member of a star group; rank 0 is the hub. Create it with `connect`."""

    name = "loopback"

    def __init__(self, rank: int, world_size: int, links: dict[int, Link]) -> None:
        self.rank = rank
        self.world_size = world_size
        self.bytes_sent = 0
        self.bytes_saved = 0
        self.bytes_shared = 0
        self._links = links  # hub: every other member's link; member: {0: hub}
        self._every_link = list(links.values())  # dropped ones too: what they brought counts
        self._members = tuple(range(world_size))
        self._seq = 0
        self._lock = asyncio.Lock()  # collectives run one at a time, in call order
        self._broken: CommError | None = None
        self._shared: SharedVectors | None = None  # a pair's, once the hub offered it
        self._row = 0  # the hub's row for its next part in shared memory
        self._declined = 0  # a length whose file the member could not map: not offered again

    @property
    def members(self) -> tuple[int, ...]:
        return self._members

    @property
    def bytes_received(self) -> int:  # type: ignore[override]
        return sum(link.received for link in self._every_link)

    async def allreduce_int64(self, x: np.ndarray, *, timeout: float) -> ReduceResult:
        vec = None
        try:
            vec = check_contribution(x, self.world_size)  # (n,) int64
            # The hub's own vector stays an array (star.combine), or travels as a PART; a
            # member's is packed or put in shared memory once its turn comes (_member_round).
            payload: Any = vec
        except DaisyError as exc:
            payload = exc
        return await self._collective(Kind.ALLREDUCE, 0, payload, timeout, vec)

    def _contribution(self, vec: np.ndarray) -> bytes:
        """A member's vector: in its row of the pair's shared memory where it fits, said
        in a frame of a few bytes; packed otherwise. Called in the all-reduce's turn (a
        queued call must not write the row the hub may still be reading)."""
        shared = self._shared
        if shared is None or shared.n != vec.size:
            return self._pack(vec)
        shared.rows[MEMBER] = vec
        self.bytes_shared += vec.nbytes
        return pack_message({"shared": vec.size})

    def _pack(self, vec: np.ndarray) -> bytes:
        packed = pack_message({}, vec, local=True)  # one machine: no network to spare
        self.bytes_saved += int64_saving(packed, {}, vec)
        return packed

    async def broadcast_bytes(self, data: bytes | None, *, root: int = 0, timeout: float) -> bytes:
        root = check_rank(root, self.world_size, "root")
        payload = (payload_or_refusal(check_bytes, data, "broadcast_bytes at the root")
                   if self.rank == root else b"")
        return await self._collective(Kind.BROADCAST, root, payload, timeout)

    async def allgather_bytes(self, data: bytes, *, timeout: float) -> list[bytes | None]:
        payload = payload_or_refusal(check_bytes, data, "allgather_bytes")
        return await self._collective(Kind.ALLGATHER, 0, payload, timeout)

    async def barrier(self, *, timeout: float) -> None:
        await self._collective(Kind.BARRIER, 0, b"", timeout)

    async def close(self) -> None:
        if self._broken is None:
            self._broken = CommError(f"rank {self.rank}: this collective is closed")
        self._unshare()
        links, self._links = self._links, {}
        for link in links.values():
            try:
                await link.send(Frame(Kind.BYE, 0, self._seq, self.rank, 0, b""))
            except LinkGone:
                pass
            await link.close()

    async def _collective(
        self, kind: Kind, arg: int, payload: bytes | DaisyError, timeout: float,
        vec: np.ndarray | None = None,
    ) -> Any:
        """One collective; `vec` is this member's own int64 vector in an all-reduce."""
        timeout = check_timeout(timeout)
        async with self._lock:
            if self._broken is not None:
                raise self._broken
            seq = self._seq
            self._seq += 1
            if isinstance(payload, DaisyError):
                own = star.refusal_frame(kind, seq, self.rank, payload, arg)
            else:
                own = Frame(kind, 0, seq, self.rank, arg, payload)
            try:
                if self.rank == 0:
                    status, meta, blob = await self._hub_round(own, timeout, vec)
                else:
                    status, meta, blob = await self._member_round(own, timeout, vec)
            except asyncio.CancelledError:
                self._broken = CommError(f"rank {self.rank}: a collective was cancelled midway")
                raise
            self._members = tuple(meta["members"])
        return star.decode(kind, status, meta, blob)

    async def _hub_round(
        self, own: Frame, timeout: float, vec: np.ndarray | None
    ) -> tuple[int, dict[str, Any], bytes]:
        others = [r for r in self._members if r != 0]
        pair = vec is not None and not own.status and len(others) == 1 and others[0] in self._links
        shared = self._shared if pair and self._shared and self._shared.n == vec.size else None
        part = b""
        if shared is not None:  # where the member reads it, while it may still compute
            shared.rows[self._row] = vec
        elif pair:
            part = self._pack(vec)
        got = await asyncio.gather(*(self._receive(r, timeout) for r in others))
        frames = {0: own}
        for rank, item in zip(others, got, strict=True):
            if isinstance(item, Frame):
                frames[rank] = item
            else:
                await self._drop(rank, item, own.seq)
        theirs = frames.get(others[0]) if pair else None  # their own all-reduce, no refusal
        pair = (theirs is not None and theirs.kind == own.kind and theirs.seq == own.seq
                and not theirs.status)
        in_memory = pair and shared is not None and _shared_count(theirs.payload) == vec.size
        if in_memory:  # the member mapped the file: its name can go
            frames[others[0]] = theirs._replace(payload=shared.rows[MEMBER])
            shared.unlink()
            self.bytes_shared += vec.nbytes
        elif pair:  # the member waits for the result: it unpacks this while the hub unpacks theirs
            if shared is not None:  # the member could not map the file: the pair stays packed
                self._unshare()
                self._declined = vec.size
            part = part or self._pack(vec)
            self.bytes_sent += await self._send(others[0], own._replace(kind=Kind.PART,
                                                                        payload=part))
        members = tuple(r for r in self._members if r in frames)
        status, meta, blob = star.combine(own, frames, members, self.world_size)
        if pair and isinstance(blob, np.ndarray):  # the member adds the hub's part itself
            extra: dict[str, Any] = {"pair": True}
            if in_memory:
                extra["row"], self._row = self._row, 1 - self._row
            elif (blob.size >= SHARED_MIN and blob.size != self._declined
                  and (self._shared is None or self._shared.n != blob.size)):
                extra["shared"] = self._offer(blob.size)
            result = pack_message({**meta, **extra})
        else:
            result = pack_message(meta, blob, local=True)
            if isinstance(blob, np.ndarray):
                self.bytes_saved += int64_saving(result, meta, blob) * (len(frames) - 1)
        # Echo each member's own kind and seq, so a member that called the wrong collective
        # reads the usage error instead of a protocol violation.
        sent = await asyncio.gather(
            *(
                self._send(r, frames[r]._replace(status=status, rank=0, payload=result))
                for r in others
                if r in frames
            )
        )
        self.bytes_sent += sum(sent)
        return status, meta, blob

    def _offer(self, n: int) -> list | None:
        """The hub's new shared memory for vectors of n values, as [path, n] for the
        member; None where the machine has none to give (the pair stays packed)."""
        self._unshare()
        try:
            self._shared = SharedVectors.create(n)
        except OSError as exc:
            log.info("hub: no shared memory for the pair (%s); its vectors go packed", exc)
            return None
        self._row = 0
        return [self._shared.path, n]

    def _take(self, offer: Any) -> None:
        """The member maps the hub's shared memory ([path, n]); where it cannot (or the
        hub had none to give: None), it goes on packing and the hub reads that."""
        self._unshare()
        if offer is None:
            return
        try:
            path, n = offer
            self._shared = SharedVectors.attach(str(path), int(n))
        except (OSError, TypeError, ValueError) as exc:
            log.info("rank %d: cannot map the hub's shared memory (%s); packing instead",
                     self.rank, exc)

    def _unshare(self) -> None:
        shared, self._shared = self._shared, None
        if shared is not None:
            if self.rank == 0:
                shared.unlink()
            shared.close()

    async def _receive(self, rank: int, timeout: float) -> Frame | str:
        try:
            return await self._links[rank].recv(timeout)
        except asyncio.TimeoutError:
            return f"no contribution within {timeout:g} s"
        except LinkGone as exc:
            return str(exc)

    async def _send(self, rank: int, frame: Frame) -> int:
        try:
            return await self._links[rank].send(frame)
        except LinkGone:
            return 0  # it contributed, so its data counts; its loss shows next round

    async def _drop(self, rank: int, reason: str, seq: int) -> None:
        log.warning("hub: dropping rank %d at collective #%d: %s", rank, seq, reason)
        self._unshare()
        link = self._links.pop(rank)
        try:
            self.bytes_sent += await link.send(Frame(Kind.DROP, 0, seq, 0, 0, reason.encode()))
        except LinkGone:
            pass
        await link.close()

    async def _member_round(
        self, own: Frame, timeout: float, vec: np.ndarray | None
    ) -> tuple[int, dict[str, Any], bytes]:
        link = self._links[0]
        wait_s = 2 * timeout + HUB_GRACE_S
        deadline = asyncio.get_running_loop().time() + wait_s
        lost: CommError
        if isinstance(own.payload, np.ndarray):
            own = own._replace(payload=self._contribution(own.payload))
        try:
            self.bytes_sent += await link.send(own)
        except LinkGone:
            pass  # what the hub sent last (a DROP, or nothing) tells why; read it below
        part: Any = None  # the hub's own vector, in a group of two
        try:
            frame = await link.recv(wait_s)
            while frame.kind == Kind.PART:  # kept only for this very all-reduce
                if own.kind == Kind.ALLREDUCE and frame.seq == own.seq:
                    try:
                        part = star.contribution(0, frame.payload)
                    except ShapeError:
                        part = None  # named below, once the result says it was needed
                frame = await link.recv(max(deadline - asyncio.get_running_loop().time(), 0.0))
        except asyncio.TimeoutError:
            lost = PeerLost([0], f"the hub sent no result within {wait_s:g} s")
        except LinkGone as exc:
            lost = PeerLost([0], f"lost the hub: {exc}")
        else:
            if frame.kind == Kind.DROP:
                reason = frame.payload.decode(errors="replace")
                lost = PeerLost([self.rank], f"the hub dropped rank {self.rank}: {reason}")
            elif frame.kind != own.kind or frame.seq != own.seq:
                lost = CommError(
                    f"the hub answered {frame.kind.name} #{frame.seq} to {own.kind.name} #{own.seq}"
                )
            else:
                meta, blob = unpack_message(frame.payload)
                if frame.status or not meta.pop("pair", False):
                    return frame.status, meta, blob
                row = meta.pop("row", None)
                if row in (0, 1) and self._shared is not None and vec is not None:
                    part = self._shared.rows[row]
                if "shared" in meta:  # a new file, or none (the hub had none to give)
                    self._take(meta.pop("shared"))
                if isinstance(part, np.ndarray) and vec is not None and part.shape == vec.shape:
                    return frame.status, meta, vec + part
                lost = CommError(f"the hub's part of all-reduce #{own.seq} did not arrive whole")
        raise await self._break(lost)

    async def _break(self, exc: CommError) -> CommError:
        """This member cannot continue: every later call raises `exc`."""
        self._broken = exc
        links, self._links = self._links, {}
        for link in links.values():
            await link.close()
        return exc


def _shared_count(payload: Any) -> int | None:
    """The number of values a member says it left in shared memory, if its contribution
    is that frame (a few bytes) rather than a packed vector."""
    if not isinstance(payload, (bytes, bytearray, memoryview)) or len(payload) > 64:
        return None
    try:
        meta, blob = unpack_message(payload)
    except MessageError:
        return None
    count = meta.get("shared") if isinstance(blob, bytes) and not blob else None
    return count if isinstance(count, int) else None


async def connect(
    rank: int,
    world_size: int,
    address: Address,
    *,
    timeout: float = 30.0,
    group: str = "",
    on_listen: Callable[[Address], None] | None = None,
    max_frame_bytes: int = DEFAULT_MAX_FRAME,
) -> LoopbackCollective:
    """Form (rank 0) or join (other ranks) a star group of `world_size` processes.

    `address` is (host, port) for TCP or a Unix socket path; the hub listens there (port 0
    picks a free port, reported through `on_listen`). `group` names the run so that a stray
    peer of another run is refused. Returns once all members joined; raises PeerLost if
    some did not within `timeout`.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise CollectiveUsageError(f"world_size must be a positive int, got {world_size!r}")
    rank = check_rank(rank, world_size)
    timeout = check_timeout(timeout)
    if rank == 0:
        links = await _form_group(world_size, address, timeout, group, on_listen, max_frame_bytes)
    else:
        links = {0: await _join_group(rank, world_size, address, timeout, group, max_frame_bytes)}
    return LoopbackCollective(rank, world_size, links)


async def _form_group(
    world_size: int,
    address: Address,
    timeout: float,
    group: str,
    on_listen: Callable[[Address], None] | None,
    max_payload: int,
) -> dict[int, Link]:
    joined: dict[int, Link] = {}
    full = asyncio.Event()
    if world_size == 1:
        full.set()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = await asyncio.wait_for(read_frame(reader, _HELLO_MAX), timeout)
            rank = _check_hello(hello, world_size, group, joined)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, OSError, CommError) as exc:
            log.warning("hub: refused a connection: %s", exc)
            _refuse(writer, exc)
            return
        joined[rank] = Link(reader, writer, max_payload)
        if len(joined) == world_size - 1:
            full.set()

    server = await start_server(on_client, address)
    try:
        if on_listen is not None:
            on_listen(bound_address(server, address))
        await asyncio.wait_for(full.wait(), timeout)
    except asyncio.TimeoutError:
        missing = sorted(set(range(1, world_size)) - set(joined))
        lost = PeerLost(missing, f"rank(s) {missing} did not join within {timeout:g} s")
        await _abort_joined(joined, lost)
        raise lost from None
    finally:
        server.close()
        if not isinstance(address, tuple):
            Path(address).unlink(missing_ok=True)
    welcome = pack_message({"members": list(range(world_size))})
    for link in joined.values():
        await link.send(Frame(Kind.WELCOME, 0, 0, 0, 0, welcome))
    return joined


def _check_hello(frame: Frame, world_size: int, group: str, joined: dict[int, Link]) -> int:
    if frame.kind != Kind.HELLO:
        raise CommError(f"expected HELLO, got {frame.kind.name}")
    try:
        hello = json.loads(frame.payload)
        rank, size, their_group = int(hello["rank"]), int(hello["world_size"]), hello["group"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CommError(f"malformed HELLO: {exc}") from None
    if size != world_size or their_group != group:
        raise CollectiveUsageError(
            f"rank {rank} wants group {their_group!r} of {size}; this hub runs "
            f"{group!r} of {world_size}"
        )
    if not 1 <= rank < world_size or rank in joined:
        raise CollectiveUsageError(f"rank {rank} is out of range or already joined")
    return rank


def _refuse(writer: asyncio.StreamWriter, exc: BaseException) -> None:
    if isinstance(exc, CollectiveUsageError):
        status, meta, _ = star.error_result(exc, ())
        payload = pack_message(meta)
        writer.write(encode_header(Frame(Kind.WELCOME, status, 0, 0, 0, payload)) + payload)
    writer.close()  # flushes what was written first


async def _abort_joined(joined: dict[int, Link], lost: PeerLost) -> None:
    status, meta, _ = star.error_result(lost, ())
    for link in joined.values():
        try:
            await link.send(Frame(Kind.WELCOME, status, 0, 0, 0, pack_message(meta)))
        except LinkGone:
            pass
        await link.close()


async def _join_group(
    rank: int, world_size: int, address: Address, timeout: float, group: str, max_payload: int
) -> Link:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            reader, writer = await open_connection(address)
            break
        except OSError as exc:
            if loop.time() > deadline:
                raise PeerLost([0], f"no hub at {address!r} within {timeout:g} s: {exc}") from None
            await asyncio.sleep(_RETRY_S)
    hello = json.dumps(
        {"rank": rank, "world_size": world_size, "group": group, "version": VERSION}
    ).encode()
    writer.write(encode_header(Frame(Kind.HELLO, 0, 0, rank, 0, hello)) + hello)
    try:
        await writer.drain()
        wait_s = max(deadline - loop.time(), 0.0) + HUB_GRACE_S
        frame = await asyncio.wait_for(read_frame(reader, _HELLO_MAX), wait_s)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, OSError, CommError) as exc:
        writer.close()
        raise PeerLost([0], f"the hub did not admit rank {rank}: {exc!r}") from None
    if frame.kind != Kind.WELCOME:
        writer.close()
        raise CommError(f"the hub answered HELLO with {frame.kind.name}")
    meta, _ = unpack_message(frame.payload)
    if frame.status:
        writer.close()
        raise refusal_error(frame.status, str(meta.get("error")), meta.get("ranks", ()))
    return Link(reader, writer, max_payload)
