"""pynode.run.failover: who leads after a lost leader, and from which step (pure decisions)."""

from __future__ import annotations

from pynode.run.failover import next_leader, plan_takeover, remap


def report(held: dict[int, str], words: list | None = None) -> dict:
    return {"held": {str(s): h for s, h in held.items()}, "words": words or []}


def test_the_next_leader_is_the_first_reachable_member_in_rank_order():
    order = ["b", "c", "d"]
    assert next_leader(order, "d", {"b", "c"}) == "b"
    assert next_leader(order, "d", {"c"}) == "c", "b is gone"
    assert next_leader(order, "d", {"b", "c"}, tried={"b", "c"}) == "d"
    assert next_leader(order, "b", set()) == "b"


def test_the_boundary_all_survivors_hold_wins_over_a_later_one():
    """b passed step 5's check, c did not: both hold 4, so the run goes on from 4."""
    plan = plan_takeover("b", report({4: "h4", 5: "h5"}), {"c": report({3: "h3", 4: "h4"})},
                         ["b", "c"])
    assert (plan.step, plan.hash, plan.ranks, plan.left_out) == (4, "h4", ["b", "c"], [])


def test_when_everyone_holds_both_boundaries_nothing_is_computed_again():
    plan = plan_takeover("c", report({4: "h4", 5: "h5"}),
                         {"b": report({4: "h4", 5: "h5"}), "d": report({4: "h4", 5: "h5"})},
                         ["b", "c", "d"])
    assert plan.step == 5 and plan.ranks == ["c", "b", "d"], "the new leader first, then ranks"


def test_a_survivor_holding_other_bits_is_left_out():
    plan = plan_takeover("b", report({4: "h4", 5: "h5"}),
                         {"c": report({4: "h4", 5: "h5"}), "d": report({4: "x4", 5: "x5"})},
                         ["b", "c", "d"])
    assert plan.step == 5 and plan.ranks == ["b", "c"] and plan.left_out == ["d"]


def test_the_boundarys_changes_and_pause_come_from_the_longest_sequence_seen():
    """The old leader's words at boundary 4: a change with a pause, then another change;
    b saw the first only, c both. The words of other boundaries do not count."""
    first, second = [4, {"step": 4, "lr": 0.001}, True], [4, {"step": 4, "steps": 9}, True]
    plan = plan_takeover("b", report({3: "h3", 4: "h4"}, [[3, None, False], first]),
                         {"c": report({4: "h4"}, [first, second])}, ["b", "c"])
    assert plan.step == 4 and plan.change == {"lr": 0.001, "steps": 9} and plan.pause
    plain = plan_takeover("b", report({4: "h4"}, [[3, {"step": 3, "lr": 0.1}, True]]), {},
                          ["b"])
    assert plain.change is None and not plain.pause


def test_capacities_follow_their_peers_to_the_new_ranks():
    assert remap({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}, ["a", "b", "c", "d"], ["c", "b", "d"]) == {
        0: 3.0, 1: 2.0, 2: 4.0}
