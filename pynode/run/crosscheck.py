"""Cross-peer checks: any peer's microbatches may be recomputed by another before a step.

The per-call product check (pynode/core/gemm/check.py) proves each GEMM; this proves the
rest of a peer's work: its data, its other kernels, its fixed-point conversion, and that
it adds up what it says. Every microbatch's contribution (its P fixed-point gradients and
its fixed-point loss) has a digest, a random linear form mod 2**64 keyed by (seed, step),
cut to DIGEST_BITS. The owner adds each digest into the step's reduced vector next to the
microbatch's coverage count, so by the end of the reduce every peer holds every owner's
commitment. A seeded sample of microbatches (each with probability 1 / cfg.cross_check)
is then recomputed, each by one peer other than its owner (a step's picks fall together,
at most one per owner of up to cross_check microbatches, and go to the peers with the
least work, so they run side by side); a mismatch is arbitrated by every other peer
recomputing that microbatch, and the strict majority of digests decides who computed it
wrong. The step's total never holds a wrong peer's partial: the others recompute its
microbatches (pynode/run/peercheck.py, PeerCheck.verify).

The plan of who checks what is a function of (seed, step, the step's plan, owners,
capacities) only, so every peer derives the same one and knows without a message whether
this step has a round.

Legend: P parameters, n microbatches.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from pynode.config import RunConfig
from pynode.core import rng

DIGEST_PURPOSE = 0xD16E
SAMPLE_PURPOSE = 0x5A3E
# 48 bits: the digests travel in the int64 all-reduce, whose headroom check allows
# world_size * max|x| < 2**63 (2**15 peers); a wrong contribution still collides with
# probability about 2**-48.
DIGEST_BITS = 48


class DigestKey:
    """The random linear form of one step: R (P + 1,) uint64."""

    def __init__(self, cfg: RunConfig, step: int, size: int, raw64: Any = rng.raw64) -> None:
        # raw64: rng.raw64 or a gated kernel of it (Kernels.raw64, the same words faster)
        self.r = raw64((DIGEST_PURPOSE, cfg.seed, step), size + 1).astype(np.uint64)

    def digest(self, fixed: np.ndarray, loss: int) -> int:
        """Digest of one microbatch: `fixed` (P,) int64 gradients, `loss` its fixed loss."""
        acc = int(np.dot(fixed.view(np.uint64), self.r[:-1]))  # wraps mod 2**64
        acc = (acc + (loss % 2**64) * int(self.r[-1])) % 2**64
        return acc >> (64 - DIGEST_BITS)


def sampled(cfg: RunConfig, step: int, plan: dict[int, list[int]]) -> list[int]:
    """Microbatches of step `step` (1-based) recomputed by another peer, given the step's
    plan (rank -> its microbatches): each with probability 1 / cfg.cross_check, none when
    it is 0.

    The picks of a step fall together: one draw u in [0, cross_check) picks, of every
    owner's microbatches in index order, those whose position is u modulo cross_check. So
    each microbatch is still picked with probability 1 / cross_check, but the picks come
    together: an owner of m microbatches has ceil(m / cross_check) or fewer (none when its
    m <= u), and their checkers recompute them side by side. A group waits for
    recomputations in min(max(owned), cross_check) / cross_check of the steps, where
    independent picks made it wait in about 1 - (1 - 1 / cross_check) ** microbatches.
    """
    if cfg.cross_check == 0:
        return []
    (word,) = rng.raw64((SAMPLE_PURPOSE, cfg.seed, step), 1).tolist()
    u = word % cfg.cross_check
    return sorted(i for indices in plan.values()
                  for position, i in enumerate(sorted(indices)) if position % cfg.cross_check == u)


def picked_share(cfg: RunConfig, plan: dict[int, list[int]]) -> float:
    """The share of steps whose sample under `plan` picks anything: sampled's draw u picks
    when some owner has more than u microbatches, so min(max owned, cross_check) /
    cross_check (0 with cross_check 0). In a group those steps have a check round."""
    if cfg.cross_check == 0:
        return 0.0
    owned = max((len(indices) for indices in plan.values()), default=0)
    return min(owned, cfg.cross_check) / cfg.cross_check


def checkers(cfg: RunConfig, step: int, picks: list[int], owners: dict[int, int],
             capacities: dict[int, float]) -> dict[int, int]:
    """Who recomputes each pick (microbatch -> rank): a worker (a rank of `capacities`)
    other than the pick's owner, the one that would finish its share of the step soonest
    with it (its microbatches and recomputations so far over its capacity), ties broken
    by a seeded rotation. Picks with no such worker are left out.

    A function of its arguments only, so every peer derives the same assignment."""
    workers = sorted(capacities)
    if not workers:
        return {}
    (word,) = rng.raw64((SAMPLE_PURPOSE, cfg.seed, step, 1), 1).tolist()
    turn = {r: (k - word) % len(workers) for k, r in enumerate(workers)}
    owned = Counter(owners.values())
    work = {r: owned[r] for r in workers}
    assigned: dict[int, int] = {}
    for i in sorted(picks):
        others = [r for r in workers if r != owners.get(i) and capacities[r] > 0]
        if not others:
            continue
        checker = min(others, key=lambda r: ((work[r] + 1) / capacities[r], turn[r]))
        assigned[i] = checker
        work[checker] += 1
    return assigned


def majority(digests: dict[int, int]) -> int | None:
    """The digest more than half of `digests` (rank -> digest) hold; None if none does."""
    if not digests:
        return None
    value, votes = Counter(digests.values()).most_common(1)[0]
    return value if 2 * votes > len(digests) else None
