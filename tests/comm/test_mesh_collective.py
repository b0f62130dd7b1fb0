"""pynode.comm.webrtc over the in-process MemoryNetwork: exact sums, refusals, lost peers, joins.

No browser needed; the same collective runs over WebRTC data channels in the page.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pynode.comm.base import PeerLost, ReduceResult
from pynode.comm.mesh import MemoryNetwork, MeshRouter
from pynode.comm.webrtc import HEADER, MeshCollective, Op, chunk_bounds, connect
from pynode.core.errors import FixedPointOverflowError, ShapeError

T = 5.0  # collective timeout (s); tests that wait for a deadline use less


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def group(n: int, net: MemoryNetwork | None = None, gid: int = 7) -> list[MeshCollective]:
    net = net or MemoryNetwork()
    ids = [f"p{i}" for i in range(n)]
    return [await connect(net.join(i), ids, group=gid) for i in ids]


def vectors(n: int, length: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)  # test data only; pynode itself never uses numpy's RNG
    return [rng.integers(-(2**40), 2**40, length, dtype=np.int64) for _ in range(n)]


async def reduce_all(colls: list[MeshCollective], xs: list, errors: bool = False) -> list:
    """Every member's allreduce_int64 of its own x, run together (exceptions returned if
    `errors`)."""
    calls = (c.allreduce_int64(x, timeout=T) for c, x in zip(colls, xs, strict=True))
    return await asyncio.gather(*calls, return_exceptions=errors)


def exact_sum(xs: list[np.ndarray]) -> np.ndarray:
    total = np.zeros_like(xs[0])
    for x in xs:
        total += x
    return total


@pytest.mark.parametrize("n,length", [(1, 5), (2, 1001), (3, 2), (3, 100_003), (4, 0)])
def test_allreduce_is_the_exact_sum_on_every_member(n, length):
    async def body():
        coll = await group(n)
        xs = vectors(n, length, seed=n + length)
        results = await reduce_all(coll, xs)
        for res in results:
            assert isinstance(res, ReduceResult)
            assert res.total.dtype == np.int64 and res.total.flags.writeable
            assert np.array_equal(res.total, exact_sum(xs))
            assert res.contributors == tuple(range(n))
        assert all(np.array_equal(x, y) for x, y in zip(xs, vectors(n, length, n + length),
                                                        strict=True)), "input modified"
    run(body())


def test_each_member_sends_about_two_n_minus_one_over_n_of_the_vector():
    async def body():
        coll = await group(3)
        xs = vectors(3, 300_000)
        await reduce_all(coll, xs)
        vector_bytes = 8 * 300_000
        for c in coll:  # as raw int64, and packed: values of 41 bits take ~42 of 64
            unpacked = c.bytes_sent + c.bytes_saved
            assert 2 * 2 / 3 * vector_bytes <= unpacked < 2 * 2 / 3 * vector_bytes + 4096
            assert 0.6 * unpacked < c.bytes_sent < 0.7 * unpacked
            assert 0.6 * unpacked < c.bytes_received < 0.7 * unpacked
        assert sum(c.bytes_received for c in coll) == sum(c.bytes_sent for c in coll)
    run(body())


def test_bad_input_is_refused_by_every_member_and_the_group_goes_on():
    async def body():
        coll = await group(3)
        xs = vectors(3, 10)
        bad = [xs[0], xs[1].astype(np.float64), xs[2]]
        outcomes = await reduce_all(coll, bad, errors=True)
        assert all(isinstance(o, ShapeError) for o in outcomes), outcomes
        assert all("rank 1" in str(o) for o in outcomes)
        uneven = [xs[0], xs[1][:9], xs[2]]
        outcomes = await reduce_all(coll, uneven, errors=True)
        assert all(isinstance(o, ShapeError) for o in outcomes), outcomes
        huge = [xs[0], np.full(10, 2**62, np.int64), xs[2]]
        outcomes = await reduce_all(coll, huge, errors=True)
        assert all(isinstance(o, FixedPointOverflowError) for o in outcomes), outcomes
        results = await reduce_all(coll, xs)
        assert all(np.array_equal(r.total, exact_sum(xs)) for r in results)
    run(body())


def test_an_unreadable_packed_slice_is_refused_by_every_member_and_the_group_goes_on():
    async def body():
        coll = await group(3)
        xs = vectors(3, 10)
        honest = coll[1]._pack
        for junk in (b'{"int64":5}', b"{}"):  # a vector that does not inflate; plain bytes
            coll[1]._pack = lambda _vector, junk=junk: len(junk).to_bytes(4, "little") + junk
            outcomes = await reduce_all(coll, xs, errors=True)
            assert all(isinstance(o, ShapeError) for o in outcomes), outcomes
            assert all("rank 1: unreadable slice" in str(o) for o in outcomes), outcomes
        coll[1]._pack = honest
        results = await reduce_all(coll, xs)
        assert all(np.array_equal(r.total, exact_sum(xs)) for r in results)
    run(body())


def test_a_peer_that_vanishes_is_dropped_and_the_rest_sum_without_it():
    async def body():
        net = MemoryNetwork()
        coll = await group(4, net)
        xs = vectors(4, 1000)
        net.cut("p2")
        results = await asyncio.gather(
            *(coll[i].allreduce_int64(xs[i], timeout=T) for i in (0, 1, 3)))
        for res in results:
            assert res.contributors == (0, 1, 3)
            assert np.array_equal(res.total, exact_sum([xs[0], xs[1], xs[3]]))
        assert all(coll[i].members == (0, 1, 3) for i in (0, 1, 3))
        gathered = await asyncio.gather(*(coll[i].allgather_bytes(b"%d" % i, timeout=T)
                                          for i in (0, 1, 3)))
        assert all(g == [b"0", b"1", None, b"3"] for g in gathered)
    run(body())


def dies_while_sending_its_sum(net: MemoryNetwork, peer_id: str, reaches: set[str],
                               members: int) -> None:
    """`peer_id`, one of `members`, hands its reduced chunk to `reaches` only, then vanishes
    (a tab closed between the leader's commit and the all-gather)."""
    end = net.ends[peer_id]
    plain_send, sent = end.send, []

    def send(peer: str, data: bytes) -> None:
        if data[2] != Op.SUM:
            return plain_send(peer, data)
        sent.append(peer)
        if peer in reaches:
            plain_send(peer, data)
        if len(sent) == members - 1:
            net.cut(peer_id)

    end.send = send


@pytest.mark.parametrize("reaches", [set(), {"p0"}, {"p2"}, {"p0", "p3"}])
def test_a_peer_lost_after_the_commit_costs_time_not_agreement(reaches):
    """Whoever got the lost owner's reduced chunk passes it on; if nobody got it, every
    survivor retries without that peer. Either way all survivors return the same sum."""
    async def body():
        net = MemoryNetwork()
        coll = await group(4, net)
        xs = vectors(4, 1001, seed=len(reaches))
        dies_while_sending_its_sum(net, "p1", reaches, 4)
        outcomes = await reduce_all(coll, xs, errors=True)
        assert isinstance(outcomes[1], PeerLost)
        survivors = [outcomes[i] for i in (0, 2, 3)]
        expected = (0, 1, 2, 3) if reaches else (0, 2, 3)
        for res in survivors:
            assert isinstance(res, ReduceResult), res
            assert res.contributors == expected
            assert np.array_equal(res.total, exact_sum([xs[r] for r in expected]))
        more = await asyncio.gather(*(coll[i].allreduce_int64(xs[i], timeout=T)
                                      for i in (0, 2, 3)))
        assert all(r.contributors == (0, 2, 3) for r in more)
    run(body())


def test_a_peer_admitted_at_a_commit_that_is_retried_joins_at_the_retry():
    async def body():
        net = MemoryNetwork()
        coll = await group(3, net)
        joiner_mesh = net.join("late")
        assert coll[0].admit("late") == 3
        xs = vectors(4, 64)
        dies_while_sending_its_sum(net, "p1", set(), 3)
        outcomes = await reduce_all(coll, xs[:3], errors=True)
        assert [o.contributors for o in (outcomes[0], outcomes[2])] == [(0, 2)] * 2
        assert all(coll[i].members == (0, 2, 3) for i in (0, 2))
        late = await connect(joiner_mesh, coll[0].ranks, group=7, members=coll[0].members,
                             seq=coll[0].seq)
        everyone = [coll[0], coll[2], late]
        results = await reduce_all(everyone, [xs[0], xs[2], xs[3]])
        assert all(r.contributors == (0, 2, 3) for r in results)
        assert all(np.array_equal(r.total, xs[0] + xs[2] + xs[3]) for r in results)
    run(body())


def test_a_member_that_never_comes_is_dropped_at_the_deadline_and_told_so():
    async def body():
        coll = await group(3)
        xs = vectors(3, 50)
        results = await asyncio.gather(*(coll[i].allreduce_int64(xs[i], timeout=0.3)
                                         for i in (0, 1)))
        assert all(r.contributors == (0, 1) for r in results)
        assert np.array_equal(results[0].total, xs[0] + xs[1])
        with pytest.raises(PeerLost) as lost:
            await coll[2].allreduce_int64(xs[2], timeout=0.3)
        assert lost.value.ranks == (2,)
    run(body())


def test_losing_the_leader_ends_the_group_for_everyone():
    async def body():
        net = MemoryNetwork()
        coll = await group(3, net)
        net.cut("p0")
        outcomes = await asyncio.gather(*(coll[i].barrier(timeout=T) for i in (1, 2)),
                                        return_exceptions=True)
        assert all(isinstance(o, PeerLost) and o.ranks == (0,) for o in outcomes), outcomes
        with pytest.raises(PeerLost):
            await coll[1].allreduce_int64(np.zeros(3, np.int64), timeout=T)
    run(body())


def test_star_collectives():
    async def body():
        coll = await group(3)
        got = await asyncio.gather(*(c.broadcast_bytes(b"cfg" if c.rank == 1 else None, root=1,
                                                       timeout=T) for c in coll))
        assert got == [b"cfg"] * 3
        got = await asyncio.gather(*(c.allgather_bytes(bytes([c.rank]) * c.rank, timeout=T)
                                     for c in coll))
        assert all(g == [b"", b"\x01", b"\x02\x02"] for g in got)
        await asyncio.gather(*(c.barrier(timeout=T) for c in coll))
    run(body())


def test_a_peer_admitted_by_the_leader_takes_part_from_the_next_collective():
    async def body():
        net = MemoryNetwork()
        coll = await group(2, net)
        joiner_mesh = net.join("late")
        assert coll[0].admit("late") == 2
        await asyncio.gather(*(c.broadcast_bytes(b"ctl" if c.rank == 0 else None, timeout=T)
                               for c in coll))
        assert [c.members for c in coll] == [(0, 1, 2)] * 2
        late = await connect(joiner_mesh, coll[0].ranks, group=7, members=coll[0].members,
                             seq=coll[0].seq)
        everyone = [*coll, late]
        xs = vectors(3, 77)
        results = await reduce_all(everyone, xs)
        assert all(np.array_equal(r.total, exact_sum(xs)) for r in results)
        assert all(r.contributors == (0, 1, 2) for r in results)
    run(body())


def test_frames_of_another_group_on_the_same_mesh_are_ignored():
    async def body():
        net = MemoryNetwork()
        old = await group(2, net, gid=1)
        router_meshes = [net.ends["p0"], net.ends["p1"]]
        stale = HEADER.pack(b"C", 1, 1, 0, 0, 1, 0, 0, 8) + np.int64(5).tobytes()
        await old[0].close()
        await old[1].close()
        new = [await connect(m, ["p0", "p1"], group=2) for m in router_meshes]
        router_meshes[0].send("p1", stale)
        xs = vectors(2, 8)
        results = await reduce_all(new, xs)
        assert all(np.array_equal(r.total, xs[0] + xs[1]) for r in results)
    run(body())


def test_router_splits_channels_by_tag_and_tells_each_about_gone_peers():
    async def body():
        net = MemoryNetwork()
        a, b = net.join("a"), net.join("b")
        router = MeshRouter(b)
        run_chan, coll_chan = router.channel(b"R"), router.channel(b"C")
        router.start()
        a.send("b", b"Rhello")
        a.send("b", b"Cframe")
        assert await run_chan.recv() == ("a", b"")
        assert await run_chan.recv() == ("a", b"Rhello")
        assert await coll_chan.recv() == ("a", b"")
        assert await coll_chan.recv() == ("a", b"Cframe")
        net.cut("a")
        assert await run_chan.recv() == ("a", None)
        assert await coll_chan.recv() == ("a", None)
        router.stop()
    run(body())


def test_chunk_bounds_cover_the_vector_once():
    for length in (0, 1, 7, 100):
        for parts in (1, 2, 3, 8):
            b = chunk_bounds(length, parts)
            assert b[0] == 0 and b[-1] == length and b == sorted(b)
