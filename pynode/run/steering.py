"""A room leader's steering between steps: the control word every member hears.

RoomPeer (pynode.run.protocol) takes these methods from `Steering`. Before each step the
leader broadcasts one word: the joiners it admits, a change of lr or steps from this step
on (pynode.run.schedule), and whether the run pauses; every member applies it alike, so
the run stays one run. `steer` is how the leader's page or command line asks for one.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from pynode.config import ConfigError
from pynode.run.errors import RoomError
from pynode.run.schedule import change_from_dict, is_stop

if TYPE_CHECKING:
    from pynode.run.room import Reporter, Run

PAUSE_TICK_S = 1.0  # a paused leader repeats its control word this often (others wait on it)


class Steering:
    """RoomPeer's control word. Uses RoomPeer's id, run, report, admit_joiners and
    send_sync; keeps the leader's pending change (`requested`), `paused` and `stopping`."""

    id: str
    run: Run | None
    report: Reporter
    requested: dict[str, Any] | None
    paused: bool
    stopping: bool

    async def control(self, run: Run) -> None:
        """The leader's control word before each step, on every member alike: joiners to
        admit, a change to apply from this step on, and a pause: while paused the leader
        repeats the word every PAUSE_TICK_S and everyone waits here, between two steps."""
        leader = run.leader == self.id
        shown_pause = False
        while True:
            blob = self.control_word(run) if leader else None
            ctl = json.loads(await run.coll.broadcast_bytes(blob, timeout=run.trainer.deadline()))
            run.hear(run.trainer.state.step, ctl)
            if ctl.get("change"):
                run.trainer.apply_change(change_from_dict(ctl["change"]))
                run.cfg = run.trainer.cfg
                self.report("control", {"step": run.trainer.state.step,
                                        "paused": bool(ctl.get("pause")),
                                        "change": ctl["change"]})
            # after the change: a joiner skips this word, its sync carries the changed run
            for peer in ctl.get("admit", []):
                if leader:
                    self.send_sync(run, peer)
                self.report("event", {"level": "info", "text": f"peer {peer} joined the run "
                                                               f"at step {run.trainer.state.step}"})
            if not ctl.get("pause"):
                if shown_pause:
                    self.report("control", {"step": run.trainer.state.step, "paused": False})
                return
            if not shown_pause:
                shown_pause = True
                self.report("control", {"step": run.trainer.state.step, "paused": True})
            if leader:
                await asyncio.sleep(PAUSE_TICK_S)

    def control_word(self, run: Run) -> bytes:
        """The leader's word for this step boundary (its change checked against the step
        reached: one that no longer fits is dropped with the reason, never half applied)."""
        change, self.requested = self.requested, None
        if self.stopping:  # the run ends at the step it reached: its new total
            change, self.stopping, self.paused = {"steps": run.trainer.state.step}, False, False
        if change is not None:
            try:
                change_from_dict({**change, "step": run.trainer.state.step}).apply(run.cfg)
                change = {**change, "step": run.trainer.state.step}
            except ConfigError as exc:
                self.report("event", {"level": "error", "text": f"change not applied: {exc}"})
                change = None
        ending = change is not None and is_stop(change)
        if ending:
            self.paused = False  # the run ends here, as on Stop: a pause would hold it open
        # nobody joins a run at the word that ends it (its sync would hold the Stop already:
        # that page said "Finished" where the others said "Stopped"); a joiner waiting then
        # is told the run is gone, as at any run's end
        admitted = [] if self.paused or ending else self.admit_joiners(run)
        return json.dumps({"admit": admitted, "change": change, "pause": self.paused}).encode()

    def steer(self, lr: float | None = None, steps: int | None = None,
              pause: bool | None = None, stop: bool = False) -> dict[str, Any]:
        """The leader asks for a change at the next step boundary (lr, steps), a pause or
        resume, or a stop (the run ends at the step it reached: steps becomes that step).
        Checked now (ConfigError, nothing changed); returns what is pending."""
        for name, value in (("pause", pause), ("stop", stop)):
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"{name} must be true or false, got {value!r}")
        run = self.run
        if run is None or run.leader != self.id:
            raise RoomError("only the leader of a running run can steer it")
        if lr is not None or steps is not None:
            change = {k: v for k, v in (("lr", lr), ("steps", steps)) if v is not None}
            change_from_dict({**change, "step": run.trainer.state.step}).apply(run.cfg)
            self.requested = {**(self.requested or {}), **change}
        if pause is not None:
            self.paused = bool(pause)
        if stop:
            if run.trainer.state.step < 1:
                raise RoomError("the run has no step yet to stop at")
            self.stopping = True
        return {"requested": self.requested, "paused": self.paused, "stopping": self.stopping,
                "step": run.trainer.state.step}
