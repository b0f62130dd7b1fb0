"""loopback transport: members as tasks of one process (fast) and as real OS processes."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from comm_helpers import loopback_group, oracle_sum, peer_script, run_peers

from pynode.comm import CollectiveUsageError, CommError, PeerLost, make_collective
from pynode.comm.loopback import HUB_GRACE_S, connect
from pynode.comm.wire import Kind, pack_message
from pynode.core.errors import FixedPointOverflowError, ShapeError

# ---- members as tasks of this process, over a real Unix socket -------------------------


def big_values(rank: int, world: int, n: int = 257) -> np.ndarray:
    return peer_script.contribution(rank, world, 7)[:n]


async def reduce_all(group: list, xs: list, timeout: float = 10.0, reverse: bool = False) -> list:
    """Every member's result; `reverse` starts the members in the opposite order."""
    pairs = list(zip(group, xs, strict=True))
    calls = [m.allreduce_int64(x, timeout=timeout) for m, x in pairs[:: -1 if reverse else 1]]
    out = list(await asyncio.gather(*calls, return_exceptions=True))
    return out[::-1] if reverse else out


async def close_all(group: list) -> None:
    await asyncio.gather(*(m.close() for m in group))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_allreduce_is_exact_and_repeatable(world: int, tmp_path: Path) -> None:
    async def scenario() -> None:
        group = await loopback_group(world, tmp_path)
        xs = [big_values(r, world) for r in range(world)]
        first = await reduce_all(group, xs)
        second = await reduce_all(group, xs, reverse=True)
        await close_all(group)
        expected = oracle_sum(xs)
        for res in first + second:
            assert res.total.dtype == np.int64
            assert res.total.tolist() == expected
            assert res.contributors == tuple(range(world))
        assert all(np.array_equal(a.total, b.total) for a, b in zip(first, second, strict=True))

    asyncio.run(scenario())


def test_float_array_refused_on_every_member_and_group_survives(tmp_path: Path) -> None:
    async def scenario() -> None:
        group = await loopback_group(3, tmp_path)
        xs = [big_values(r, 3) for r in range(3)]
        bad = [xs[0], xs[1].astype(np.float64), xs[2]]
        refused = await reduce_all(group, bad)
        assert all(isinstance(e, ShapeError) and "rank 1" in str(e) for e in refused)
        assert all(m.members == (0, 1, 2) for m in group)
        after = await reduce_all(group, xs)
        assert all(r.total.tolist() == oracle_sum(xs) for r in after)
        await close_all(group)

    asyncio.run(scenario())


def test_mismatched_lengths_refused_everywhere(tmp_path: Path) -> None:
    async def scenario() -> None:
        group = await loopback_group(2, tmp_path)
        out = await reduce_all(group, [np.ones(5, np.int64), np.ones(6, np.int64)])
        assert all(isinstance(e, ShapeError) and "lengths differ" in str(e) for e in out)
        again = await reduce_all(group, [np.ones(5, np.int64), np.ones(5, np.int64)])
        assert all(r.total.tolist() == [2] * 5 for r in again)
        await close_all(group)

    asyncio.run(scenario())


def test_headroom_refused_before_reducing(tmp_path: Path) -> None:
    async def scenario() -> None:
        group = await loopback_group(2, tmp_path)
        wraps = [np.array([2**62, 0], np.int64), np.array([2**62, 0], np.int64)]
        out = await reduce_all(group, wraps)
        assert all(isinstance(e, FixedPointOverflowError) for e in out)
        fits = [np.array([2**62 - 1, -(2**62 - 1)], np.int64)] * 2
        ok = await reduce_all(group, fits)
        assert all(r.total.tolist() == [2**63 - 2, -(2**63 - 2)] for r in ok)
        await close_all(group)

    asyncio.run(scenario())


def test_hung_member_dropped_at_the_deadline(tmp_path: Path) -> None:
    async def scenario() -> None:
        group = await loopback_group(3, tmp_path)
        xs = [big_values(r, 3) for r in range(3)]
        started = time.monotonic()
        partial = await reduce_all(group[:2], xs[:2], timeout=0.5)  # rank 2 never calls
        waited = time.monotonic() - started
        for res in partial:
            assert res.contributors == (0, 1)
            assert res.total.tolist() == oracle_sum(xs[:2])
        assert group[0].members == group[1].members == (0, 1)
        assert waited >= 0.5
        with pytest.raises(PeerLost) as lost:
            await group[2].allreduce_int64(xs[2], timeout=1.0)
        assert lost.value.ranks == (2,)
        later = await reduce_all(group[:2], xs[:2])
        assert all(r.contributors == (0, 1) for r in later)
        await close_all(group)

    asyncio.run(scenario())


def test_hung_hub_is_lost_after_twice_the_timeout_plus_grace(tmp_path: Path) -> None:
    async def scenario() -> None:
        hub, member = await loopback_group(2, tmp_path)
        started = time.monotonic()
        with pytest.raises(PeerLost) as lost:
            await member.barrier(timeout=0.2)  # the hub never calls
        assert lost.value.ranks == (0,)
        assert time.monotonic() - started >= 2 * 0.2 + HUB_GRACE_S
        with pytest.raises(PeerLost):  # the group is over for this member
            await member.barrier(timeout=5)
        await close_all([hub, member])

    asyncio.run(scenario())


def test_broadcast_allgather_barrier(tmp_path: Path) -> None:
    async def scenario() -> None:
        group = await loopback_group(3, tmp_path)
        told = await asyncio.gather(
            *(
                m.broadcast_bytes(b"\x00state\xff" if m.rank == 2 else None, root=2, timeout=5)
                for m in group
            )
        )
        assert told == [b"\x00state\xff"] * 3
        got = await asyncio.gather(
            *(m.allgather_bytes(bytes([m.rank]) * m.rank, timeout=5) for m in group)
        )
        assert got == [[b"", b"\x01", b"\x02\x02"]] * 3
        await asyncio.gather(*(m.barrier(timeout=5) for m in group))
        dropped = await asyncio.gather(*(m.allgather_bytes(b"x", timeout=0.3) for m in group[:2]))
        assert dropped == [[b"x", b"x", None]] * 2
        await close_all(group)

    asyncio.run(scenario())


def test_broadcast_from_a_lost_root_raises_peer_lost(tmp_path: Path) -> None:
    async def scenario() -> None:
        group = await loopback_group(3, tmp_path)
        await group[1].close()
        out = await asyncio.gather(
            *(m.broadcast_bytes(None, root=1, timeout=5) for m in (group[0], group[2])),
            return_exceptions=True,
        )
        assert all(isinstance(e, PeerLost) and e.ranks == (1,) for e in out)
        assert group[0].members == (0, 2)
        await close_all([group[0], group[2]])

    asyncio.run(scenario())


def test_members_calling_different_collectives_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        group = await loopback_group(2, tmp_path)
        out = await asyncio.gather(
            group[0].barrier(timeout=5),
            group[1].allgather_bytes(b"", timeout=5),
            return_exceptions=True,
        )
        assert all(isinstance(e, CollectiveUsageError) for e in out)
        await close_all(group)

    asyncio.run(scenario())


def test_a_pair_adds_the_hubs_part_itself_and_mismatched_calls_stay_refused(
    tmp_path: Path,
) -> None:
    """Two members: the hub sends its own packed vector first (PART) and a result without
    the sum; the member's sum is the hub's, bit for bit, whoever starts first."""
    async def scenario() -> None:
        hub, member = await loopback_group(2, tmp_path)
        sent: list[Kind] = []
        real = hub._links[1].send

        async def spy(frame):
            sent.append(frame.kind)
            return await real(frame)

        hub._links[1].send = spy
        xs = [big_values(r, 2, 4099) for r in range(2)]
        xs[1][::7] = -(2**40)  # large values of the other sign: the member's sum is exact
        for reverse in (False, True):
            results = await reduce_all([hub, member], xs, reverse=reverse)
            assert [r.total.tolist() for r in results] == [oracle_sum(xs)] * 2
            assert all(r.contributors == (0, 1) for r in results)
        assert sent == [Kind.PART, Kind.ALLREDUCE] * 2
        # the member asks for something else: its usage error, and no PART
        out = await asyncio.gather(hub.allreduce_int64(xs[0], timeout=5),
                                   member.barrier(timeout=5), return_exceptions=True)
        assert all(isinstance(e, CollectiveUsageError) for e in out), out
        # the hub's vector refused: no PART, every member reads the refusal
        out = await asyncio.gather(hub.allreduce_int64(xs[0].astype(np.float64), timeout=5),
                                   member.allreduce_int64(xs[1], timeout=5),
                                   return_exceptions=True)
        assert all(isinstance(e, ShapeError) and "rank 0" in str(e) for e in out), out
        # the mismatched round: the member's own kind echoed with the error; the refused
        # round: the refusal only
        assert sent[4:] == [Kind.BARRIER, Kind.ALLREDUCE]
        results = await reduce_all([hub, member], xs)
        assert [r.total.tolist() for r in results] == [oracle_sum(xs)] * 2
        await close_all([hub, member])

    asyncio.run(scenario())


def test_a_pair_hub_drops_a_member_that_stopped_reading_at_its_deadline(tmp_path: Path) -> None:
    """A member whose event loop is stuck (it reads nothing) is sent nothing large before
    it contributes: the hub's all-reduce of a vector larger than any socket buffer ends at
    its deadline without it."""
    async def scenario() -> None:
        hub, member = await loopback_group(2, tmp_path)
        member._links[0]._writer.transport.pause_reading()  # its end reads nothing more
        x = np.arange(1 << 18, dtype=np.int64) * 1_000_003  # ~2 MB as int64, ~1 MB packed
        started = time.monotonic()
        # a hub that waits for the member to read would never return: bounded here
        result = await asyncio.wait_for(hub.allreduce_int64(x, timeout=1.0), 10.0)
        assert time.monotonic() - started < 3.0
        assert result.contributors == (0,)
        assert result.total.tolist() == x.tolist()
        assert hub.members == (0,)
        await close_all([hub, member])

    asyncio.run(scenario())


def test_a_pair_member_whose_hub_part_does_not_read_stops_with_a_named_error(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        hub, member = await loopback_group(2, tmp_path)
        hub._pack = lambda _vector: b"\x00\x00"  # a PART that does not unpack
        xs = [np.arange(64, dtype=np.int64) * (r + 1) for r in range(2)]
        out = await asyncio.gather(*(m.allreduce_int64(x, timeout=5)
                                     for m, x in zip((hub, member), xs, strict=True)),
                                   return_exceptions=True)
        assert out[0].total.tolist() == (xs[0] + xs[1]).tolist()
        assert isinstance(out[1], CommError) and "part of all-reduce #0" in str(out[1])
        await close_all([hub, member])

    asyncio.run(scenario())


def test_bad_arguments_raise_locally_and_closed_group_refuses(tmp_path: Path) -> None:
    async def scenario() -> None:
        (member,) = await loopback_group(1, tmp_path)
        with pytest.raises(CollectiveUsageError):
            await member.broadcast_bytes(b"", root=1, timeout=1)
        with pytest.raises(CollectiveUsageError):
            await member.barrier(timeout=0)
        await member.close()
        with pytest.raises(CommError):
            await member.barrier(timeout=1)
        await member.close()

    asyncio.run(scenario())


def test_join_refusals(tmp_path: Path) -> None:
    async def scenario() -> None:
        address = str(tmp_path / "hub.sock")
        hub = asyncio.create_task(connect(0, 3, address, timeout=1.0, group="run-a"))
        with pytest.raises(CollectiveUsageError, match="run-b"):
            await connect(1, 3, address, timeout=1.0, group="run-b")
        await _send_junk(address)
        member = asyncio.create_task(connect(1, 3, address, timeout=1.0, group="run-a"))
        with pytest.raises(PeerLost) as missing:
            await hub
        assert missing.value.ranks == (2,)
        with pytest.raises(PeerLost):
            await member

    asyncio.run(scenario())


async def _send_junk(address: str) -> None:
    _, writer = await asyncio.open_unix_connection(address)
    writer.write(b"GET / HTTP/1.1\r\n\r\n" + bytes(64))
    await writer.drain()
    writer.close()


def test_an_unreadable_packed_vector_is_refused_by_every_member(tmp_path: Path) -> None:
    async def scenario() -> None:
        members = await loopback_group(3, tmp_path, timeout=5)
        xs = [np.arange(50, dtype=np.int64) * (r + 1) for r in range(3)]
        members[2]._pack = lambda _vector: (2).to_bytes(4, "little") + b"{}"  # plain bytes
        outcomes = await asyncio.gather(
            *(m.allreduce_int64(x, timeout=5) for m, x in zip(members, xs, strict=True)),
            return_exceptions=True)
        assert all(isinstance(o, ShapeError) and "rank 2 sent bytes" in str(o)
                   for o in outcomes), outcomes
        del members[2]._pack
        results = await asyncio.gather(
            *(m.allreduce_int64(x, timeout=5) for m, x in zip(members, xs, strict=True)))
        assert all(np.array_equal(r.total, xs[0] * 6) for r in results)
        await close_all(members)

    asyncio.run(scenario())


def test_tcp_port_zero_and_bytes_sent_and_received(tmp_path: Path) -> None:
    async def scenario() -> None:
        bound: asyncio.Future = asyncio.get_running_loop().create_future()
        hub = asyncio.create_task(
            make_collective(
                "loopback",
                rank=0,
                world_size=2,
                address=("127.0.0.1", 0),
                timeout=5,
                on_listen=bound.set_result,
            )
        )
        member = await connect(1, 2, await bound, timeout=5)
        hub = await hub
        x = np.arange(100, dtype=np.int64)
        await asyncio.gather(*(m.allreduce_int64(x, timeout=5) for m in (hub, member)))
        packed = pack_message({}, x, local=True)  # one machine: bit-packed blocks
        assert len(packed) < 800 // 2  # small counts: the codec packs them tightly
        assert member.bytes_sent == 32 + len(packed)  # one header and the packed vector
        assert member.bytes_sent + member.bytes_saved == 32 + len(pack_message({})) + 800
        assert hub.bytes_sent > len(packed)  # the sum went back with its metadata
        assert hub.bytes_saved > 400
        # what one end took from the wire is what the other handed to it (the dashboard's
        # "received" column was empty for every native run)
        assert (hub.bytes_received, member.bytes_received) == (member.bytes_sent, hub.bytes_sent)
        await close_all([hub, member])

    asyncio.run(scenario())


# ---- members as OS processes --------------------------------------------------------


@pytest.mark.parametrize("world,kind", [(1, "unix"), (2, "tcp"), (3, "tcp"), (3, "unix")])
def test_processes_sum_exactly(world: int, kind: str, tmp_path: Path) -> None:
    address = f"unix:{tmp_path / 'hub.sock'}" if kind == "unix" else "tcp:127.0.0.1:0"
    records = run_peers("loopback", world, address, "exact", tmp_path)
    expected = oracle_sum([peer_script.contribution(r, world, 0) for r in range(world)])
    for record in records.values():
        for rnd in record["rounds"]:
            assert rnd["total"] == expected and rnd["dtype"] == "int64"
            assert rnd["contributors"] == list(range(world))
        assert record["gathered"] == [f"rank{r}" * r for r in range(world)]
        assert record["broadcast"] == "from the last rank"
        if world > 1:
            assert record["first"]["error"] == "FixedPointOverflowError"
        assert record["after"] == [sum(range(world)), world]


@pytest.mark.parametrize("half_a_frame", [False, True])
def test_sigkilled_member_mid_collective_survivors_continue(
    half_a_frame: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if half_a_frame:  # the victim dies having sent a header and half its payload
        monkeypatch.setenv("PARTIAL_FRAME", "1")
    records = run_peers(
        "loopback", 3, "tcp:127.0.0.1:0", "kill", tmp_path, kill_rank=peer_script.VICTIM
    )
    assert set(records) == {0, 1}
    for record in records.values():
        rounds = record["rounds"]
        assert len(rounds) == peer_script.KILL_AT + 3
        for it, rnd in enumerate(rounds):
            alive = [0, 1, 2] if it < peer_script.KILL_AT else [0, 1]
            xs = [peer_script.contribution(r, 3, it) for r in alive]
            assert rnd["contributors"] == alive and rnd["total"] == oracle_sum(xs)
        assert rounds[peer_script.KILL_AT]["members"] == [0, 1]
        # seen through the closed connection, not by waiting out the 10 s deadline
        assert rounds[peer_script.KILL_AT]["after_s"] < 10


def test_sigkilled_hub_ends_the_group_in_bounded_time(tmp_path: Path) -> None:
    records = run_peers(
        "loopback", 3, f"unix:{tmp_path / 'hub.sock'}", "hub_dies", tmp_path, kill_rank=0
    )
    for record in records.values():
        assert record["error"] == "PeerLost" and record["ranks"] == [0]
        assert record["after_s"] < 2 * 2.0 + HUB_GRACE_S


def test_no_stray_listener_after_close(tmp_path: Path) -> None:
    async def scenario() -> None:
        group = await loopback_group(2, tmp_path)
        await close_all(group)

    asyncio.run(scenario())
    assert not (tmp_path / "hub.sock").exists()
    with pytest.raises(OSError), socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(tmp_path / "hub.sock"))
