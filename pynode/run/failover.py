"""Leader failover in a room: who leads next, and from which step (decisions only, no I/O).

Every member of a room's run keeps the last two step boundaries the whole group agreed on
(`Agreed`: each state hash was compared by every member after the step) and the leader's
control words it received since. When the leader vanishes, each survivor sends what it
holds to the next member in rank order that it still reaches (`next_leader`); that peer
picks the boundary most survivors hold with its own hash (`plan_takeover`), normally the
last one all of them committed. Everyone rewinds to it and the run goes on from there under
the new leader, with the leader's steering (changes, pause) of that boundary carried over.
The step under way when the leader died is computed again: integer sums make it the same
bits whoever computes it, so the run ends on the hashes of an uninterrupted one.

Why two boundaries suffice: a survivor passes boundary s + 1 only after the leader's result
of step s + 1's hash check, and the next step cannot start without the leader; so when the
leader dies, every survivor has agreed on s or s + 1, and one at s + 1 still holds s.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from pynode.config import RunConfig
from pynode.run.trainer import TrainState

KEEP = 2  # agreed boundaries each member keeps


@dataclass
class Agreed:
    """A step boundary every member agreed on: the state there, and the config and schedule
    it was computed under (before the changes of this boundary's control word)."""

    step: int
    state: TrainState
    cfg: RunConfig
    schedule: list[dict]
    _hash: str | None = field(default=None, repr=False)

    @property
    def hash(self) -> str:
        if self._hash is None:  # computed only when a failover needs it
            self._hash = self.state.hash()
        return self._hash


@dataclass(frozen=True)
class Takeover:
    """The new leader's decision: the run continues from `step` (state `hash`) with
    `ranks` (the new leader first, then the others in their old rank order)."""

    step: int
    hash: str
    ranks: list[str]
    left_out: list[str]         # reported, but do not hold `step` with `hash`: they re-join
    change: dict | None         # the changes of boundary `step`, merged (no "step" key)
    pause: bool                 # the run was paused at boundary `step`


def next_leader(order: Sequence[str], me: str, reachable: Collection[str],
                tried: Collection[str] = ()) -> str:
    """The first member of `order` (surviving members in rank order, `me` among them) that
    `me` still reaches and has not `tried` in vain; `me` at the latest."""
    for peer in order:
        if peer == me or (peer in reachable and peer not in tried):
            return peer
    return me


def report_of(agreed: Sequence[Agreed], words: Sequence[list]) -> dict[str, Any]:
    """What a survivor tells the next leader: the hash of each boundary it holds, and the
    control words ([boundary, change or None, pause]) it received since the oldest."""
    return {"held": {str(a.step): a.hash for a in agreed}, "words": [list(w) for w in words]}


def plan_takeover(me: str, mine: dict[str, Any], reports: dict[str, dict[str, Any]],
                  order: Sequence[str]) -> Takeover:
    """The takeover of `me` with its own report `mine` and the survivors' `reports` (as
    `report_of` makes them; JSON may have turned the steps into strings). `order`: the
    surviving members in rank order. The boundary held by most (the later on a tie), among
    the ones `me` holds; the changes and pause of that boundary from the longest sequence of
    its control words any included survivor saw (they are prefixes of one sequence)."""
    everyone = {me: mine, **{p: r for p, r in reports.items() if p != me}}
    held = {peer: {int(s): h for s, h in report["held"].items()}
            for peer, report in everyone.items()}
    own = held[me]

    def holders(step: int) -> list[str]:
        return [p for p in everyone if held[p].get(step) == own[step]]

    step = max(own, key=lambda s: (len(holders(s)), s))
    included = set(holders(step))
    ranks = [me, *(p for p in order if p in included and p != me),
             *sorted(included - set(order) - {me})]
    seen = [[w for w in everyone[p]["words"] if int(w[0]) == step] for p in ranks]
    words = max(seen, key=len)
    change: dict[str, Any] = {}
    for _, step_change, _ in words:
        change.update({k: v for k, v in (step_change or {}).items() if k != "step"})
    return Takeover(step=step, hash=own[step], ranks=ranks,
                    left_out=sorted(set(everyone) - included),
                    change=change or None, pause=bool(words and words[-1][2]))


def remap(by_rank: dict[int, Any], old: Sequence[str], new: Sequence[str]) -> dict[int, Any]:
    """Per-rank values (capacities) of the old ranks `old`, keyed by the new ranks `new`."""
    return {new.index(old[r]): v for r, v in by_rank.items()
            if 0 <= r < len(old) and old[r] in new}
