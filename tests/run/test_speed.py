"""The speed a peer reports for planning (pynode/run/speed.py): a warm-up or a stall once
must not shut a peer out of the work for the rest of a run."""

from __future__ import annotations

import pytest

from pynode.run.cluster import cluster_speed
from pynode.run.speed import (
    MAX_DOUBLINGS,
    MAX_PATIENCE,
    REMEASURE_STEPS,
    UNKNOWN,
    SpeedMeter,
    planning_speeds,
)


def steps(meter: SpeedMeter, per_step: list[list[float]]) -> list[float]:
    """Each inner list: one step's microbatch times; returns the speed reported after each."""
    speeds = []
    for times in per_step:
        for seconds in times:
            meter.record(seconds)
        meter.end_step()
        speeds.append(meter.speed())
    return speeds


def test_the_first_microbatch_is_a_warm_up_shown_but_never_reported():
    meter = SpeedMeter()
    assert meter.seconds() == 0.0 and meter.speed() == UNKNOWN
    assert steps(meter, [[3.0]]) == [UNKNOWN]  # compiling: not a speed to plan on
    assert meter.seconds() == 3.0  # but what it took is what the peer shows
    assert steps(meter, [[0.01]]) == [pytest.approx(100.0)]
    assert meter.seconds() == 0.01


def test_one_slow_microbatch_does_not_move_the_estimate():
    meter = SpeedMeter()
    steps(meter, [[0.5, 0.01, 0.01, 0.01], [0.01, 0.2, 0.01, 0.01]])
    assert meter.seconds() == 0.01
    # a peer that turned slow for good is planned on its new time within a step or two
    steps(meter, [[0.04, 0.04, 0.04, 0.04]])
    assert meter.seconds() == 0.04


def test_a_peer_left_idle_reports_a_rising_speed_until_it_is_measured_again():
    meter = SpeedMeter()
    idle = steps(meter, [[9.0], [1.0]] + [[]] * (REMEASURE_STEPS + 3))
    assert idle[1:REMEASURE_STEPS + 1] == [1.0] * REMEASURE_STEPS  # patient at first
    assert idle[REMEASURE_STEPS + 1:] == [2.0, 4.0, 8.0, 16.0]  # then twice as fast a step
    assert steps(meter, [[0.01]]) == [pytest.approx(100.0)]  # the old samples are gone
    assert meter.seconds() == 0.01


def test_a_peer_slow_for_good_is_re_measured_less_and_less_often():
    meter = SpeedMeter()
    steps(meter, [[9.0], [1.0]])
    waits = []
    for _ in range(4):
        idle = 0
        while meter.speed() <= 1.0:  # planned nothing until its speed rises past 1
            steps(meter, [[]])
            idle += 1
        waits.append(idle)
        steps(meter, [[1.0]])  # measured: as slow as before, so it idles again
    assert waits == [REMEASURE_STEPS, 2 * REMEASURE_STEPS, 4 * REMEASURE_STEPS,
                     8 * REMEASURE_STEPS]
    steps(meter, [[1.0], [1.0]])  # planned two steps in a row: patient as at first again
    assert meter.patience == REMEASURE_STEPS


def test_a_peer_idle_for_good_reports_a_finite_speed():
    meter = SpeedMeter()
    steps(meter, [[1.0], [1.0]])
    steps(meter, [[]] * (MAX_PATIENCE + 100))
    assert meter.speed() == 2.0 ** MAX_DOUBLINGS


def test_unknown_speeds_are_planned_at_the_median_of_the_known():
    assert planning_speeds({0: 100.0, 1: UNKNOWN, 2: 50.0, 3: 80.0}) == \
        {0: 100.0, 1: 80.0, 2: 50.0, 3: 80.0}
    assert planning_speeds({0: UNKNOWN, 1: UNKNOWN}) == {0: 1.0, 1: 1.0}
    assert planning_speeds({0: float("nan"), 1: float("inf"), 2: -3.0, 3: 7.0}) == \
        {0: 7.0, 1: 7.0, 2: 7.0, 3: 7.0}


def test_a_cluster_counts_a_rank_past_only_its_warm_up_at_the_others_mean():
    assert cluster_speed([b"10.0", b"0.0", b"20.0"]) == pytest.approx(45.0)
    assert cluster_speed([b"10.0", b"20.0"]) == pytest.approx(30.0)
    assert cluster_speed([b"0.0", b"0.0"]) == UNKNOWN


def test_a_distrusted_peers_rising_speed_is_not_what_an_unknown_one_is_planned_at():
    """A distrusted peer idles for good and its reported speed keeps doubling: filled in
    from it, a peer past only its warm-up was given every microbatch for a step."""
    reported = {0: 10.0, 1: UNKNOWN, 2: 6.5e5, 3: 6.5e5}
    assert planning_speeds(reported, left_out={2, 3})[1] == 10.0
    assert planning_speeds(reported)[1] == 6.5e5  # the reason for left_out
