"""The cross-check's recomputations run while the reduce waits, natively in a worker thread,
and change no bit: two peers over the memory mesh against one trainer alone."""

from __future__ import annotations

import asyncio
import threading

from pynode.comm import webrtc
from pynode.comm.mesh import MemoryNetwork
from pynode.config import RunConfig
from pynode.run import crosscheck
from pynode.run.assemble import build_trainer
from pynode.run.trainer import TrainOptions

# cross_check 1: every microbatch is recomputed by the other peer, every step
CFG = RunConfig.from_dict({"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16,
                           "microbatch_size": 2, "microbatches": 4, "steps": 3, "seed": 4,
                           "cross_check": 1})


async def train_together(trainers: list, colls: list, steps: int) -> list[list[str]]:
    """Each trainer's state hash after each of `steps` steps taken together; then the
    collectives closed."""
    hashes: list[list[str]] = [[] for _ in trainers]
    for _ in range(steps):
        results = await asyncio.gather(*(t.step() for t in trainers))
        for rank, result in enumerate(results):
            hashes[rank].append(result.hash)
    for c in colls:
        await c.close()
    return hashes


def test_rechecks_run_in_a_worker_thread_during_the_reduce_and_change_no_hash(checks):
    async def alone() -> list[str]:
        trainer = checks.make_trainer(CFG, None, None)
        return [(await trainer.step()).hash for _ in range(CFG.steps)]

    async def pair() -> tuple[list[list[str]], list[list[str]]]:
        net = MemoryNetwork()
        ids = ["a", "b"]
        colls = [await webrtc.connect(net.join(i), ids, group=1) for i in ids]
        trainers = [checks.make_trainer(CFG, c, None) for c in colls]
        threads: list[list[str]] = [[], []]
        for rank, trainer in enumerate(trainers):
            def spy(index, trainer=trainer, seen=threads[rank], real=trainers[rank].recheck):
                seen.append(threading.current_thread().name)
                return real(index)
            trainer.recheck = spy
        return await train_together(trainers, colls, CFG.steps), threads

    want = asyncio.run(alone())
    hashes, threads = asyncio.run(pair())
    assert hashes == [want, want]
    main = threading.main_thread().name
    # every microbatch recomputed once, by the peer that did not own it (the plan follows
    # measured speeds), never on the event loop's thread
    assert len(threads[0]) + len(threads[1]) == CFG.microbatches * CFG.steps
    assert all(name != main for t in threads for name in t), threads


# cross_check 2 and unequal capacities: a step's picks depend on the plan, so every peer
# must derive the same sample and checkers from it
SAMPLED = CFG.with_(cross_check=2, microbatches=8, steps=4)
CAPACITIES = {0: 1.0, 1: 2.0, 2: 5.0}  # 1, 2 and 5 microbatches


def test_a_sampled_wrong_peer_is_named_and_left_out_with_unequal_capacities(checks):
    """Rank 2 (5 of 8 microbatches) adds 0.5 to one gradient of each of its microbatches:
    with cross_check 2 some of them are picked in step 1, the two others recompute them,
    name rank 2, and the group ends on the one-peer run's hashes."""
    async def alone() -> list[str]:
        trainer = checks.make_trainer(SAMPLED, None, None)
        return [(await trainer.step()).hash for _ in range(SAMPLED.steps)]

    async def group() -> tuple[list[list[str]], list[set[int]], list[int]]:
        net = MemoryNetwork()
        ids = ["a", "b", "c"]
        colls = [await webrtc.connect(net.join(i), ids, group=1) for i in ids]
        options = TrainOptions(capacities=CAPACITIES)
        trainers = [build_trainer(SAMPLED, c, arithmetic=(checks.units, checks.gemm),
                                  options=options) for c in colls]
        real = trainers[2].contribution

        def wrong(index):
            fixed, loss = real(index)
            fixed = fixed.copy()
            fixed[index] += 1 << (SAMPLED.frac_bits - 1)  # 0.5 off
            return fixed, loss

        trainers[2].contribution = wrong
        rechecked = [0, 0, 0]
        for rank, trainer in enumerate(trainers):
            def spy(index, rank=rank, real=trainer.recheck):
                rechecked[rank] += 1
                return real(index)
            trainer.recheck = spy
        hashes = await train_together(trainers, colls, SAMPLED.steps)
        return hashes, [t.distrusted for t in trainers], rechecked

    want = asyncio.run(alone())
    hashes, distrusted, rechecked = asyncio.run(group())
    assert hashes == [want, want, want]
    assert distrusted == [{2}, {2}, {2}]
    assert rechecked[0] > 0 and rechecked[1] > 0  # both honest peers recomputed


# four equal peers; every microbatch recomputed every step
REPEAT = CFG.with_(cross_check=1, microbatches=8, steps=3)


def test_a_peer_named_wrong_earlier_neither_votes_nor_recomputes_for_the_group(checks):
    """Rank 1 is wrong from step 1 and rank 2 from step 2, each off in its own way. In
    step 2 rank 2's microbatches are arbitrated and re-planned among ranks 0 and 3 only:
    rank 1, named in step 1, neither votes (its own wrong digest would tie the vote) nor
    computes the re-planned microbatches (its wrong work would be applied). The group
    ends on the one-peer run's hashes with both named."""
    async def alone() -> list[str]:
        trainer = checks.make_trainer(REPEAT, None, None)
        return [(await trainer.step()).hash for _ in range(REPEAT.steps)]

    def off(trainer, from_step: int, at: int, amount: int) -> None:
        real = trainer.contribution

        def wrong(index):
            fixed, loss = real(index)
            if trainer.state.step + 1 >= from_step:
                fixed = fixed.copy()
                fixed[index + at] += amount
            return fixed, loss
        trainer.contribution = wrong

    async def group() -> tuple[list[list[str]], list[set[int]]]:
        net = MemoryNetwork()
        ids = ["a", "b", "c", "d"]
        colls = [await webrtc.connect(net.join(i), ids, group=1) for i in ids]
        trainers = [build_trainer(REPEAT, c, arithmetic=(checks.units, checks.gemm),
                                  options=TrainOptions(capacities=dict.fromkeys(range(4), 1.0)))
                    for c in colls]
        off(trainers[1], 1, 0, 1 << (REPEAT.frac_bits - 1))  # 0.5 off
        off(trainers[2], 2, 1, 1 << (REPEAT.frac_bits - 2))  # 0.25 off, another value
        hashes = await train_together(trainers, colls, REPEAT.steps)
        return hashes, [t.distrusted for t in trainers]

    want = asyncio.run(alone())
    hashes, distrusted = asyncio.run(group())
    assert hashes == [want] * 4
    assert distrusted == [{1, 2}] * 4


def test_each_timed_step_says_whether_it_had_a_check_round(checks):
    """StepClock.steps (what `bench scaling` weighs): every step after the first, with its
    time, flagged where the group recomputed its sample, with the share of steps that have
    a round under its plan; a trainer alone has no round whatever its sample."""
    cfg = CFG.with_(cross_check=4, steps=8)  # 2 of each peer's 2: half the steps
    plan = {0: [0, 1], 1: [2, 3]}
    want = [(s, bool(crosscheck.sampled(cfg, s, plan))) for s in range(2, cfg.steps + 1)]
    assert {True, False} <= {had for _, had in want}  # both kinds in these steps

    def make(collective):
        return build_trainer(cfg, collective, None, arithmetic=(checks.units, checks.gemm),
                             options=TrainOptions(capacities={0: 1.0, 1: 1.0}))

    async def pair() -> list:
        net = MemoryNetwork()
        ids = ["a", "b"]
        colls = [await webrtc.connect(net.join(i), ids, group=1) for i in ids]
        trainers = [make(c) for c in colls]
        await train_together(trainers, colls, cfg.steps)
        return [list(t.clock.steps) for t in trainers]

    async def alone() -> list:
        trainer = make(None)
        for _ in range(cfg.steps):
            await trainer.step()
        return list(trainer.clock.steps)

    for times in asyncio.run(pair()):
        assert [(s, had) for s, _, had, _ in times] == want
        assert all(ms > 0 and share == 0.5 for _, ms, _, share in times)
    assert [(s, had, share) for s, _, had, share in asyncio.run(alone())] == [
        (s, False, 0.0) for s, _ in want]


def test_a_lost_member_is_left_out_of_the_digests_without_a_warning(caplog):
    """A room whose tab left: its entry is None in every later round. It logged 'rank 1
    sent no readable digests' at each one (39 times in a user's run); only an entry that
    came and cannot be read is worth a warning."""
    import logging
    from types import SimpleNamespace

    from pynode.run.peercheck import PeerCheck

    class OneLost:
        async def allgather_bytes(self, data, *, timeout):
            return [data, None, b"not json|0"]

    check = PeerCheck(SimpleNamespace(collective=OneLost(), deadline=lambda: 1.0))
    with caplog.at_level(logging.WARNING, logger="pynode.run"):
        found = asyncio.run(check.gather({3: 7}))
    assert found == [(0, {3: 7})]
    assert [r.getMessage() for r in caplog.records] == ["rank 2 sent no readable digests"]
