"""Where a trainer's steps go: each phase's time, and each step's whole time with what its
cross-check asked of it. A run's --summary carries both for every rank; `bench scaling`
reads them.

PHASES, in a step's order: compute its microbatches, reduce them with the group (waiting
for the slowest included), verify the cross-check sample, update (AdamW), hash the state,
probe the kernels, the held-out loss when one is due, agree on (hash, probe) with the
group (waiting included).
"""

from __future__ import annotations

from collections import deque
from typing import Any

PHASES = ("compute", "reduce", "verify", "update", "hash", "probe", "eval", "agreement")
# The timed steps a clock keeps one by one: a long run keeps its newest.
STEPS_KEPT = 4096


class StepClock:
    """The times of one trainer's steps, all but its first (which pays for start-up)."""

    def __init__(self) -> None:
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)  # summed over the timed steps
        self.timed_steps = 0
        # (step, ms, whether it had a check round, the share of steps with one under its
        # plan: crosscheck.picked_share in a group, 0 alone), the newest STEPS_KEPT
        self.steps: deque[tuple[int, float, bool, float]] = deque(maxlen=STEPS_KEPT)
        self._seen = 0

    def record(self, marks: list[float], step: int, checked: bool, share: float) -> None:
        """Step `step` (marks: its start and each phase's end, PHASES in order), unless it
        is the first this clock sees."""
        self._seen += 1
        if self._seen == 1:
            return
        for phase, begun, ended in zip(PHASES, marks[:-1], marks[1:], strict=True):
            self.phase_seconds[phase] += ended - begun
        self.timed_steps += 1
        self.steps.append((step, 1000 * (marks[-1] - marks[0]), checked, share))

    def phase_ms_per_step(self) -> dict[str, float]:
        """Milliseconds per step in each phase over the timed steps ({} if none)."""
        if not self.timed_steps:
            return {}
        return {p: 1000 * s / self.timed_steps for p, s in self.phase_seconds.items()}

    def timings(self) -> dict[str, Any]:
        """phase_ms_per_step, and step_ms: each kept step as [step, ms, whether it had a
        check round, the share of steps with one under its plan]."""
        return {"phase_ms_per_step": self.phase_ms_per_step(),
                "step_ms": [list(row) for row in self.steps]}
