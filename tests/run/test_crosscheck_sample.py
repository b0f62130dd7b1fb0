"""The cross-check's sample and who recomputes it (pynode/run/crosscheck.py): each
microbatch picked with probability 1 / cross_check, a step's picks together (at most
ceil(m / cross_check) of an owner's m), and their recomputations spread over the peers
with the least work."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pynode.config import RunConfig
from pynode.core.plan import microbatch_plan
from pynode.run import crosscheck

CFG = RunConfig().with_(microbatches=8)
STEPS = range(1, 8001)


def owners_of(plan: dict[int, list[int]]) -> dict[int, int]:
    return {i: r for r, indices in plan.items() for i in indices}


@pytest.mark.parametrize("caps", [{0: 1.0, 1: 1.0}, {0: 1.0, 1: 2.0, 2: 5.0}, {0: 1.0}])
def test_every_microbatch_is_picked_with_the_configured_chance(caps):
    plan = microbatch_plan(CFG.microbatches, caps)
    picked = Counter(i for step in STEPS for i in crosscheck.sampled(CFG, step, plan))
    for i in range(CFG.microbatches):
        # 1/32 of 8,000 steps: 250 expected, binomial sd ~15.6
        assert 180 <= picked[i] <= 320, (i, picked[i])


def test_a_steps_picks_fall_together_one_per_owner():
    plan = microbatch_plan(CFG.microbatches, {0: 1.0, 1: 1.0})
    owners = owners_of(plan)
    samples = [crosscheck.sampled(CFG, step, plan) for step in STEPS]
    checked = [s for s in samples if s]
    assert all(sorted(owners[i] for i in s) == [0, 1] for s in checked)
    # 4 of every 32 draws check, against 1 - (31/32)**8 = 22 % of steps with independent picks
    assert 0.10 <= len(checked) / len(samples) <= 0.15


@pytest.mark.parametrize("every", [2, 4, 32])
def test_an_owner_has_at_most_its_share_of_a_steps_picks(every):
    cfg = CFG.with_(cross_check=every)
    plan = microbatch_plan(cfg.microbatches, {0: 1.0, 1: 2.0, 2: 5.0})  # 1, 2, 5 microbatches
    owners = owners_of(plan)
    seen = set()
    for step in STEPS[:2000]:
        picks = crosscheck.sampled(cfg, step, plan)
        per_owner = Counter(owners[i] for i in picks)
        for rank, indices in plan.items():
            assert per_owner[rank] <= -(-len(indices) // every)
        # owners with more microbatches are never left out while a smaller one has a pick
        if per_owner:
            smallest = min(len(plan[r]) for r in per_owner)
            assert all(per_owner[r] for r in plan if len(plan[r]) >= smallest)
        seen.add(tuple(sorted(per_owner.items())))
    assert len(seen) >= 2  # steps differ in who is checked


def test_every_pick_is_recomputed_once_by_another_peer_side_by_side():
    caps = {0: 1.0, 1: 1.0}
    plan = microbatch_plan(CFG.microbatches, caps)
    owners = owners_of(plan)
    for step in STEPS[:400]:
        picks = crosscheck.sampled(CFG, step, plan)
        who = crosscheck.checkers(CFG, step, picks, owners, caps)
        assert sorted(who) == picks
        assert all(who[i] != owners[i] for i in picks)
        assert len(set(who.values())) == len(who)  # each peer recomputes one


def test_recomputations_go_to_the_peers_that_finish_first():
    caps = {0: 1.0, 1: 2.0, 2: 5.0}
    plan = microbatch_plan(CFG.microbatches, caps)  # 1, 2 and 5 microbatches
    owners = owners_of(plan)
    # microbatch 2 is rank 1's, 4 rank 2's: rank 2 ends first with one more ((5 + 1) / 5),
    # then rank 1 ((2 + 1) / 2) before rank 0 ((1 + 1) / 1)
    assert crosscheck.checkers(CFG, 5, [2, 4], owners, caps) == {2: 2, 4: 1}
    # a peer left alone checks nothing; a peer of capacity 0 checks nothing
    assert crosscheck.checkers(CFG, 5, [0], {0: 0}, {0: 1.0}) == {}
    assert crosscheck.checkers(CFG, 5, [0], {0: 0}, {0: 1.0, 1: 0.0}) == {}


def test_the_assignment_is_the_same_on_every_peer_and_seeded():
    caps = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    owners = {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2, 6: 3, 7: 3}
    # one pick of rank 0: the three others tie, so the seeded rotation decides
    chosen = {crosscheck.checkers(CFG, step, [0], owners, caps)[0] for step in range(1, 200)}
    assert chosen == {1, 2, 3}
    assert (crosscheck.checkers(CFG, 7, [0, 2], owners, dict(reversed(caps.items())))
            == crosscheck.checkers(CFG, 7, [0, 2], owners, caps))


def test_cross_check_one_picks_everything_and_zero_nothing():
    plan = microbatch_plan(CFG.microbatches, {0: 1.0, 1: 1.0})
    assert crosscheck.sampled(CFG.with_(cross_check=1), 3, plan) == list(range(8))
    assert crosscheck.sampled(CFG.with_(cross_check=0), 3, plan) == []


@pytest.mark.parametrize(("every", "caps"), [
    (32, {0: 1.0, 1: 1.0}), (32, {0: 1.0, 1: 2.0, 2: 5.0}), (4, {0: 1.0, 1: 2.0, 2: 5.0}),
    (2, {0: 1.0, 1: 1.0}), (1, {0: 1.0}), (0, {0: 1.0, 1: 1.0}),
])
def test_the_share_of_steps_with_picks_is_the_samples_law(monkeypatch, every, caps):
    """Every value of the step's draw, once: the steps that pick something are the share
    picked_share states (bench scaling weighs a step's check round by it)."""
    cfg = CFG.with_(cross_check=every)
    plan = microbatch_plan(cfg.microbatches, caps)
    draws = range(max(every, 1))
    words = iter(draws)
    monkeypatch.setattr(crosscheck.rng, "raw64",
                        lambda key, n: np.array([next(words)], np.uint64))
    picking = sum(bool(crosscheck.sampled(cfg, 1, plan)) for _ in draws)
    assert crosscheck.picked_share(cfg, plan) == picking / len(draws)
