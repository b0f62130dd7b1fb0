"""Capacity-weighted assignment of a step's microbatches to peers (pure)."""

from __future__ import annotations

from fractions import Fraction


def microbatch_plan(count: int, capacities: dict[int, float]) -> dict[int, list[int]]:
    """Split microbatch indices 0..count-1 among peers in proportion to their capacity.

    Largest-remainder apportionment with exact fractions, ties broken by rank, so every
    peer that computes the plan from the same inputs gets the same answer. The plan only
    decides who computes what; the step's result does not depend on it.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    ranks = sorted(capacities)
    if not ranks:
        raise ValueError("no peers to plan for")
    weights = {r: Fraction(capacities[r]).limit_denominator(10**6) for r in ranks}
    if any(w < 0 for w in weights.values()) or sum(weights.values()) == 0:
        raise ValueError(f"capacities must be >= 0 and not all zero: {capacities}")
    total = sum(weights.values())
    quotas = {r: weights[r] * count / total for r in ranks}
    shares = {r: int(quotas[r]) for r in ranks}
    leftover = count - sum(shares.values())
    by_remainder = sorted(ranks, key=lambda r: (-(quotas[r] - shares[r]), r))
    for r in by_remainder[:leftover]:
        shares[r] += 1
    plan, start = {}, 0
    for r in ranks:
        plan[r] = list(range(start, start + shares[r]))
        start += shares[r]
    return plan


def replica_microbatches(replica: int, microbatches: int, replicas: int) -> list[int]:
    """The microbatch indices replica `replica` of `replicas` takes in each of its inner
    steps (--sync-every): the replica-th contiguous block of microbatches/replicas."""
    if replicas < 1 or microbatches % replicas or not 0 <= replica < replicas:
        raise ValueError(f"replica {replica} of {replicas} over {microbatches} microbatches")
    per = microbatches // replicas
    return list(range(replica * per, (replica + 1) * per))
