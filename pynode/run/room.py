"""A room peer's run, and what a RoomPeer is given: the pieces its parts share.

RoomPeer (pynode.run.protocol) is made of its own methods and two parts of its own,
pynode.run.takeover (failover) and pynode.run.steering (the control word); all three
work on the `Run` this peer is in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pynode.comm import webrtc
from pynode.config import RunConfig
from pynode.core import checkpoint
from pynode.run import failover
from pynode.run.failover import Agreed
from pynode.run.trainer import Trainer

# make_trainer(cfg, collective, resume checkpoint or None) -> Trainer
TrainerFactory = Callable[[RunConfig, Any, "checkpoint.CheckpointState | None"], Trainer]
# report(kind, fields): "run", "step", "done", "failed", "event" (see RoomPeer)
Reporter = Callable[[str, dict], None]
# The points of a run's loss curve a peer keeps for those synced in later (~25 bytes each
# in a sync message, beside a state of ~1.5 MB at the default model)
CURVE_KEPT = 10_000


def thinned(points: list[list], most: int) -> list[list]:
    """`points` with every other one of the past dropped once there are more than `most`,
    the newest kept: a whole run's curve in bounded room, its first steps included (as the
    dashboard's server keeps its curves, server/runs.py)."""
    return points[:-1:2] + points[-1:] if len(points) > most else points


def read_curve(value: Any) -> list[list]:
    """A sync's curve as sent ([step, loss, held-out loss or None] with rising steps); what
    is not is left out (a chart's points, not the run's state: never a reason to refuse)."""
    curve: list[list] = []
    for entry in value if isinstance(value, list) else []:
        if not (isinstance(entry, list) and len(entry) == 3):
            return []
        step, loss, heldout = entry
        numbers = [loss] + ([] if heldout is None else [heldout])
        if (isinstance(step, bool) or not isinstance(step, int)
                or any(isinstance(x, bool) or not isinstance(x, int | float) for x in numbers)
                or (curve and step <= curve[-1][0])):
            return []
        curve.append([step, float(loss), None if heldout is None else float(heldout)])
    return thinned(curve, CURVE_KEPT)


@dataclass
class Run:
    """The run this peer is in: its id, leader, config, trainer and group (`coll`), and
    what a failover needs (the agreed boundaries and the control words since)."""

    id: str
    leader: str
    cfg: RunConfig
    trainer: Trainer
    coll: webrtc.MeshCollective
    joins: dict[str, set[str]] = field(default_factory=dict)  # leader: joiner -> peers it reaches
    agreed: list[Agreed] = field(default_factory=list)  # the last failover.KEEP boundaries
    words: list[list] = field(default_factory=list)  # [boundary, change, pause] received since
    # [step, loss, held-out loss or None] of the run's steps, thinned to CURVE_KEPT: a peer
    # synced in later draws the run's loss from its start, not from the step it joined at
    curve: list[list] = field(default_factory=list)

    def record(self, step: int, loss: float, heldout: float | None) -> None:
        """A step of the run, for the curve a later joiner is sent."""
        self.curve.append([step, loss, heldout])
        self.curve = thinned(self.curve, CURVE_KEPT)

    def hear(self, step: int, ctl: dict[str, Any]) -> None:
        """A control word at boundary `step`, for a failover (a pause's repeats once)."""
        word = [step, ctl.get("change"), bool(ctl.get("pause"))]
        if word[1] is not None or not self.words or self.words[-1][0::2] != word[0::2]:
            self.words.append(word)

    def keep(self) -> None:
        """The trainer's state is one every member agreed on: keep it for a failover."""
        t = self.trainer
        self.agreed = [*self.agreed, Agreed(t.state.step, t.state, t.cfg, list(t.schedule))]
        self.agreed = self.agreed[-failover.KEEP:]
        self.words = [w for w in self.words if w[0] >= self.agreed[0].step]
