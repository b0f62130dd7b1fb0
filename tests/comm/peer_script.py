"""One peer of a multi-process comm test: run a scenario, write what happened as JSON.

Usage: python peer_script.py TRANSPORT RANK WORLD ADDRESS SCENARIO OUT_DIR
ADDRESS is `tcp:HOST:PORT` or `unix:PATH` (loopback; rank 0 may use port 0 and publishes the
port it got in OUT_DIR/hub_port) or `HOST:PORT` of the gloo store.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pynode.comm import make_collective  # noqa: E402
from pynode.core.errors import DaisyError  # noqa: E402

N = 1000  # elements per contribution
VICTIM = int(os.environ.get("VICTIM", "2"))  # the rank the kill scenarios lose
KILL_AT = 2  # iteration at which the victim stops answering
LATE_S = 1.0  # how much later than rank 0 the others reach the `late` scenario's reduce


def contribution(rank: int, world: int, iteration: int) -> np.ndarray:
    """Big values with both signs, as large as the headroom allows."""
    limit = (2**63 - 1) // world
    rng = np.random.default_rng([rank, world, iteration])
    x = rng.integers(-limit, limit, size=N, dtype=np.int64, endpoint=True)  # (N,) int64
    x[:2] = (limit, -limit)  # the extremes, in every contribution
    return x


async def open_group(transport: str, rank: int, world: int, address: str, out: Path):
    if transport == "gloo":
        host, port = address.rsplit(":", 1)
        return await make_collective(
            "gloo",
            rank=rank,
            world_size=world,
            master_addr=host,
            master_port=int(port),
            timeout=20.0,
            group="test",
        )
    if address.startswith("unix:"):
        addr: object = address[5:]
    else:
        _, host, port = address.split(":")
        addr = (host, int(port))
        if rank > 0 and int(port) == 0:
            addr = (host, await _published_port(out))

    def publish(bound: object) -> None:
        (out / "hub_port.tmp").write_text(str(bound[1]))
        os.replace(out / "hub_port.tmp", out / "hub_port")

    listen = publish if rank == 0 and isinstance(addr, tuple) else None
    return await make_collective(
        "loopback", rank=rank, world_size=world, address=addr, timeout=20.0, on_listen=listen
    )


async def _published_port(out: Path) -> int:
    while not (out / "hub_port").exists():
        await asyncio.sleep(0.02)
    return int((out / "hub_port").read_text())


def error_record(exc: BaseException, started: float) -> dict:
    return {
        "error": type(exc).__name__,
        "message": str(exc),
        "ranks": list(getattr(exc, "ranks", [])),
        "after_s": time.monotonic() - started,
    }


async def exact(coll, rank: int, world: int, out: Path) -> dict:
    rounds = []
    for _ in range(2):  # the same input twice: same bits despite a different arrival order
        x = contribution(rank, world, 0)
        await asyncio.sleep(random.random() * 0.05)  # vary the arrival order
        result = await coll.allreduce_int64(x, timeout=10.0)
        rounds.append(
            {
                "total": result.total.tolist(),
                "contributors": list(result.contributors),
                "dtype": str(result.total.dtype),
            }
        )
    gathered = await coll.allgather_bytes(f"rank{rank}".encode() * rank, timeout=10.0)
    root = world - 1
    told = await coll.broadcast_bytes(
        b"from the last rank" if rank == root else None, root=root, timeout=10.0
    )
    await coll.barrier(timeout=10.0)
    record = {
        "rounds": rounds,
        "gathered": [g.decode() for g in gathered],
        "broadcast": told.decode(),
        "bytes_sent": coll.bytes_sent,
        "bytes_received": coll.bytes_received,
    }
    return {**record, **await overflow(coll, rank, world)}


async def overflow(coll, rank: int, world: int) -> dict:
    """Every rank passes 2**62: any two of them would wrap int64."""
    record: dict = {}
    started = time.monotonic()
    try:
        await coll.allreduce_int64(np.array([2**62, 1], dtype=np.int64), timeout=10.0)
        record["first"] = {"error": None}
    except DaisyError as exc:
        record["first"] = error_record(exc, started)
    after = await coll.allreduce_int64(np.array([rank, 1], dtype=np.int64), timeout=10.0)
    record["after"] = after.total.tolist()
    return record


async def kill(coll, rank: int, world: int, out: Path) -> dict:
    """The victim stops at KILL_AT and the test SIGKILLs it; the others keep reducing."""
    record: dict = {"rounds": []}
    for iteration in range(KILL_AT + 3):
        if rank == VICTIM and iteration == KILL_AT:
            if os.environ.get("PARTIAL_FRAME"):
                await send_half_a_frame(coll, contribution(rank, world, iteration))
            (out / "victim_ready").write_text("1")
            await asyncio.sleep(3600)
        started = time.monotonic()
        try:
            result = await coll.allreduce_int64(
                contribution(rank, world, iteration),
                timeout=float(os.environ.get("PEER_TIMEOUT", 10)),
            )
        except DaisyError as exc:
            record["rounds"].append(error_record(exc, started))
            if iteration >= KILL_AT:
                break
            raise
        record["rounds"].append(
            {
                "total": result.total.tolist(),
                "contributors": list(result.contributors),
                "members": list(coll.members),
                "after_s": time.monotonic() - started,
            }
        )
        if iteration == KILL_AT - 1:  # everyone is in step before the victim stops
            await coll.barrier(timeout=10.0)
    return record


async def send_half_a_frame(coll, x) -> None:
    """Die mid-frame: a loopback member's header and half its payload (fault injection)."""
    from pynode.comm.wire import Frame, Kind, encode_header

    payload = x.tobytes()
    writer = coll._links[0]._writer
    writer.write(encode_header(Frame(Kind.ALLREDUCE, 0, coll._seq, coll.rank, 0, payload)))
    writer.write(payload[: len(payload) // 2])
    await writer.drain()


async def hub_dies(coll, rank: int, world: int, out: Path) -> dict:
    """Rank 0 stops after one reduce and the test SIGKILLs it; the others must not hang."""
    await coll.allreduce_int64(contribution(rank, world, 0), timeout=10.0)
    if rank == 0:
        (out / "victim_ready").write_text("1")
        await asyncio.sleep(3600)
    started = time.monotonic()
    try:
        await coll.allreduce_int64(contribution(rank, world, 1), timeout=2.0)
        return {"error": None}
    except DaisyError as exc:
        return error_record(exc, started)


async def shared(coll, rank: int, world: int, out: Path) -> dict:
    """A pair's large vectors through shared memory, many rounds with jittered arrivals
    and, every fifth round, the member's next call queued behind the last: each side
    checks every sum against the contributions it can regenerate."""
    from pynode.comm.loopback import SHARED_MIN

    def vector(r: int, i: int) -> np.ndarray:
        rng = np.random.default_rng([r, i, 17])
        return rng.integers(-(2**61), 2**61, size=2 * SHARED_MIN, dtype=np.int64)

    def wrong(i: int, result) -> int:
        return int(not np.array_equal(result.total, vector(0, i) + vector(1, i)))

    mismatches, i, blocks = 0, 0, 0
    while i < 200:
        await asyncio.sleep(random.random() * 0.002)
        if i % 5 == 4:  # two all-reduces; the member calls both at once, the second queued
            calls = [coll.allreduce_int64(vector(rank, j), timeout=10.0) for j in (i, i + 1)]
            if rank == 1:
                results = await asyncio.gather(*calls)
            else:
                results = [await calls[0], await calls[1]]
            mismatches += wrong(i, results[0]) + wrong(i + 1, results[1])
            i += 2
        else:
            mismatches += wrong(i, await coll.allreduce_int64(vector(rank, i), timeout=10.0))
            i += 1
        blocks += 1
        if blocks % 7 == 0:  # other collectives between all-reduces
            await coll.allgather_bytes(b"x" * rank, timeout=10.0)
    return {"mismatches": mismatches, "reduces": i, "bytes_shared": coll.bytes_shared,
            "bytes_sent": coll.bytes_sent}


async def late(coll, rank: int, world: int, out: Path) -> dict:
    """The victim closes its collective (a Ctrl-C) after one reduce; rank 0 comes to the
    next at once, the others LATE_S later (slower machines)."""
    await coll.allreduce_int64(contribution(rank, world, 0), timeout=10.0)
    if rank == VICTIM:
        await coll.close()
        (out / "victim_ready").write_text("1")
        await asyncio.sleep(3600)
    if rank != 0:
        await asyncio.sleep(LATE_S)
    started = time.monotonic()
    try:
        await coll.allreduce_int64(contribution(rank, world, 1),
                                   timeout=float(os.environ.get("PEER_TIMEOUT", 10)))
        return {"error": None}
    except DaisyError as exc:
        return error_record(exc, started)


SCENARIOS = {"exact": exact, "kill": kill, "hub_dies": hub_dies, "shared": shared,
             "late": late}


async def main(
    transport: str, rank: int, world: int, address: str, scenario: str, out: Path
) -> None:
    coll = await open_group(transport, rank, world, address, out)
    record = await SCENARIOS[scenario](coll, rank, world, out)
    await coll.close()
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    transport, rank, world, address, scenario, out = sys.argv[1:7]
    asyncio.run(main(transport, int(rank), int(world), address, scenario, Path(out)))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the record is written; skip torch's teardown, seconds on a loaded machine
