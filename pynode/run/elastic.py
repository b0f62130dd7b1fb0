"""A gloo cluster that torchrun's elastic agent restarts: the checkpoint a restarted group
resumes from, and what the group says about the attempt before it.

Every rank offers the newest checkpoint it holds (its own --save file; rank 0 also its
--resume). Rank 0 keeps the offers of its run (same config, step before the end), takes the
newest step, and asks the lowest rank holding it to send it. Ranks offering that step must
hold the same state hash, or nobody resumes. The run's bits do not depend on the number of
ranks (DESIGN section 1), so the group may be smaller or larger than the one that saved it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

from pynode.comm.base import Collective
from pynode.config import RunConfig
from pynode.core.errors import DaisyError

AGREE_TIMEOUT_S = 120.0


class ResumeDisagreement(DaisyError):
    """Ranks hold different states for the same step: no checkpoint is safe to resume."""


@dataclass(frozen=True)
class Offer:
    step: int           # optimizer steps done in the checkpoint
    state_hash: str     # its state hash
    config: str         # config_digest of the run it belongs to

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes | None) -> Offer | None:
        return cls(**json.loads(data)) if data else None


def config_digest(config: dict) -> str:
    """Which run a checkpoint's config describes (its vocab and live schedule left out)."""
    kept = {k: v for k, v in config.items() if k not in ("vocab", "schedule")}
    return hashlib.sha256(RunConfig.from_dict(kept).to_json().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Resume:
    step: int                  # 0: a fresh start
    holders: tuple[int, ...]   # ranks that held the agreed checkpoint
    data: bytes | None         # the checkpoint (rank 0 only; None for a fresh start)
    ignored: tuple[int, ...]   # ranks whose checkpoint belongs to another run or is finished


def choose(offers: list[Offer | None], run: RunConfig) -> dict:
    """Rank 0's decision over every rank's offer: {"root", "step", "hash", "holders",
    "ignored"} (root None for a fresh start); ResumeDisagreement if holders of the newest
    step differ."""
    digest = config_digest(json.loads(run.to_json()))
    fits = {r: o for r, o in enumerate(offers)
            if o is not None and o.config == digest and o.step < run.steps}
    ignored = sorted(r for r, o in enumerate(offers) if o is not None and r not in fits)
    if not fits:
        return {"root": None, "step": 0, "hash": "", "holders": [], "ignored": ignored}
    step = max(o.step for o in fits.values())
    holders = sorted(r for r, o in fits.items() if o.step == step)
    hashes = {fits[r].state_hash for r in holders}
    if len(hashes) > 1:
        said = ", ".join(f"rank {r}: {fits[r].state_hash[:16]}" for r in holders)
        raise ResumeDisagreement(f"the ranks' checkpoints of step {step} differ ({said}); "
                                 "resume one of them by hand with --resume")
    return {"root": holders[0], "step": step, "hash": hashes.pop(), "holders": holders,
            "ignored": ignored}


async def agree_on_resume(collective: Collective, offer: Offer | None, held: bytes | None,
                          run: RunConfig | None) -> Resume:
    """The checkpoint the group resumes from. `offer` describes `held`, this rank's newest
    checkpoint (None: none); `run` is rank 0's run config (ignored elsewhere)."""
    t = AGREE_TIMEOUT_S
    offers = await collective.allgather_bytes(offer.to_bytes() if offer else b"", timeout=t)
    decision: bytes | None = None
    if collective.rank == 0:
        try:
            decision = json.dumps(choose([Offer.from_bytes(o) for o in offers], run)).encode()
        except ResumeDisagreement as exc:
            decision = json.dumps({"error": str(exc)}).encode()
    said = json.loads(await collective.broadcast_bytes(decision, root=0, timeout=t))
    if "error" in said:
        raise ResumeDisagreement(said["error"])
    if said["root"] is None:
        return Resume(0, (), None, tuple(said["ignored"]))
    root = said["root"]
    data = await collective.broadcast_bytes(held if collective.rank == root else None,
                                            root=root, timeout=t)
    return Resume(said["step"], tuple(said["holders"]), data, tuple(said["ignored"]))


def describe_previous(world: int, farewells: dict[int, str], progress: dict[int, str],
                      ) -> tuple[str, float | None]:
    """The line saying how the previous attempt ended, and when its first survivor was
    stopped (epoch seconds; None if nobody said goodbye). Notes: farewell "TIME REASON",
    progress "STEP TIME"; a rank that left no farewell was lost."""
    lost = [r for r in range(world) if r not in farewells]
    stopped = [float(v.split(" ", 1)[0]) for v in farewells.values()]
    stopped_at = min(stopped) if stopped else None
    parts = []
    for r in lost:
        step, _, when = progress.get(r, "0 ").partition(" ")
        seen = f", its last step {step} ended at {clock(float(when))}" if when else \
            ", before its first step"
        parts.append(f"rank {r} of {world} was lost{seen}")
    if not lost:
        parts.append(f"all {world} ranks stopped in good order (none lost)")
    if stopped_at is not None:
        parts.append(f"the first survivor stopped at {clock(stopped_at)}")
    return "; ".join(parts), stopped_at


def clock(epoch_s: float) -> str:
    """HH:MM:SS.s of an epoch time, local time (the logs' clock)."""
    return time.strftime("%H:%M:%S", time.localtime(epoch_s)) + f".{int(epoch_s * 10) % 10}"
