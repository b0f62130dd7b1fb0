"""The webrtc transport: a Collective over a mesh of peers named by id (pynode.comm.mesh).

In the page the mesh is WebRTC data channels (the JS bridge fragments and reassembles
messages); in tests it is `MemoryNetwork`. `MeshCollective` runs the collectives over it:

allreduce_int64   reduce-scatter + all-gather: member i owns chunk i of the vector, sums it
                  and sends the sum to everyone. Between the phases the leader (rank 0)
                  commits who contributed, so every member returns the same sum. Each member
                  sends 2 (n-1)/n of the vector, like a ring, in 4 message delays, not 2 (n-1).
                  An owner lost after the commit may have handed its sum to some members
                  only: a member missing a chunk asks every other member for it (FETCH), and
                  each answers from what it held when its own all-gather ended (GIVE). If one
                  had it, everyone ends with the same sum; if nobody had it, nobody returned,
                  and every survivor retries the all-reduce without the lost owner.
broadcast, allgather, barrier   a star through the leader (small payloads), combined by star.py.

A member that vanishes (its channel closes, it says BYE, or it misses the deadline) is
dropped: an all-reduce is retried over the survivors and `contributors` names them; the
trainer re-plans the lost microbatches. Ranks are stable: rank r is peer `ranks[r]`, and a
peer admitted later (`admit`) gets the next rank. Losing the leader ends the group.

Frame (little-endian, 25 bytes): tag b"C", version u8, op u8, status u8, attempt u8,
group u32, seq u32, chunk u32, arg i64; then the payload.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Sequence
from enum import IntEnum
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
    refusal_code,
    refusal_error,
)
from pynode.comm.mesh import Mesh
from pynode.comm.wire import (
    Frame,
    Kind,
    MessageError,
    int64_saving,
    pack_message,
    unpack_message,
)
from pynode.core.errors import DaisyError, ShapeError

log = logging.getLogger(__name__)

TAG = b"C"
VERSION = 1
HEADER = struct.Struct("<cBBBBIIIq")
GRACE_S = 1.0  # slack on top of `timeout` for the leader's round trip
_INT64 = np.dtype("<i8")


class Op(IntEnum):
    PART = 1  # member -> owner: its slice of the owner's chunk (arg: vector length)
    HAVE = 2  # owner -> leader: JSON of whose slices arrived
    DECIDE = 3  # leader -> members: JSON commit / retry / error, members and ranks
    SUM = 4  # owner -> members: the reduced chunk
    STAR = 5  # member -> leader: a star collective's frame (chunk: wire Kind, arg: root)
    RESULT = 6  # leader -> member: star result (pack_message of meta, blob)
    BYE = 7  # leaving the group
    FETCH = 8  # member -> member: the chunks it lacks after the all-gather (u32 each)
    GIVE = 9  # member -> member: one of them (chunk: its index; status 1: not held)


_KEPT = 4  # ended all-gathers whose chunks a member keeps for others' FETCHes


class _Msg:
    __slots__ = ("status", "arg", "payload", "chunk")

    def __init__(self, status: int, arg: int, payload: Any, chunk: int = 0) -> None:
        self.status, self.arg, self.payload, self.chunk = status, arg, payload, chunk


class MeshCollective(Collective):
    """One member of a group over a mesh. Build it with `connect`."""

    name = "webrtc"

    def __init__(
        self, mesh: Mesh, ranks: Sequence[str], group: int,
        members: Sequence[int] | None = None, seq: int = 0,
    ) -> None:
        if mesh.self_id not in ranks or len(set(ranks)) != len(ranks):
            raise CollectiveUsageError(f"ranks {list(ranks)} must hold {mesh.self_id} once")
        self.mesh = mesh
        self.group = group & 0xFFFFFFFF
        self._ranks = list(ranks)
        self._members = tuple(sorted(range(len(ranks)) if members is None else members))
        self._joining: list[int] = []
        self._seq = seq
        self._done_below = seq  # frames of earlier collectives are stale
        self._inbox: dict[tuple[int, int, int, int], dict[str, _Msg]] = {}
        self._gone: set[str] = set()
        self._changed = asyncio.Condition()
        self._lock = asyncio.Lock()
        self._broken: CommError | None = None
        self._held: dict[tuple[int, int], dict[int, memoryview]] = {}  # ended all-gathers
        self._asked: dict[tuple[int, int], list[tuple[str, list[int]]]] = {}  # FETCHes due
        self.bytes_sent = 0
        self.bytes_saved = 0
        self.bytes_received = 0
        self._pump = asyncio.ensure_future(self._read())

    # ----------------------------------------------------------------- membership
    @property
    def rank(self) -> int:  # type: ignore[override]
        return self._ranks.index(self.mesh.self_id)

    @property
    def world_size(self) -> int:  # type: ignore[override]
        return len(self._ranks)

    @property
    def members(self) -> tuple[int, ...]:
        return self._members

    @property
    def ranks(self) -> tuple[str, ...]:
        """Peer id of every rank ever admitted (rank r is `ranks[r]`)."""
        return tuple(self._ranks)

    @property
    def seq(self) -> int:
        """Number of the next collective (a joiner starts here)."""
        return self._seq

    def member_ids(self) -> list[str]:
        return [self._ranks[r] for r in self._members]

    def admit(self, peer_id: str) -> int:
        """Leader only: `peer_id` becomes a member after the next collective; returns its rank.

        The joiner must then `connect` with `ranks`, `members` and `seq` as they are after
        that collective (the leader sends them; see pynode.run.protocol).
        """
        if self.rank != 0:
            raise CollectiveUsageError("only the leader (rank 0) admits peers")
        if peer_id in self._ranks:
            raise CollectiveUsageError(f"peer {peer_id} already has a rank")
        self._ranks.append(peer_id)
        self._joining.append(len(self._ranks) - 1)
        return len(self._ranks) - 1

    # ----------------------------------------------------------------- the mailbox
    async def _read(self) -> None:
        try:
            await self._read_forever()
        except asyncio.CancelledError:
            pass  # closed; ending normally keeps Pyodide's loop from reporting the cancel

    async def _read_forever(self) -> None:
        while True:
            peer, data = await self.mesh.recv()
            if data is None:
                await self._mark_gone(peer)
                continue
            if not data:
                continue  # reachable: nothing to do for a group formed already
            self.bytes_received += len(data)
            try:
                tag, version, op, status, attempt, group, seq, chunk, arg = HEADER.unpack_from(data)
            except struct.error:
                log.warning("webrtc: short frame from %s dropped", peer)
                continue
            if tag != TAG or version != VERSION or group != self.group:
                continue  # another group's (an earlier run's) frame
            if op == Op.FETCH:  # answered even after this member moved on
                self._answer_fetch(peer, seq, attempt, memoryview(data)[HEADER.size:])
                continue
            if seq < self._done_below and op != Op.BYE:
                continue
            if op == Op.BYE:
                await self._mark_gone(peer)
                continue
            # A star frame's chunk is its collective kind, checked by star.combine.
            key = (seq, attempt, op, 0 if op in (Op.STAR, Op.RESULT) else chunk)
            box = self._inbox.setdefault(key, {})
            box[peer] = _Msg(status, arg, memoryview(data)[HEADER.size:], chunk)
            async with self._changed:
                self._changed.notify_all()

    async def _mark_gone(self, peer: str) -> None:
        self._gone.add(peer)
        async with self._changed:
            self._changed.notify_all()

    async def _collect(
        self, key: tuple[int, int, int, int], senders: Sequence[str], until: float
    ) -> dict[str, _Msg]:
        """Messages `key` of `senders`, waiting until each arrived, is gone, or `until`."""
        async with self._changed:
            while True:
                box = self._inbox.get(key, {})
                waiting = [p for p in senders if p not in box and p not in self._gone]
                if not waiting or not await self._next_change(until):
                    break
        box = self._inbox.get(key, {})
        return {p: box[p] for p in senders if p in box}

    async def _next_change(self, until: float) -> bool:
        """Holding `_changed`: wait for the next message or lost peer, at most until `until`;
        False when `until` had passed already."""
        left = until - asyncio.get_running_loop().time()
        if left <= 0:
            return False
        try:
            await asyncio.wait_for(self._changed.wait(), left)
        except asyncio.TimeoutError:
            pass
        return True

    def _send(self, peer: str, op: Op, seq: int, payload: bytes | memoryview = b"",
              *, status: int = 0, attempt: int = 0, chunk: int = 0, arg: int = 0) -> None:
        head = HEADER.pack(TAG, VERSION, op, status, attempt, self.group, seq & 0xFFFFFFFF,
                           chunk, arg)
        data = head + bytes(payload) if payload else head
        self.bytes_sent += len(data)
        self.mesh.send(peer, data)

    def _post_local(self, key: tuple[int, int, int, int], status: int, arg: int,
                    payload: Any) -> None:
        self._inbox.setdefault(key, {})[self.mesh.self_id] = _Msg(status, arg, payload)

    def _pack(self, vector: np.ndarray) -> bytes:
        """`vector` (int64) as the message that carries it (wire.pack_message)."""
        packed = pack_message({}, vector)
        self.bytes_saved += int64_saving(packed, {}, vector)
        return packed

    # ----------------------------------------------------------------- collectives
    async def allreduce_int64(self, x: np.ndarray, *, timeout: float) -> ReduceResult:
        timeout = check_timeout(timeout)
        try:
            vec: np.ndarray | DaisyError = check_contribution(x, self.world_size)
        except DaisyError as exc:
            vec = exc
        async with self._lock:
            seq = self._begin()
            try:
                return await self._allreduce(seq, vec, timeout)
            finally:
                self._forget(seq)

    async def broadcast_bytes(self, data: bytes | None, *, root: int = 0, timeout: float) -> bytes:
        timeout = check_timeout(timeout)
        root = check_rank(root, self.world_size, "root")
        payload = (payload_or_refusal(check_bytes, data, "broadcast_bytes at the root")
                   if self.rank == root else b"")
        return await self._star(Kind.BROADCAST, root, payload, timeout)

    async def allgather_bytes(self, data: bytes, *, timeout: float) -> list[bytes | None]:
        timeout = check_timeout(timeout)
        payload = payload_or_refusal(check_bytes, data, "allgather_bytes")
        return await self._star(Kind.ALLGATHER, 0, payload, timeout)

    async def barrier(self, *, timeout: float) -> None:
        await self._star(Kind.BARRIER, 0, b"", check_timeout(timeout))

    async def close(self) -> None:
        if self._broken is None:
            self._broken = CommError(f"rank {self.rank}: this collective is closed")
        self._say_bye()

    def _say_bye(self) -> None:
        for peer in set(self._ranks) - self._gone - {self.mesh.self_id}:
            self._send(peer, Op.BYE, self._seq)
        self._gone.update(self._ranks)
        self._gone.discard(self.mesh.self_id)
        self._pump.cancel()

    def _begin(self) -> int:
        if self._broken is not None:
            raise self._broken
        if self.rank not in self._members:
            raise self._break(PeerLost([self.rank], f"rank {self.rank} is no longer a member"))
        seq = self._seq
        self._seq += 1
        return seq

    def _forget(self, seq: int) -> None:
        self._done_below = max(self._done_below, seq + 1)
        for key in [k for k in self._inbox if k[0] <= seq]:
            del self._inbox[key]
        for key in [k for k in self._asked if k[0] <= seq]:
            del self._asked[key]  # never ended here: this member broke and said BYE

    def _break(self, exc: CommError) -> CommError:
        """This member cannot go on: tell the others, and raise `exc` from every later call."""
        self._broken = exc
        self._say_bye()
        return exc

    def _adopt(self, meta: dict[str, Any]) -> None:
        """Take the leader's view of the group (ranks only grow) from a result."""
        self._ranks = [str(r) for r in meta.get("ranks", self._ranks)]
        self._members = tuple(int(r) for r in meta["members"])

    def _deadline(self, timeout: float, rounds: int) -> float:
        return asyncio.get_running_loop().time() + rounds * timeout + (rounds - 1) * GRACE_S

    def _lost_leader(self, what: str) -> CommError:
        return self._break(PeerLost([0], f"lost the leader ({self._ranks[0]}) {what}"))

    # ----------------------------------------------------------------- all-reduce
    async def _allreduce(
        self, seq: int, vec: np.ndarray | DaisyError, timeout: float
    ) -> ReduceResult:
        members, attempt = self._members, 0
        while True:
            if 0 not in members:
                raise self._lost_leader("before the all-reduce")
            decision, parts = await self._reduce_round(seq, attempt, members, vec, timeout)
            self._adopt(decision)
            if decision.get("status"):
                raise refusal_error(decision["status"], decision.get("error", ""))
            if self.rank not in self._members:
                raise self._break(PeerLost([self.rank], f"the leader dropped rank {self.rank}"))
            if decision["commit"]:
                total = await self._gather_sums(seq, attempt, members, parts, timeout)
                if total is not None:
                    return ReduceResult(total, tuple(members))
                # Nobody holds a lost owner's sum: retry without it. Peers admitted by this
                # commit still join at the next one.
                joined = [r for r in self._members if r not in members]
                self._members = tuple(members)
                if self.rank == 0:
                    self._joining = joined + self._joining
            members, attempt = self._members, attempt + 1
            if attempt > 255:
                raise self._break(CommError("all-reduce did not settle in 255 attempts"))

    async def _reduce_round(
        self, seq: int, attempt: int, members: tuple[int, ...],
        vec: np.ndarray | DaisyError, timeout: float,
    ) -> tuple[dict[str, Any], dict[str, _Msg]]:
        """Scatter slices to owners, collect the own chunk's, and get the leader's decision."""
        ids = [self._ranks[r] for r in members]
        me = members.index(self.rank)
        length = 0 if isinstance(vec, DaisyError) else vec.shape[0]
        bounds = chunk_bounds(length, len(members))
        for j, owner in enumerate(ids):
            if isinstance(vec, DaisyError):
                status, payload = refusal_code(vec), str(vec).encode()
            elif owner == self.mesh.self_id:
                status, payload = 0, vec[bounds[j] : bounds[j + 1]]  # stays an array
            else:
                status, payload = 0, self._pack(vec[bounds[j] : bounds[j + 1]])
            if owner == self.mesh.self_id:
                self._post_local((seq, attempt, Op.PART, j), status, length, payload)
            else:
                self._send(owner, Op.PART, seq, payload, status=status, attempt=attempt,
                           chunk=j, arg=length)
        parts = await self._collect((seq, attempt, Op.PART, me), ids, self._deadline(timeout, 1))
        for msg in parts.values():
            if not msg.status:  # unreadable slices are refused by every member alike
                theirs = chunk_bounds(msg.arg, len(members))
                msg.status, msg.payload = _read_part(msg, theirs[me + 1] - theirs[me])
        have = {
            "got": sorted(self._ranks.index(p) for p in parts),
            "refused": [[self._ranks.index(p), m.status, bytes(m.payload).decode(errors="replace")]
                        for p, m in parts.items() if m.status],
            "lengths": sorted({m.arg for m in parts.values() if not m.status}),
        }
        if self.rank == 0:
            return await self._decide(seq, attempt, members, have, timeout), parts
        self._send(ids[0], Op.HAVE, seq, json.dumps(have).encode(), attempt=attempt)
        got = await self._collect((seq, attempt, Op.DECIDE, 0), [ids[0]],
                                  self._deadline(timeout, 3))
        if ids[0] not in got:
            raise self._lost_leader(f"during all-reduce #{seq}")
        return json.loads(bytes(got[ids[0]].payload)), parts

    async def _decide(
        self, seq: int, attempt: int, members: tuple[int, ...], own: dict[str, Any],
        timeout: float,
    ) -> dict[str, Any]:
        ids = [self._ranks[r] for r in members]
        reports = {0: own}
        # A member whose slice never reached the leader is dropped anyway: don't wait for it.
        waiting = [ids[j] for j in range(1, len(ids)) if members[j] in own["got"]]
        haves = await self._collect((seq, attempt, Op.HAVE, 0), waiting, self._deadline(timeout, 2))
        for p, m in haves.items():
            reports[members.index(self._ranks.index(p))] = json.loads(bytes(m.payload))
        missing = {members[j] for j in range(len(members)) if j not in reports}
        for report in reports.values():
            missing |= set(members) - set(report["got"])
        decision: dict[str, Any] = {"commit": False, "status": 0}
        refused = sorted(r for report in reports.values() for r in report["refused"])
        lengths = sorted({n for report in reports.values() for n in report["lengths"]})
        if refused:
            rank, code, message = refused[0]
            decision.update(status=code, error=f"rank {rank}: {message}")
        elif len(lengths) > 1:
            decision.update(status=refusal_code(ShapeError("")),
                            error=f"allreduce_int64 lengths differ between ranks: {lengths}")
        elif not missing:
            decision["commit"] = True
        survivors = [r for r in members if r not in missing]
        if missing:  # the room says it in its words (RoomPeer: "lost peer X at step S")
            log.info("all-reduce #%d: dropping rank(s) %s", seq, sorted(missing))
        if decision["commit"] or decision["status"]:
            survivors += self._joining
            self._joining = []
        decision.update(members=sorted(survivors), ranks=self._ranks)
        blob = json.dumps(decision).encode()
        for peer in ids[1:]:
            self._send(peer, Op.DECIDE, seq, blob, attempt=attempt)
        return decision

    async def _gather_sums(
        self, seq: int, attempt: int, members: tuple[int, ...], parts: dict[str, _Msg],
        timeout: float,
    ) -> np.ndarray | None:
        """Sum the own chunk (the leader committed every member's slice), exchange the sums.

        None when no survivor holds a lost owner's sum (then none returns it: retry)."""
        ids = [self._ranks[r] for r in members]
        me = members.index(self.rank)
        length = next(iter(parts.values())).arg
        bounds = chunk_bounds(length, len(members))
        total = np.empty(length, _INT64)  # (n,) int64
        mine = total[bounds[me] : bounds[me + 1]]
        mine[:] = 0
        for msg in parts.values():
            mine += msg.payload  # every member passed check_headroom
        payload = pack_message({}, mine)
        for peer in ids:
            if peer != self.mesh.self_id:
                self._send(peer, Op.SUM, seq, payload, attempt=attempt, chunk=me)
                self.bytes_saved += int64_saving(payload, {}, mine)
        others = [p for p in ids if p != self.mesh.self_id]
        sums = await self._collect_sums(seq, attempt, ids, others, timeout)
        held = {j: sums[p] for j, p in enumerate(ids) if p in sums}
        held[me] = memoryview(payload)
        self._end_gather(seq, attempt, held)
        lacking = [j for j in range(len(ids)) if j not in held]
        if lacking and not await self._recover(seq, attempt, ids, held, lacking, timeout):
            return None
        for j, chunk in held.items():
            if j != me:
                status, summed = _read_part(_Msg(0, 0, chunk), bounds[j + 1] - bounds[j])
                if status:
                    raise self._break(CommError(f"all-reduce #{seq}: the sum of chunk {j} "
                                                f"is unreadable: {summed}"))
                total[bounds[j] : bounds[j + 1]] = summed
        return total

    def _end_gather(self, seq: int, attempt: int, held: dict[int, memoryview]) -> None:
        """From now on answer FETCHes of this all-gather from `held` (as it is now)."""
        self._held[seq, attempt] = dict(held)
        while len(self._held) > _KEPT:
            del self._held[next(iter(self._held))]
        for peer, chunks in self._asked.pop((seq, attempt), []):
            self._give(peer, seq, attempt, chunks)

    def _answer_fetch(self, peer: str, seq: int, attempt: int, payload: memoryview) -> None:
        chunks = np.frombuffer(payload, "<u4").tolist() if len(payload) % 4 == 0 else []
        if (seq, attempt) in self._held:
            self._give(peer, seq, attempt, chunks)
        elif seq >= self._done_below:
            self._asked.setdefault((seq, attempt), []).append((peer, chunks))
        # else: an all-reduce this member left without ending its all-gather (it said BYE)

    def _give(self, peer: str, seq: int, attempt: int, chunks: list[int]) -> None:
        held = self._held[seq, attempt]
        for j in chunks:
            if j in held:
                self._send(peer, Op.GIVE, seq, held[j], attempt=attempt, chunk=j)
            else:
                self._send(peer, Op.GIVE, seq, status=1, attempt=attempt, chunk=j)

    async def _recover(self, seq: int, attempt: int, ids: list[str],
                       held: dict[int, memoryview], lacking: list[int], timeout: float) -> bool:
        """Ask every other member for the `lacking` chunks; True once `held` has them all.

        False when nobody holds one: every other member said so, except its lost owner. Only
        a single such loss is told apart safely (two lost peers could have passed a chunk
        between them before leaving); anything else unresolved at the deadline ends the group.
        """
        others = [p for p in ids if p != self.mesh.self_id]
        ask = np.asarray(lacking, "<u4").tobytes()
        for peer in others:
            self._send(peer, Op.FETCH, seq, ask, attempt=attempt)
        until = self._deadline(timeout, 2)
        async with self._changed:
            while True:
                unheld, unsure, awaited = [], [], False
                for j in lacking:
                    if j in held:
                        continue
                    box = self._inbox.get((seq, attempt, Op.GIVE, j), {})
                    given = next((m for m in box.values() if m.status == 0), None)
                    if given is not None:
                        held[j] = given.payload
                        continue
                    silent = [p for p in others if p not in box]
                    if silent == [ids[j]] and ids[j] in self._gone:
                        unheld.append(j)
                    else:
                        unsure.append(j)
                        awaited |= any(p not in self._gone for p in silent)
                if not awaited or not await self._next_change(until):
                    break
        if unsure or len(unheld) > 1:
            lost = sorted(self._ranks.index(ids[j]) for j in [*unsure, *unheld])
            raise self._break(PeerLost(lost, f"rank(s) {lost} left before every member had "
                                             f"their reduced chunk of all-reduce #{seq}"))
        if unheld:
            log.warning("all-reduce #%d: nobody holds the sum of lost rank(s) %s; retrying "
                        "without", seq, [self._ranks.index(ids[j]) for j in unheld])
        return not unheld

    async def _collect_sums(self, seq: int, attempt: int, ids: list[str], others: list[str],
                            timeout: float) -> dict[str, memoryview]:
        until = self._deadline(timeout, 1)
        out: dict[str, memoryview] = {}
        for j, peer in enumerate(ids):
            if peer in others:
                got = await self._collect((seq, attempt, Op.SUM, j), [peer], until)
                if peer in got:
                    out[peer] = got[peer].payload
        return out

    # ----------------------------------------------------------------- star collectives
    async def _star(
        self, kind: Kind, root: int, payload: bytes | DaisyError, timeout: float
    ) -> Any:
        async with self._lock:
            seq = self._begin()
            try:
                if 0 not in self._members:
                    raise self._lost_leader(f"before {kind.name.lower()}")
                if isinstance(payload, DaisyError):
                    own = star.refusal_frame(kind, seq, self.rank, payload, root)
                else:
                    own = Frame(kind, 0, seq, self.rank, root, payload)
                if self.rank == 0:
                    status, meta, blob = await self._hub(own, timeout)
                else:
                    status, meta, blob = await self._spoke(own, timeout)
                self._adopt(meta)
                if self.rank not in self._members and not status:
                    raise self._break(PeerLost([self.rank], f"the leader dropped rank {self.rank}"))
                return star.decode(kind, status, meta, blob)
            finally:
                self._forget(seq)

    async def _spoke(self, own: Frame, timeout: float) -> tuple[int, dict[str, Any], bytes]:
        leader = self._ranks[0]
        self._send(leader, Op.STAR, own.seq, own.payload, status=own.status, chunk=own.kind,
                   arg=own.arg)
        got = await self._collect((own.seq, 0, Op.RESULT, 0), [leader],
                                  self._deadline(timeout, 2))
        if leader not in got:
            raise self._lost_leader(f"during {own.kind.name.lower()} #{own.seq}")
        meta, blob = unpack_message(bytes(got[leader].payload))
        return got[leader].status, meta, blob

    async def _hub(self, own: Frame, timeout: float) -> tuple[int, dict[str, Any], bytes]:
        ids = {self._ranks[r]: r for r in self._members if r != 0}
        got = await self._collect((own.seq, 0, Op.STAR, 0), list(ids), self._deadline(timeout, 1))
        frames = {0: own}
        for peer, msg in got.items():
            r = ids[peer]
            kind = Kind(msg.chunk) if msg.chunk in iter(Kind) else Kind.BYE
            frames[r] = Frame(kind, msg.status, own.seq, r, msg.arg, bytes(msg.payload))
        lost = sorted(r for p, r in ids.items() if p not in got)
        if lost:  # likewise said by the room, by peer
            log.info("%s #%d: dropping rank(s) %s", own.kind.name.lower(), own.seq, lost)
        members = tuple(sorted(frames))
        status, meta, blob = star.combine(own, frames, members, self.world_size)
        meta["members"] = sorted([*members, *self._joining])
        meta["ranks"] = self._ranks
        self._joining = []
        result = pack_message(meta, blob)
        for peer in ids:
            self._send(peer, Op.RESULT, own.seq, result, status=status, chunk=own.kind)
        return status, meta, blob


def _read_part(msg: _Msg, size: int) -> tuple[int, Any]:
    """(0, the (size,) int64 vector) of a packed slice or sum, or (ShapeError's refusal
    code, why) when it is not one."""
    if isinstance(msg.payload, np.ndarray):
        return 0, msg.payload
    try:
        _, vector = unpack_message(msg.payload)
    except MessageError as exc:
        vector = exc
    if not isinstance(vector, np.ndarray) or vector.shape != (size,):
        what = vector if isinstance(vector, MessageError) else f"not {size} int64 values"
        return refusal_code(ShapeError("")), f"unreadable slice: {what}".encode()
    return 0, vector


def chunk_bounds(length: int, parts: int) -> list[int]:
    """Start of each of `parts` near-equal chunks of `length` items, then `length`."""
    return [j * length // parts for j in range(parts + 1)]


async def connect(
    mesh: Mesh, ranks: Sequence[str], *, group: int,
    members: Sequence[int] | None = None, seq: int = 0,
) -> MeshCollective:
    """A member of the group `group` over `mesh`; rank r is peer `ranks[r]`, rank 0 leads.

    Founders pass the same `ranks` (and default `members`, `seq`); a peer admitted later
    passes what the leader sent it. Every member's messages are tagged with `group`, so a
    frame of an earlier group on the same mesh is ignored.
    """
    if not isinstance(group, int) or not 0 <= group < 2**32:
        raise CollectiveUsageError(f"group must be a u32, got {group!r}")
    return MeshCollective(mesh, ranks, group, members, seq)
