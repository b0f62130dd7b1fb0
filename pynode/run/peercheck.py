"""A peer's side of the cross-peer check: the step's sample and digests, the recomputations
this peer owes, the round that compares them, and what a dispute leaves out.

pynode.run.crosscheck decides who checks what from (seed, step, plan, capacities) alone;
this runs it with the trainer's collective. One PeerCheck per Trainer (`trainer.peers`).
A step goes: `sample` (from the plan, once), `digest` of each picked microbatch this peer
owns (into the reduced vector), `start` (natively a worker thread recomputes this peer's
picks while the reduce waits), then `verify` after the reduce.

Legend: P parameters, n microbatches.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import numpy as np

from pynode import platform
from pynode.core.plan import microbatch_plan
from pynode.run import crosscheck
from pynode.run.errors import ContributionError, VerificationError

log = logging.getLogger("pynode.run")


class PeerCheck:
    """The cross-check of one trainer's steps."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer  # the pynode.run.trainer.Trainer whose steps it checks
        # (step, its sample, its digest key once needed)
        self._sample: tuple[int, list[int], crosscheck.DigestKey | None] | None = None
        # this peer's recomputations of the step under way (start)
        self._rechecks: asyncio.Future | None = None
        self.round_step: int | None = None  # the last step that had a check round (verify)

    def sample(self, step: int, plan: dict[int, list[int]] | None = None) -> list[int]:
        """Step `step`'s picks (crosscheck.sampled), drawn from its plan once: microbatches
        re-planned later in the step keep their place in the sample."""
        if self._sample is None or self._sample[0] != step:
            t = self.trainer
            picks = crosscheck.sampled(t.cfg, step, t.plan() if plan is None else plan)
            self._sample = (step, picks, None)
        return self._sample[1]

    def checkers(self, picks: list[int], owners: dict[int, int]) -> dict[int, int]:
        """Who recomputes each of `picks` this step (crosscheck.checkers)."""
        t = self.trainer
        return crosscheck.checkers(t.cfg, t.state.step + 1, picks, owners,
                                   t.worker_capacities())

    def digest(self, index: int, fixed: np.ndarray, loss: int) -> int:
        """The next step's digest of microbatch `index`'s contribution; 0 unless it is in
        the step's sample (known in advance, so only those need one), or alone."""
        t = self.trainer
        step = t.state.step + 1
        if t.collective is None or index not in self.sample(step):
            return 0
        if self._sample[2] is None:
            key = crosscheck.DigestKey(t.cfg, step, t.size, t.kernels.raw64)
            self._sample = (*self._sample[:2], key)
        return self._sample[2].digest(fixed, loss)

    def owed(self, owners: dict[int, int], sample: list[int]) -> list[int]:
        """The picks of `sample` this peer recomputes: those crosscheck gives its rank, and
        of those its share (a cluster behind one rank splits them, Trainer.shared)."""
        t = self.trainer
        return t.shared(sorted(i for i, r in self.checkers(sample, owners).items()
                               if r == t.rank()))

    def round_share(self, plan: dict[int, list[int]]) -> float:
        """The share of steps that have a check round under `plan`: those whose sample
        picks anything (crosscheck.picked_share) in a group, none alone."""
        t = self.trainer
        if t.collective is None or len(t.members()) < 2:
            return 0.0
        return crosscheck.picked_share(t.cfg, plan)

    def start(self, plan: dict[int, list[int]]) -> None:
        """Start this peer's recomputations: the sample and who recomputes what follow from
        the plan, so natively a worker thread recomputes while the reduce waits for the
        others. The model computes nothing else meanwhile (a re-plan settles first). The
        page has no threads: there `verify` recomputes after the reduce."""
        t = self.trainer
        owners = {i: r for r, indices in plan.items() for i in indices}
        picks = self.owed(owners, [i for i in self.sample(t.state.step + 1, plan) if i in owners])
        self._rechecks = None
        if t.collective is None or len(t.members()) < 2 or not picks:
            return
        if not platform.IN_PYODIDE:
            self._rechecks = asyncio.ensure_future(asyncio.to_thread(
                lambda: {(i, owners[i]): t.recheck(i) for i in picks}))

    async def settle(self) -> dict[tuple[int, int], int]:
        """The digests `start` computed, as {(microbatch, its owner): digest}."""
        future, self._rechecks = self._rechecks, None
        return {} if future is None else await future

    async def verify(
        self, total: np.ndarray, mine: np.ndarray, owners: dict[int, int],
        early: dict[tuple[int, int], int] | None = None,
    ) -> np.ndarray:
        """Have this step's sampled microbatches recomputed by other peers (crosscheck.py).

        Returns `total`, or, when a peer computed something the majority did not, the total
        of the others, who recompute its microbatches: a wrong peer's work is never applied.
        Raises VerificationError when peers disagree and no strict majority decides.
        """
        t = self.trainer
        step = t.state.step + 1
        sample = [i for i in self.sample(step) if i in owners]
        if t.collective is None or len(t.members()) < 2 or not sample:
            return total
        self.round_step = step
        committed = self.committed(total)
        early = early or {}
        checks = {i: early[i, owners[i]] if (i, owners[i]) in early else t.recheck(i)
                  for i in self.owed(owners, sample)}
        disputed = sorted({i for _, found in await self.gather(checks)
                           for i, d in found.items() if d != committed[i]})
        if not disputed:
            return total
        wrong = await self.arbitrate(step, disputed, owners, committed)
        t.distrusted |= wrong
        return await self.leave_out(step, wrong, total, mine, owners)

    async def arbitrate(self, step: int, disputed: list[int], owners: dict[int, int],
                        committed: dict[int, int]) -> set[int]:
        """Every trusted peer (Trainer.workers: none named wrong before) but the owner
        recomputes each disputed microbatch; the strict majority of their digests and the
        owner's commitment decides. Returns the ranks that computed one wrong. The leader
        tells the group's story; a named peer says so itself.
        """
        t = self.trainer
        me, trusted = t.rank(), set(t.workers())
        level = logging.WARNING if me == min(t.members()) else logging.INFO
        mine = [i for i in disputed if owners[i] != me] if me in trusted else []
        seen = await self.gather({i: t.recheck(i) for i in t.shared(mine)})
        wrong: set[int] = set()
        for i in disputed:
            digests = {owners[i]: committed[i]}
            digests.update({r: found[i] for r, found in seen if i in found and r in trusted})
            right = crosscheck.majority(digests)
            listed = ", ".join(f"rank {r} {d:012x}" for r, d in sorted(digests.items()))
            if right is None:
                raise VerificationError(
                    f"step {step}: microbatch {i} (computed by rank {owners[i]}) gave different "
                    f"results on different peers and no strict majority agrees ({listed}); "
                    "stopping: nobody trains on work nobody can confirm")
            off = {r for r, d in digests.items() if d != right}
            log.log(level, "step %d: microbatch %d of rank %d: recomputed by %d peers (%s); "
                    "ranks %s computed it wrong", step, i, owners[i], len(digests) - 1,
                    listed, sorted(off))
            wrong |= off
        return wrong

    async def leave_out(self, step: int, wrong: set[int], total: np.ndarray, mine: np.ndarray,
                        owners: dict[int, int]) -> np.ndarray:
        """The step's total without the partials of `wrong`: the trusted peers (`wrong` is
        among the distrusted by now) recompute their microbatches, re-planned among them as
        every plan is (Trainer.worker_capacities), and the group reduces again."""
        t = self.trainer
        me = t.rank()
        level = logging.WARNING if me == min(t.members()) else logging.INFO
        dropped = sorted(i for i, r in owners.items() if r in wrong)
        workers = t.worker_capacities()
        if me in wrong:
            log.warning("step %d: this peer (rank %d) computed differently from the majority: "
                        "its work is left out and it computes no more microbatches", step, me)
        if not dropped:
            return total
        log.log(level, "step %d: leaving out the work of ranks %s; microbatches %s re-planned "
                "among ranks %s", step, sorted(wrong), dropped, sorted(workers))
        repair = microbatch_plan(len(dropped), workers)
        if me in wrong:
            contribution = np.zeros_like(mine)
        else:
            contribution = mine + t.microbatch_partial([dropped[j] for j in repair.get(me, [])])
        reduced = await t.collective.allreduce_int64(contribution, timeout=t.deadline())
        total = same_length(reduced.total, mine)
        if not np.all(t.counts(total) == 1):
            raise ContributionError(f"step {step}: after leaving out ranks {sorted(wrong)} the "
                                    f"microbatch counts are {t.counts(total).tolist()}")
        return total

    def committed(self, total: np.ndarray) -> dict[int, int]:
        """Each microbatch's digest, as its owner put it into the reduced vector."""
        t = self.trainer
        start = t.size + 1 + t.cfg.microbatches
        return dict(enumerate(int(d) for d in total[start:]))

    async def gather(self, mine: dict[int, int]) -> list[tuple[int, dict[int, int]]]:
        """Every member's recomputed digests (rank, {microbatch: digest}); lost members and
        entries that do not parse (a cluster whose ranks disagree) are left out.

        Sent as `json|0`: the shape of check_agreement's entries. A cluster behind a room
        peer publishes one entry, the union of its ranks' shares (TrainOptions.share;
        pynode.run.cluster.agreement_entry)."""
        t = self.trainer
        blobs = await t.collective.allgather_bytes(
            json.dumps({str(i): d for i, d in mine.items()}).encode() + b"|0",
            timeout=t.deadline(),
        )
        found = []
        for rank, blob in enumerate(blobs):
            if blob is None:  # a lost member: nothing to read, nothing to say every round
                continue
            try:
                found.append((rank, {int(i): int(d) for i, d
                                     in json.loads(blob.partition(b"|")[0]).items()}))
            except (AttributeError, ValueError):
                log.warning("rank %d sent no readable digests", rank)
        return found


def same_length(total: np.ndarray, partial: np.ndarray) -> np.ndarray:
    """`total`, if it has the layout of this peer's `partial`; a reduced vector of another
    length would shift the gradient, loss and coverage fields into each other."""
    if total.shape != partial.shape:
        raise ContributionError(
            f"the reduced step holds {total.shape} values, this model needs {partial.shape}"
        )
    return total
