"""A loopback pair's large all-reduces go through shared memory (pynode/comm/shared.py):
the same sums as over the socket, a few bytes on the socket, and no file left behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import numpy as np
import pytest
from comm_helpers import loopback_group, oracle_sum, run_peers

from pynode.comm import loopback, shared
from pynode.comm.loopback import SHARED_MIN


def vectors(round_: int, n: int = SHARED_MIN + 5) -> list[np.ndarray]:
    """Each rank's vector of one round: different in every round and rank, large values."""
    return [np.random.default_rng((round_, rank)).integers(-2**40, 2**40, n, dtype=np.int64)
            for rank in range(2)]


@contextlib.asynccontextmanager
async def pair(tmp_path: Path):
    """A loopback pair in this process, closed (its file removed) whatever the test does."""
    hub, member = await loopback_group(2, tmp_path)
    try:
        yield hub, member
    finally:
        await asyncio.gather(hub.close(), member.close())


async def reduce_pair(group: list, xs: list[np.ndarray]) -> list:
    return list(await asyncio.gather(*(m.allreduce_int64(x, timeout=10) for m, x in
                                       zip(group, xs, strict=True))))


def test_a_pairs_large_vectors_go_through_shared_memory_with_the_same_sums(tmp_path: Path):
    async def scenario() -> None:
        async with pair(tmp_path) as (hub, member):
            sent = []
            for round_ in range(7):  # the first packed, offering the file; then rows 0, 1, 0 ...
                xs = vectors(round_)
                before = member.bytes_sent
                for result in await reduce_pair([hub, member], xs):
                    assert result.total.tolist() == oracle_sum(xs)
                    assert result.contributors == (0, 1)
                sent.append(member.bytes_sent - before)
                if round_ == 0:
                    path = hub._shared.path
                    assert os.path.exists(path)  # named until the member has used it
            assert not os.path.exists(path)
            assert sent[0] > 8 * SHARED_MIN // 4  # packed over the socket
            assert max(sent[1:]) < 100  # a frame that says where the vector is
            assert member.bytes_shared == hub.bytes_shared == 6 * 8 * (SHARED_MIN + 5)
            # the results are the callers' own arrays: a later round does not change them
            kept = (await reduce_pair([hub, member], vectors(7)))[1].total
            copy = kept.copy()
            await reduce_pair([hub, member], vectors(8))
            assert np.array_equal(kept, copy)

    asyncio.run(scenario())


def test_small_vectors_and_a_member_that_cannot_map_the_file_stay_packed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(path: str, n: int) -> shared.SharedVectors:
        raise OSError("no shared memory here")

    async def scenario() -> None:
        async with pair(tmp_path) as (hub, member):
            for round_ in range(3):
                xs = vectors(round_, n=257)
                for result in await reduce_pair([hub, member], xs):
                    assert result.total.tolist() == oracle_sum(xs)
            assert hub._shared is None and hub.bytes_shared == member.bytes_shared == 0
            monkeypatch.setattr(shared.SharedVectors, "attach", staticmethod(refuse))
            offered = []
            create = shared.SharedVectors.create

            def counted(n: int) -> shared.SharedVectors:
                made = create(n)
                offered.append(made.path)
                return made

            monkeypatch.setattr(shared.SharedVectors, "create", staticmethod(counted))
            for round_ in range(3):
                xs = vectors(round_)
                for result in await reduce_pair([hub, member], xs):
                    assert result.total.tolist() == oracle_sum(xs)
            assert member._shared is None and member.bytes_shared == 0
            # it declined by packing: the hub removed the file and offers none again
            assert hub._shared is None and hub._declined == SHARED_MIN + 5
            assert not [f for f in os.listdir(os.path.dirname(offered[0]))
                        if f == os.path.basename(offered[0])]
            assert len(offered) == 1

    asyncio.run(scenario())


def test_a_new_length_gets_a_new_file_and_the_old_one_goes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with pair(tmp_path) as (hub, member):
            for n in (SHARED_MIN, SHARED_MIN, 2 * SHARED_MIN, 2 * SHARED_MIN, 2 * SHARED_MIN):
                xs = vectors(n, n=n)
                first = hub._shared.path if hub._shared else None
                for result in await reduce_pair([hub, member], xs):
                    assert result.total.tolist() == oracle_sum(xs)
                if first is not None and hub._shared.path != first:
                    assert not os.path.exists(first)
            assert hub._shared.n == member._shared.n == 2 * SHARED_MIN
            assert member.bytes_shared == 8 * (SHARED_MIN + 2 * 2 * SHARED_MIN)
            last = hub._shared.path
        assert not os.path.exists(last)

    asyncio.run(scenario())


def test_the_member_maps_only_a_pairs_file_of_the_right_size(tmp_path: Path) -> None:
    """A path that is not a pair's shared vectors, or of another length, is not mapped
    (the member goes on packing)."""
    other = tmp_path / "something"
    other.write_bytes(b"\0" * 3 * 8 * 10)
    with pytest.raises(OSError, match="not a pair's shared vectors"):
        shared.SharedVectors.attach(str(other), 10)
    made = shared.SharedVectors.create(10)
    try:
        with pytest.raises(OSError, match="not 264"):
            shared.SharedVectors.attach(made.path, 11)
        seen = shared.SharedVectors.attach(made.path, 10)
        made.rows[2] = np.arange(10)
        assert seen.rows[2].tolist() == list(range(10))
        seen.close()
    finally:
        made.unlink()
        made.close()
    assert not os.path.exists(made.path)
    assert loopback.SHARED_MIN > 257  # the small vectors above stay packed


def test_a_queued_all_reduce_does_not_write_the_row_the_hub_still_reads(tmp_path: Path):
    """A member may call all-reduce again before the last one returned (the calls queue):
    the second vector goes into shared memory only in its turn."""
    async def scenario() -> None:
        async with pair(tmp_path) as (hub, member):
            await reduce_pair([hub, member], vectors(0))  # the offer
            for round_ in range(1, 6, 2):
                first, second = vectors(round_), vectors(round_ + 1)

                async def hub_side(a: np.ndarray, b: np.ndarray) -> list:
                    return [await hub.allreduce_int64(a, timeout=10),
                            await hub.allreduce_int64(b, timeout=10)]

                at_hub, *at_member = await asyncio.gather(
                    hub_side(first[0], second[0]), member.allreduce_int64(first[1], timeout=10),
                    member.allreduce_int64(second[1], timeout=10))
                for got, xs in zip(at_hub, (first, second), strict=True):
                    assert got.total.tolist() == oracle_sum(xs)
                for got, xs in zip(at_member, (first, second), strict=True):
                    assert got.total.tolist() == oracle_sum(xs)
            assert member.bytes_shared > 0

    asyncio.run(scenario())


def test_a_hub_without_a_new_file_takes_the_member_off_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new length whose file cannot be made: the member stops using the old file too, so
    the old length goes packed again (and then gets a new file) instead of failing."""
    create = shared.SharedVectors.create
    fail = []

    def flaky(n: int) -> shared.SharedVectors:
        if n in fail:
            fail.remove(n)
            raise OSError("no space left on device")
        return create(n)

    monkeypatch.setattr(shared.SharedVectors, "create", staticmethod(flaky))

    async def scenario() -> None:
        async with pair(tmp_path) as (hub, member):
            small, large = SHARED_MIN, 2 * SHARED_MIN
            fail.append(large)
            for round_, n in enumerate((small, small, large, small, small, small)):
                xs = vectors(round_, n=n)
                for result in await reduce_pair([hub, member], xs):
                    assert result.total.tolist() == oracle_sum(xs)
            assert hub._shared.n == member._shared.n == small

    asyncio.run(scenario())


def test_two_processes_sum_exactly_through_shared_memory(tmp_path: Path) -> None:
    """Two real processes, 200 all-reduces with jittered arrivals, queued calls and other
    collectives between them: every sum on both sides is exact (peer_script's `shared`)."""
    records = run_peers("loopback", 2, f"unix:{tmp_path / 'hub.sock'}", "shared", tmp_path)
    for rank in (0, 1):
        record = records[rank]
        assert record["mismatches"] == 0 and record["reduces"] >= 200
        vector = 8 * 2 * SHARED_MIN
        assert record["bytes_shared"] == (record["reduces"] - 1) * vector  # all but the first
        assert record["bytes_sent"] < 2 * vector  # the first one packed, then small frames
