"""The cross-check's recomputations run while the reduce waits, natively in a worker thread,
and change no bit: two peers over the memory mesh against one trainer alone."""

from __future__ import annotations

import asyncio
import threading

from pynode.comm import webrtc
from pynode.comm.mesh import MemoryNetwork
from pynode.config import RunConfig

# cross_check 1: every microbatch is recomputed by the other peer, every step
CFG = RunConfig.from_dict({"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16,
                           "microbatch_size": 2, "microbatches": 4, "steps": 3, "seed": 4,
                           "cross_check": 1})


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
        hashes: list[list[str]] = [[], []]
        for _ in range(CFG.steps):
            results = await asyncio.gather(*(t.step() for t in trainers))
            for rank, result in enumerate(results):
                hashes[rank].append(result.hash)
        for c in colls:
            await c.close()
        return hashes, threads

    want = asyncio.run(alone())
    hashes, threads = asyncio.run(pair())
    assert hashes == [want, want]
    main = threading.main_thread().name
    # every microbatch recomputed once, by the peer that did not own it (the plan follows
    # measured speeds), never on the event loop's thread
    assert len(threads[0]) + len(threads[1]) == CFG.microbatches * CFG.steps
    assert all(name != main for t in threads for name in t), threads
