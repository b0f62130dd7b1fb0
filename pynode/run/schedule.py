"""Changes to a run at a step boundary: a new learning rate, a new total of steps, a stop.

A change made after step S applies from step S + 1 on every peer: from there the run is the
run of the changed config, exactly as `train --resume CKPT --lr X --steps N` at step S
(the learning-rate schedule follows the new peak and length). A stop is a new total equal
to the step reached. The trainer records every applied change: in the next step's --log
row (`change`) and in its checkpoints (`config["schedule"]`), and `train --schedule FILE`
replays a list of them, so a room's run with changes made live is reproducible from the
command line, bit for bit.

FILE is JSON: a list of {"step": S, "lr": X, "steps": N} (lr and steps each optional).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pynode.config import ConfigError, RunConfig, check_run_length

FIELDS = ("lr", "steps")


class ScheduleError(ConfigError):
    """A change that cannot apply (named field, reason), or a schedule file that does not read."""


@dataclass(frozen=True)
class Change:
    step: int                  # applies after this many steps, before the next
    lr: float | None = None    # the new peak learning rate
    steps: int | None = None   # the new total; equal to `step`: the run stops there

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("step", self.step), ("lr", self.lr), ("steps", self.steps))
                if v is not None}

    def apply(self, cfg: RunConfig) -> RunConfig:
        """`cfg` changed; ScheduleError if the result is not a config a run can continue."""
        values = {k: getattr(self, k) for k in FIELDS if getattr(self, k) is not None}
        try:
            return cfg.with_(**values)
        except ConfigError as exc:
            raise ScheduleError(f"change at step {self.step}: {exc}") from None


def is_stop(change: dict[str, Any]) -> bool:
    """Whether a change (its JSON form, with its step) is a Stop: the run's total set to the
    step it applies at, so the run ends there (the page's Stop, `steer({stop: true})`)."""
    return change.get("steps") is not None and change.get("steps") == change.get("step")


def change_from_dict(data: Any) -> Change:
    """A Change from its JSON form; ScheduleError naming what is wrong."""
    if not isinstance(data, dict) or "step" not in data:
        raise ScheduleError(f"a change is {{\"step\": S, \"lr\": X, \"steps\": N}}, got {data!r}")
    unknown = sorted(set(data) - {"step", *FIELDS})
    if unknown:
        raise ScheduleError(f"a change may set only lr and steps, not {', '.join(unknown)}")
    step, lr, steps = data["step"], data.get("lr"), data.get("steps")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ScheduleError(f"change step must be an integer >= 0, got {step!r}")
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float))
                           or not 0 < lr < 1):
        raise ScheduleError(f"change at step {step}: lr must be in (0, 1), got {lr!r}")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                              or steps < step):
        raise ScheduleError(f"change at step {step}: steps must be an integer >= {step} "
                            f"(the step reached; equal: stop there), got {steps!r}")
    try:
        check_run_length({"steps": steps})
    except ConfigError as exc:
        raise ScheduleError(f"change at step {step}: {exc}") from None
    if lr is None and steps is None:
        raise ScheduleError(f"change at step {step} changes nothing (give lr or steps)")
    return Change(step, None if lr is None else float(lr), steps)


def read_schedule(path: str) -> list[Change]:
    """The changes of a --schedule FILE, in step order (one step at most once)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:  # not "[Errno 2] No such file or directory: 'x.json'"
        raise ScheduleError(f"--schedule {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ScheduleError(f"--schedule {path}: {exc}") from None
    if not isinstance(data, list):
        raise ScheduleError(f"--schedule {path}: a JSON list of changes, got {type(data).__name__}")
    try:
        changes = [change_from_dict(item) for item in data]
    except ScheduleError as exc:
        raise ScheduleError(f"--schedule {path}: {exc}") from None
    steps = [c.step for c in changes]
    if steps != sorted(set(steps)):
        raise ScheduleError(f"--schedule {path}: changes must be in step order, one per step; "
                            f"got steps {steps}")
    return changes


def check_reached(changes: list[Change], steps: int, start: int = 0) -> None:
    """ScheduleError for a change a run of `steps` steps (as the changes before it leave
    it) from step `start` (a resume's) never reaches: a change applies after its step,
    before the next, so one at or past the run's last step would be dropped without a
    word, and one before `start` was found only at the first step (replay), after the
    start-up checks."""
    before = [c.step for c in changes if c.step < start]
    if before:
        raise ScheduleError(f"the run resumes at step {start}, after its changes at steps "
                            f"{before}: leave those out")
    for change in changes:
        if change.step >= steps:
            raise ScheduleError(f"change at step {change.step} is never reached: the run ends "
                                f"at step {steps}")
        steps = change.steps if change.steps is not None else steps


def replay(changes: list[Change]):
    """A loop hook (before_step) applying each change when the trainer reaches its step."""
    pending = list(changes)

    async def before_step(trainer) -> None:
        while pending and pending[0].step <= trainer.state.step:
            change = pending.pop(0)
            if change.step < trainer.state.step:
                raise ScheduleError(f"change at step {change.step}: the run is at step "
                                    f"{trainer.state.step} already (resumed past it)")
            trainer.apply_change(change)

    return before_step
