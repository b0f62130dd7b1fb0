"""torch.distributed gloo: native peers on several machines (`python -m pynode cluster`).

Every collective first all-reduces a small int64 "agreement" vector, (3, world) int64:
each rank writes its length, refusal code and call tag in its own column, so every rank
learns the same lengths and refusals and can refuse together before the real exchange.
An all-reduce then reduce-scatters and all-gathers packed chunks (pynode.comm.wire) over
point-to-point sends, each exchange after a small all-reduce of the chunks' byte sizes.
gloo cannot drop a member in place: any failure breaks the group and every later call
raises the same PeerLost; the caller re-forms a group from the survivors.

Under torchrun the agent's store outlives the workers, and each restart of the group is an
*attempt*: its ranks agree on a fresh key prefix first (`_agree_attempt`), and may leave
notes in the store (`note`) that the next attempt reads (`previous_notes`), e.g. who left
in good order and who vanished.

torch is imported inside functions only, so `import pynode` never needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np

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
    refusal_code,
    refusal_error,
)
from pynode.comm.wire import MessageError, int64_saving, pack_message, unpack_message
from pynode.core.errors import DaisyError, ShapeError

log = logging.getLogger(__name__)

_ALLREDUCE, _BROADCAST, _ALLGATHER, _BARRIER = 1, 2, 3, 4
_GUARD_S = 5.0  # beyond gloo's own per-op timeouts, in case a thread wedges
_POLL_S = 0.05
# Under torchrun's agent with restarts left, a broken group is restarted whatever the roll
# call finds: it only names the lost for the error line, so it does not wait `timeout`.
_RESTARTABLE_ROLL_CALL_S = 1.0
# A pair whose other rank closed its connection: how long the roll call waits for it (one
# that is alive saw the same close and checks in at once)
_CLOSED_ROLL_CALL_S = 1.0
# How long a closing rank tries to leave its mark of leaving (`_say_left`)
_LEFT_MARK_S = 2.0
_CLOSED = re.compile(r"Connection (closed|reset) by peer", re.IGNORECASE)

# gloo's message for a lost peer: "[/path/to/gloo/transport/tcp/pair.cc:553] Connection closed
# by peer [ADDR]:PORT. This is typically caused by a remote worker crashing. Check the logs
# of the remote worker before reporting an error. GLHF!"
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\.(?:cc|cpp|cxx|h):\d+\]\s*")


def plain_reason(text: str) -> str:
    """What gloo says happened, without its source location and its boilerplate advice
    (for the message above: Connection closed by peer [ADDR]:PORT.)."""
    text = _SOURCE_PREFIX.sub("", text.strip())
    return text.split(" This is typically caused", 1)[0]


class _GlooFailed(Exception):
    """gloo raised: a connection closed or an operation timed out."""


class GlooCollective(Collective):
    """One rank of a gloo process group. Create it with `connect`."""

    name = "gloo"

    def __init__(self, pg: Any, store: Any, rank: int, world_size: int, keys: str,
                 previous: str | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.bytes_sent = 0
        self.bytes_received = 0
        self.bytes_saved = 0
        self._pg = pg
        self._store = store
        self._keys = keys  # store key prefix of this group
        self._previous = previous  # key prefix of the attempt before this one, if any
        # torchrun's agent restarts this group if it breaks
        self.restartable = (os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
                            and os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") != "0")
        self._members = tuple(range(world_size))
        self._lock = asyncio.Lock()
        self._broken: CommError | None = None

    @property
    def members(self) -> tuple[int, ...]:
        return self._members

    async def allreduce_int64(self, x: np.ndarray, *, timeout: float) -> ReduceResult:
        try:
            arr: np.ndarray | DaisyError = check_contribution(x, self.world_size)
        except DaisyError as exc:
            arr = exc
        # the agreement, then two exchanges of sizes and chunks each
        total = await self._run(self._allreduce, arr, timeout=timeout, ops=5)
        return ReduceResult(total, self._members)

    async def broadcast_bytes(self, data: bytes | None, *, root: int = 0, timeout: float) -> bytes:
        root = check_rank(root, self.world_size, "root")
        payload = (payload_or_refusal(check_bytes, data, "broadcast_bytes at the root")
                   if self.rank == root else b"")
        return await self._run(self._broadcast, payload, root, timeout=timeout, ops=2)

    async def allgather_bytes(self, data: bytes, *, timeout: float) -> list[bytes | None]:
        payload = payload_or_refusal(check_bytes, data, "allgather_bytes")
        return await self._run(self._allgather, payload, timeout=timeout, ops=2)

    async def barrier(self, *, timeout: float) -> None:
        await self._run(self._agree, _BARRIER, 0, 0, timeout=timeout, ops=1)

    @property
    def restarted(self) -> bool:
        """True when an earlier attempt of this group ran under the same torchrun agent."""
        return self._previous is not None

    def note(self, name: str, value: str) -> None:
        """Leave `value` in the store as this rank's note `name`, for the next attempt.
        Best effort: a store that is gone loses the note."""
        store = self._store
        if store is not None:
            try:
                store.set(f"{self._keys}notes/{name}/{self.rank}", value.encode())
            except RuntimeError:
                pass

    def previous_notes(self, name: str) -> tuple[int, dict[int, str]]:
        """The previous attempt's world size and its ranks' notes `name` ({rank: value},
        ranks without one left out); (0, {}) for a first attempt."""
        if self._previous is None or self._store is None:
            return 0, {}
        world = int(self._store.get(f"{self._previous}world"))
        keys = [f"{self._previous}notes/{name}/{r}" for r in range(world)]
        return world, {r: self._store.get(k).decode() for r, k in enumerate(keys)
                       if self._store.check([k])}

    async def close(self) -> None:
        if self._broken is None:
            self._broken = CommError(f"rank {self.rank}: this collective is closed")
        self._say_left()
        self._pg = self._store = None

    def _say_left(self) -> None:
        """Leave this rank's mark of leaving in the store, so that the others' roll call
        does not wait --timeout for a rank that will not come (a 3-rank group sat a frozen
        minute after one rank's Ctrl-C). At most _LEFT_MARK_S: a store whose host is gone
        or out of reach loses the mark (the others then wait as before)."""
        store = self._store
        if store is None or self.world_size == 1:
            return

        def mark() -> None:
            with contextlib.suppress(RuntimeError):
                store.set(f"{self._keys}left/{self.rank}", b"1")

        thread = threading.Thread(target=mark, name="gloo-left-mark", daemon=True)
        thread.start()
        thread.join(_LEFT_MARK_S)

    async def _run(self, fn: Any, *args: Any, timeout: float, ops: int) -> Any:
        timeout = check_timeout(timeout)
        async with self._lock:
            if self._broken is not None:
                raise self._broken
            call = asyncio.to_thread(fn, *args, timedelta(seconds=timeout))
            try:
                return await asyncio.wait_for(call, ops * timeout + _GUARD_S)
            except (_GlooFailed, asyncio.TimeoutError) as exc:
                reason = (plain_reason(str(exc))
                          or f"no result within {ops * timeout + _GUARD_S:g} s")
            except asyncio.CancelledError:
                self._broken = CommError(f"rank {self.rank}: a collective was cancelled midway")
                raise
            if self.restartable:
                timeout = min(timeout, _RESTARTABLE_ROLL_CALL_S)
            elif self.world_size == 2 and _CLOSED.search(reason):
                # the only other rank closed its end: a roll call waited --timeout for it
                # to check in (rank 0 sat a frozen --timeout after rank 1's Ctrl-C)
                timeout = min(timeout, _CLOSED_ROLL_CALL_S)
            lost = await asyncio.to_thread(self._roll_call, timeout)
            self._members = tuple(r for r in range(self.world_size) if r not in lost)
            self._broken = PeerLost(
                lost, f"gloo group broken at rank {self.rank} (lost {list(lost)}): {reason}"
            )
            log.info("%s", self._broken)  # the caller tells it (its stop line)
            raise self._broken

    # The methods below run in a worker thread; they block inside gloo.

    def _allreduce(self, arr: np.ndarray | DaisyError, timeout: timedelta) -> np.ndarray:
        local = arr if isinstance(arr, DaisyError) else None
        n = 0 if local is not None else len(arr)
        lengths = self._agree(_ALLREDUCE, 0, n, timeout, local)
        if len(set(lengths.tolist())) > 1:
            counts = dict(enumerate(lengths.tolist()))
            raise ShapeError(f"allreduce_int64 lengths differ between ranks: {counts}")
        if n == 0:
            return np.zeros(0, np.int64)
        if self.world_size == 1:
            return arr.copy()
        # Reduce-scatter + all-gather of packed chunks (wire.pack_int64): gloo's own
        # all-reduce would carry 8 bytes per value, the packed chunks ~2.3x fewer.
        ws, me = self.world_size, self.rank
        bounds = [j * n // ws for j in range(ws + 1)]
        slices = [arr[bounds[j] : bounds[j + 1]] for j in range(ws)]
        parts = [self._pack(slices[j]) if j != me else b"" for j in range(ws)]
        got = self._swap(parts, timeout)
        mine = slices[me].copy()  # (n / ws,) int64: this rank's chunk of the sum
        for rank, data in enumerate(got):
            if rank != me:
                mine += _unpack(data, rank, mine.shape[0])  # every rank passed check_headroom
        packed = self._pack(mine)
        sums = self._swap([packed if j != me else b"" for j in range(ws)], timeout)
        total = np.empty(n, np.int64)  # (n,) int64
        for rank, data in enumerate(sums):
            size = bounds[rank + 1] - bounds[rank]
            total[bounds[rank] : bounds[rank + 1]] = (
                mine if rank == me else _unpack(data, rank, size))
        return total

    def _pack(self, vector: np.ndarray) -> bytes:
        packed = pack_message({}, vector)
        self.bytes_saved += int64_saving(packed, {}, vector)
        return packed

    def _swap(self, outgoing: list[bytes], timeout: timedelta) -> list[bytes]:
        """Send outgoing[r] to every other rank r and receive theirs: entry r of the result
        is what rank r sent this one (b"" for this rank itself)."""
        import torch

        ws, me = self.world_size, self.rank
        sizes = torch.zeros(ws * ws, dtype=torch.int64)  # (ws*ws,) int64: [sender, receiver]
        sizes[me * ws : (me + 1) * ws] = torch.tensor([len(b) for b in outgoing])
        self._reduce(sizes, timeout)
        incoming = sizes.numpy().reshape(ws, ws)[:, me].tolist()
        bufs = [torch.empty(int(incoming[r]), dtype=torch.uint8) for r in range(ws)]
        work = []
        for r in range(ws):
            if r != me:
                out = torch.from_numpy(np.frombuffer(outgoing[r], np.uint8).copy())
                work.append(self._pg.send([out], r, 0))
                work.append(self._pg.recv([bufs[r]], r, 0))
                self.bytes_sent += len(outgoing[r])
                self.bytes_received += int(incoming[r])
        for item in work:
            self._wait(item, timeout)
        return [bufs[r].numpy().tobytes() if r != me else b"" for r in range(ws)]

    def _broadcast(self, payload: bytes | DaisyError, root: int, timeout: timedelta) -> bytes:
        import torch
        import torch.distributed as dist

        local = payload if isinstance(payload, DaisyError) else None
        size = 0 if local is not None else len(payload)
        n = int(self._agree(_BROADCAST, root, size, timeout, local)[root])
        if n == 0:
            return b""
        if self.rank == root:
            buf = torch.from_numpy(np.frombuffer(payload, dtype=np.uint8).copy())  # (n,) uint8
        else:
            buf = torch.empty(n, dtype=torch.uint8)
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor, opts.timeout = root, 0, timeout
        self._wait(self._pg.broadcast([buf], opts))
        self._moved(n * (self.world_size - 1) // self.world_size)  # each rank's share
        return buf.numpy().tobytes()

    def _allgather(self, payload: bytes | DaisyError, timeout: timedelta) -> list[bytes | None]:
        import torch
        import torch._C._distributed_c10d as c10d

        local = payload if isinstance(payload, DaisyError) else None
        size = 0 if local is not None else len(payload)
        lengths = self._agree(_ALLGATHER, 0, size, timeout, local).tolist()
        width = max(lengths)
        if width == 0:
            return [b""] * self.world_size
        mine = torch.zeros(width, dtype=torch.uint8)  # (width,) uint8, padded
        mine[:size] = torch.from_numpy(np.frombuffer(payload, dtype=np.uint8).copy())
        out = [torch.empty(width, dtype=torch.uint8) for _ in range(self.world_size)]
        opts = c10d.AllgatherOptions()
        opts.timeout = timeout
        self._wait(self._pg.allgather([out], [mine], opts))
        self._moved(width * (self.world_size - 1))  # ring all-gather
        return [t[:n].numpy().tobytes() for t, n in zip(out, lengths, strict=True)]

    def _agree(
        self, op: int, arg: int, length: int, timeout: timedelta, local: DaisyError | None = None
    ) -> np.ndarray:
        """All-reduce the (3, world) agreement; raise what every rank must raise.

        Returns the (world,) int64 lengths. `local` is this rank's own refusal, if any.
        """
        import torch

        ws = self.world_size
        meta = torch.zeros(3 * ws, dtype=torch.int64)  # (3*world,) int64
        meta[self.rank] = length
        meta[ws + self.rank] = 0 if local is None else refusal_code(local)
        meta[2 * ws + self.rank] = op << 32 | arg
        self._reduce(meta, timeout)
        lengths, codes, tags = meta.numpy().reshape(3, ws)
        if len(set(tags.tolist())) > 1:
            calls = {r: (int(t) >> 32, int(t) & 0xFFFFFFFF) for r, t in enumerate(tags)}
            raise CollectiveUsageError(f"ranks called different collectives (op, root): {calls}")
        if local is not None:
            raise local
        for rank, code in enumerate(codes.tolist()):
            if code:
                kind = type(refusal_error(code, "")).__name__
                raise refusal_error(code, f"rank {rank} refused its input ({kind}); see its log")
        return lengths

    def _reduce(self, tensor: Any, timeout: timedelta) -> None:
        import torch.distributed as dist

        opts = dist.AllreduceOptions()
        opts.reduceOp, opts.timeout = dist.ReduceOp.SUM, timeout
        self._wait(self._pg.allreduce([tensor], opts))
        nbytes = tensor.numel() * tensor.element_size()
        self._moved(2 * (self.world_size - 1) * nbytes // self.world_size)  # ring

    def _moved(self, nbytes: int) -> None:
        """A collective that moves as much into each rank as out of it: `nbytes` each way."""
        self.bytes_sent += nbytes
        self.bytes_received += nbytes

    @staticmethod
    def _wait(work: Any, timeout: timedelta | None = None) -> None:
        try:
            work.wait() if timeout is None else work.wait(timeout)
        except RuntimeError as exc:  # torch's DistError family derives from RuntimeError
            raise _GlooFailed(str(exc).splitlines()[0]) from None

    def _roll_call(self, timeout: float) -> tuple[int, ...]:
        """Ranks that do not check in at the store within `timeout` after this one did.

        One failure per group, so one roll call: survivors that noticed it at different
        collectives still meet. If the store is gone, so is its host, rank 0.
        """
        return roll_call(self._store, self._keys + "rollcall/", self.rank, self.world_size,
                         timeout, left=self._keys + "left/", checked_in=self._hang_up)

    def _hang_up(self) -> None:
        """Close this rank's gloo connections (the group is broken for good). A survivor
        that waits inside gloo on this one, not on the lost, would sit out --timeout there
        while this one's roll call waits as long for it, and then name it lost too (ranks 0
        and 1 of three, a second apart, after rank 2's Ctrl-C). A closed connection wakes
        it: it comes to the roll call and finds this rank checked in."""
        self._pg = None
        gc.collect()  # a failed call's traceback may still hold the group's work


def _unpack(data: bytes, rank: int, size: int) -> np.ndarray:
    """The (size,) int64 vector rank `rank` packed into `data`, or CommError."""
    try:
        _, vector = unpack_message(data)
    except MessageError as exc:
        raise CommError(f"rank {rank} sent an unreadable int64 chunk: {exc}") from None
    if not isinstance(vector, np.ndarray) or vector.shape != (size,):
        raise CommError(f"rank {rank} sent a chunk that is not {size} int64 values")
    return vector


def roll_call(
    store: Any, prefix: str, rank: int, world_size: int, timeout: float,
    left: str | None = None, checked_in: Callable[[], None] = lambda: None,
) -> tuple[int, ...]:
    """Ranks r without key `prefix + r` in the store `timeout` s after this rank set its own.
    A rank with key `left + r` (it closed its collective: a Ctrl-C, an error of its own) is
    one of them at once, not waited for. `checked_in` runs once this rank's key is set.

    The store lives in rank 0. If it goes away before rank 0 checked in, rank 0 is the one
    lost; if rank 0 had checked in, it was alive and has left after its own roll call (a
    survivor that checked in later waits longer), so the answer is who was still missing.
    """
    missing: tuple[int, ...] = (0,)
    try:
        store.set(f"{prefix}{rank}", b"1")
        checked_in()
        deadline = time.monotonic() + timeout
        while True:
            missing = tuple(r for r in range(world_size) if not store.check([f"{prefix}{r}"]))
            awaited = [r for r in missing if left is None or not store.check([f"{left}{r}"])]
            if not awaited or time.monotonic() > deadline:
                return missing
            time.sleep(_POLL_S)
    except RuntimeError:
        return missing if 0 not in missing else (0,)


async def connect(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    timeout: float = 60.0,
    group: str = "",
) -> GlooCollective:
    """Form a gloo group; arguments left None come from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.

    Works under torchrun (its agent hosts the store); otherwise rank 0 hosts it on
    MASTER_PORT. gloo picks its network interface from GLOO_SOCKET_IFNAME when set.
    Raises PeerLost naming the ranks that did not join within `timeout`.
    """
    # named as the user gave them: the environment's names where they came from there
    size_name = "world_size" if world_size is not None else "WORLD_SIZE"
    world_size = world_size if world_size is not None else _env_int("WORLD_SIZE")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise CollectiveUsageError(f"{size_name} must be a positive int, got {world_size!r}")
    if rank is None:
        rank = _env_int("RANK")
        if not 0 <= rank < world_size:
            raise CollectiveUsageError(f"RANK {rank} is outside 0..{world_size - 1} (WORLD_SIZE "
                                       f"{world_size}): give each process of the cluster its "
                                       "own RANK, 0 on the machine of MASTER_ADDR")
    rank = check_rank(rank, world_size)
    master_addr = master_addr or _env("MASTER_ADDR")
    master_port = master_port if master_port is not None else _env_int("MASTER_PORT")
    if not 0 < master_port < 65536:
        raise CollectiveUsageError(f"MASTER_PORT must be in 1..65535, got {master_port}")
    timeout = check_timeout(timeout)
    return await asyncio.to_thread(
        _connect_blocking, rank, world_size, master_addr, master_port, timeout,
        f"daisychain/{group}/"
    )


def _connect_blocking(
    rank: int, world_size: int, addr: str, port: int, timeout: float, base: str
) -> GlooCollective:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        raise CommError("this torch build has no gloo backend")
    deadline = time.monotonic() + timeout
    _resolve(addr, port)
    hosts_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    if not hosts_store:
        # TCPStore's client retries a refused connect for about twice its timeout, logging
        # C++ stack frames each time: wait for rank 0's port here, at most `timeout`.
        _wait_for_port(addr, port, deadline, timeout)
    delta = timedelta(seconds=timeout)  # also every later store call's own timeout
    try:
        store = _open_store(addr, port, world_size, hosts_store, delta)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        if hosts_store and "EADDRINUSE" in first:
            raise CommError(f"MASTER_PORT {port} is in use on this machine (another program, "
                            "or a run still there, or another rank 0: is this one's RANK "
                            "right?): give every rank another MASTER_PORT") from None
        message = f"no gloo store at {addr}:{port}: {first}"
        raise PeerLost([0], message) from None
    keys, previous = f"{base}0/", None
    if not hosts_store and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        keys, previous = _agree_attempt(store, base, rank, world_size, deadline, addr, port)
    joined = [f"{keys}joined/{r}" for r in range(world_size)]
    try:
        store.set(joined[rank], str(world_size).encode())  # each rank's own WORLD_SIZE
        _wait_joined(store, joined, rank, world_size, deadline)
        pg = dist.ProcessGroupGloo(dist.PrefixStore(keys + "pg", store), rank, world_size, delta)
    except RuntimeError as exc:
        _same_world_size(store, joined, rank, world_size)
        missing = roll_call(store, f"{keys}joined/", rank, world_size, _POLL_S)
        first = str(exc).splitlines()[0]
        who = _not_joined(missing, world_size, addr, port) if missing else first
        raise PeerLost(missing, f"gloo group did not form within {timeout:g} s at "
                       f"{addr}:{port}: {who}") from None
    log.info("gloo: rank %d of %d joined via %s:%d", rank, world_size, addr, port)
    return GlooCollective(pg, store, rank, world_size, keys, previous)


_JOIN_POLL_S = 0.2  # how often a rank looks at who has checked in while the group forms


def _not_joined(missing: Sequence[int], world_size: int, addr: str, port: int) -> str:
    """The ranks that never checked in, and what starts them."""
    return (f"rank {', '.join(map(str, missing))} of {world_size} did not join: start "
            f"{'it' if len(missing) == 1 else 'each'} with its RANK and this MASTER_ADDR, "
            f"MASTER_PORT and WORLD_SIZE (ranks on other machines must reach {addr}:{port}), "
            "or allow more time with --timeout")


def _wait_joined(store: Any, joined: list[str], rank: int, world_size: int,
                 deadline: float) -> None:
    """Until every rank of `joined` has checked in (RuntimeError at `deadline`), each look
    also comparing the WORLD_SIZE of those new since the last, so that a rank given another
    one is named at once, on every rank, not after --timeout."""
    compared: set[int] = set()
    while True:
        _same_world_size(store, joined, rank, world_size, compared)
        if store.check(joined):
            return
        if time.monotonic() >= deadline:
            raise RuntimeError("wait timeout: not every rank checked in")
        time.sleep(min(_JOIN_POLL_S, max(deadline - time.monotonic(), 0.0)))


def _same_world_size(store: Any, joined: list[str], rank: int, world_size: int,
                     compared: set[int] | None = None) -> None:
    """CollectiveUsageError where a rank that checked in was given another WORLD_SIZE: rank
    0 of 2 timed out on gloo's own keys ("keys: /daisychain//0/pg/0/1"), and a rank given 3
    waited for a rank 2 that nobody started, each without a word of the cause. Rank 0 looks
    at every rank's, the others at rank 0's (two ranks that differ, differ from rank 0 too),
    each once (`compared`): a store polled by every rank for every key was W**2 requests a
    look. A store that is gone by now (rank 0 said it and left) says nothing here."""
    compared = set() if compared is None else compared
    for other in (range(1, len(joined)) if rank == 0 else (0,)):
        if other in compared:
            continue
        try:
            if not store.check([joined[other]]):
                continue
            theirs = store.get(joined[other]).decode()
        except (RuntimeError, UnicodeDecodeError):
            return
        compared.add(other)
        if theirs.isdigit() and int(theirs) != world_size:
            raise CollectiveUsageError(
                f"rank {other} was started with WORLD_SIZE {theirs}, this rank ({rank}) with "
                f"{world_size}: give every rank of the cluster the same WORLD_SIZE")


# store constructors given up on, still waiting in C++ on their daemon threads
_stranded: list[threading.Thread] = []


def stranded() -> bool:
    """Whether a gloo store's constructor that this process gave up on still waits in C++.
    If its connection ends while the interpreter shuts down, the thread wakes without the
    interpreter, and the process aborts (SIGABRT, a C++ stack trace, exit 134) after its
    error line: `python -m pynode` then leaves without shutting the interpreter down."""
    return any(thread.is_alive() for thread in _stranded)


def _open_store(addr: str, port: int, world_size: int, hosts: bool,
                timeout: timedelta) -> Any:
    """dist.TCPStore, given its timeout and a guard to come up. A client whose MASTER_PORT
    is another program's (a web server) connected, then waited on it for good: 10 minutes
    with --timeout 5, until a SIGTERM. The constructor runs on a daemon thread (it releases
    the GIL), which a process that gives up leaves behind."""
    import torch.distributed as dist

    made: dict[str, Any] = {}

    def make() -> None:
        try:
            made["store"] = dist.TCPStore(addr, port, world_size, hosts, timeout,
                                          wait_for_workers=False, multi_tenant=True)
        except RuntimeError as exc:
            made["error"] = exc

    thread = threading.Thread(target=make, name="gloo-store", daemon=True)
    thread.start()
    thread.join(timeout.total_seconds() + _GUARD_S)
    if thread.is_alive():
        _stranded.append(thread)
        raise PeerLost([0], f"{addr}:{port} answered, but no gloo store within "
                       f"{timeout.total_seconds():g} s: is another program listening on "
                       "MASTER_PORT?")
    if "error" in made:
        raise made["error"]
    return made["store"]


def _agree_attempt(store: Any, base: str, rank: int, world_size: int, deadline: float,
                   addr: str, port: int) -> tuple[str, str | None]:
    """(key prefix of this attempt, of the previous one or None) in a store that outlives
    attempts (torchrun's agent store).

    torchrun's own TORCHELASTIC_RESTART_COUNT differs between machines (a machine whose
    workers failed counts a restart, one restarted for a membership change does not), and
    old keys stay in the store. So rank 0 draws a fresh attempt id and hands it to each rank
    in answer to that rank's own fresh nonce: a stale question or answer can never match.
    """
    nonce = secrets.token_hex(8)
    current = f"{base}attempt"
    try:
        if rank != 0:
            store.set(f"{base}ask/{rank}", nonce.encode())
            store.wait([f"{base}answer/{nonce}"], _left(deadline))
            attempt, _, previous = store.get(f"{base}answer/{nonce}").decode().partition(" ")
            store.set(f"{base}{attempt}/confirmed/{rank}", b"1")
            return f"{base}{attempt}/", (f"{base}{previous}/" if previous else None)
        previous = store.get(current).decode() if store.check([current]) else ""
        store.set(f"{base}{nonce}/world", str(world_size).encode())
        answer = f"{nonce} {previous}".encode()
        answered: dict[int, bytes] = {}
        waiting = set(range(1, world_size))
        while waiting:
            for r in sorted(waiting):
                if store.check([f"{base}{nonce}/confirmed/{r}"]):
                    waiting.discard(r)
                elif store.check([f"{base}ask/{r}"]):
                    asked = store.get(f"{base}ask/{r}")
                    if answered.get(r) != asked:  # stale questions get answers nobody reads
                        store.set(f"{base}answer/{asked.decode()}", answer)
                        answered[r] = asked
            if waiting and time.monotonic() > deadline:
                raise PeerLost(sorted(waiting), f"gloo group did not form at {addr}:{port}: "
                               + _not_joined(sorted(waiting), world_size, addr, port))
            if waiting:
                time.sleep(_POLL_S)
        store.set(current, nonce.encode())
        return f"{base}{nonce}/", (f"{base}{previous}/" if previous else None)
    except RuntimeError as exc:  # the store's own timeout, or the store went away
        first = str(exc).splitlines()[0]
        raise PeerLost([0], f"gloo group did not form at {addr}:{port}: {first}") from None


def _left(deadline: float) -> timedelta:
    return timedelta(seconds=max(deadline - time.monotonic(), _POLL_S))


def _resolve(addr: str, port: int) -> None:
    """CollectiveUsageError, at once, for a MASTER_ADDR this machine cannot resolve: rank
    0's store otherwise timed out after seconds of C++ stack frames, saying only that."""
    try:
        socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        if getattr(exc, "errno", None) == socket.EAI_AGAIN:
            return  # a resolver that may answer later: the store's own retries go on
        reason = getattr(exc, "strerror", None) or exc
        raise CollectiveUsageError(f"MASTER_ADDR {addr!r} does not resolve on this machine "
                                   f"({reason}): give every rank the address or host name of "
                                   "rank 0's machine") from None


def _wait_for_port(addr: str, port: int, deadline: float, timeout: float) -> None:
    """Return once something listens on addr:port; PeerLost([0]) at `deadline`."""
    while True:
        try:
            _probe(addr, port, max(min(deadline - time.monotonic(), 1.0), _POLL_S))
            return
        except OSError as exc:
            if time.monotonic() + 0.2 >= deadline:
                raise PeerLost([0], f"rank 0 did not come: nothing answered at {addr}:{port} "
                               f"within {timeout:g} s ({exc.strerror or exc}); start rank 0 "
                               "with the same MASTER_ADDR and MASTER_PORT, or check that this "
                               "machine reaches it") from None
            time.sleep(0.2)


def _probe(addr: str, port: int, timeout: float) -> None:
    """Connect to addr:port and hang up; OSError if nothing listens. The local port is bound
    first and never equals `port`: a connect to a free port of this machine may otherwise
    get that very port as its source, connect to itself and hold it from rank 0's store."""
    family, kind, proto, _, target = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    while True:
        sock = socket.socket(family, kind, proto)
        try:
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
            if sock.getsockname()[1] != port:
                sock.settimeout(timeout)
                sock.connect(target)
                return
        finally:
            sock.close()


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise CollectiveUsageError(  # `cluster --help` has no such argument to give
            f"gloo needs {name}: set the environment variables MASTER_ADDR, MASTER_PORT, "
            "WORLD_SIZE and RANK on every machine (docs/QUICKSTART.md, a gloo cluster)")
    return value


def _env_int(name: str) -> int:
    value = _env(name)
    try:
        return int(value)
    except ValueError:
        raise CollectiveUsageError(f"{name} must be an integer, got {value!r}") from None
