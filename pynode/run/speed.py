"""A peer's measured microbatch time, and the speed it reports for planning the group's steps.

Every step each member publishes a speed (microbatches per second) with its state hash, and
the next step's microbatches are split in proportion (pynode.core.plan). A speed measured
badly once must not shut a peer out for the rest of the run, since a peer planned no
microbatch measures nothing again. Three rules keep it honest:

- The first microbatch a trainer computes is its warm-up (numba compiling on a fresh
  install, caches filling): it is shown until there is another, never reported. A peer
  with nothing past its warm-up reports UNKNOWN, which every peer plans as the median of
  the known speeds (`planning_speeds`).
- The estimate is the lower median of the last WINDOW microbatches: one slow microbatch (a
  core busy for a moment, a garbage collection) does not move the plan.
- A peer left without work for REMEASURE_STEPS steps in a row reports twice its speed,
  then twice that each further idle step, until a microbatch comes its way and measures it
  again (samples from before the pause are dropped). If it is still slow it idles again,
  and the next re-measure waits twice as long (up to MAX_PATIENCE steps) until it works two
  steps in a row: a peer that is slow for good costs the group one of its microbatches a
  handful of times a run, a peer slowed once gets its share back within steps.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Collection

WINDOW = 5  # microbatches whose lower median is the estimate
REMEASURE_STEPS = 8  # idle steps in a row after which the reported speed starts doubling
MAX_PATIENCE = 256  # the longest wait between re-measures of a peer that stays slow
MAX_DOUBLINGS = 16  # a distrusted peer idles for good: its speed stays finite
UNKNOWN = 0.0  # the speed of a peer with no measurement past its warm-up


class SpeedMeter:
    """One trainer's microbatch times, and the speed it reports."""

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=WINDOW)  # seconds a microbatch
        self.warmup: float | None = None  # the first microbatch's seconds
        self.idle = 0  # steps in a row without a microbatch of its own
        self.streak = 0  # steps in a row with one
        self.patience = REMEASURE_STEPS  # idle steps before the reported speed doubles
        self._worked = False  # a microbatch recorded since the last end_step

    def record(self, seconds: float, count: int = 1) -> None:
        """`count` microbatches took `seconds` in all (one sample, their mean)."""
        if count <= 0:
            return
        per = seconds / count
        if self.warmup is None:
            self.warmup, self._worked = per, True
            return
        if not self._worked and self.idle >= self.patience:  # a re-measure
            self.samples.clear()  # measured before the pause: stale
            self.patience = min(2 * self.patience, MAX_PATIENCE)
        self._worked = True
        self.samples.append(per)

    def seconds(self) -> float:
        """The estimated seconds of one microbatch (the warm-up's until there is more);
        0.0 before any."""
        if self.samples:
            return statistics.median_low(self.samples)
        return self.warmup or 0.0

    def end_step(self) -> None:
        """A step is over: count it idle if this peer computed nothing in it."""
        if self._worked:
            self.idle, self.streak = 0, self.streak + 1
            if self.streak >= 2:  # planned again, not only re-measured
                self.patience = REMEASURE_STEPS
        else:
            self.idle, self.streak = self.idle + 1, 0
        self._worked = False

    def speed(self) -> float:
        """Microbatches a second to plan on: UNKNOWN with nothing past the warm-up, doubled
        for every idle step from the `patience`-th on."""
        if not self.samples:
            return UNKNOWN
        doublings = min(max(0, self.idle - self.patience + 1), MAX_DOUBLINGS)
        return 2.0 ** doublings / max(statistics.median_low(self.samples), 1e-6)


def is_known(speed: float) -> bool:
    """A speed to plan on: positive and finite (not UNKNOWN, nan or inf)."""
    return 0 < speed < float("inf")


def planning_speeds(reported: dict[int, float], left_out: Collection[int] = ()) -> dict[int, float]:
    """rank -> speed to plan on: each UNKNOWN (or unreadable) speed becomes the lower median
    of the known ones of ranks not `left_out` (the distrusted, idle for good: their speed
    only rises), 1.0 when none is known. Every peer gets the same reported speeds and holds
    the same distrusted ranks after the agreement round, so every peer plans alike."""
    known = [s for r, s in reported.items() if r not in left_out and is_known(s)]
    fill = statistics.median_low(known) if known else 1.0
    return {r: (s if is_known(s) else fill) for r, s in reported.items()}
