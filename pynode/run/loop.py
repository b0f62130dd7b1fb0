"""The one training loop: single runs, local groups, gloo clusters, rooms and the bridge.

Whatever started the run, each peer drives its trainer through this loop to the config's
last step. What differs between them is what happens around a step: a room's leader
broadcasts its control word first, a cluster shares the room's view with its ranks, the
command line draws a progress bar and writes checkpoints. Those are the hooks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from pynode.run.trainer import StepResult, Trainer

BeforeStep = Callable[[Trainer], Awaitable[None]]
OnStep = Callable[[StepResult], None]


async def train(
    trainer: Trainer, *, before_step: Sequence[BeforeStep] = (), on_step: Sequence[OnStep] = ()
) -> StepResult | None:
    """Run `trainer` from its state's step to `cfg.steps`; returns the last step's result
    (None if there was nothing left to train). Each step: every `before_step` hook in
    order, the step, then every `on_step` hook with its result."""
    last = None
    while trainer.state.step < trainer.cfg.steps:
        # A step alone awaits nothing that suspends: give the event loop its turn between
        # steps, so an interrupt (asyncio.run cancels this task on Ctrl-C) stops the run
        # at a step boundary, not after its last step.
        await asyncio.sleep(0)
        for hook in before_step:
            await hook(trainer)
        if trainer.state.step >= trainer.cfg.steps:  # a hook stopped the run here
            break
        last = await trainer.step()
        for report in on_step:
            report(last)
    return last
