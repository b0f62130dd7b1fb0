"""Native runs that report their status to this server (`--dashboard URL`): the logic, no I/O.

A run registers once and gets an id and a token (a secret only its ranks know); each rank
then reports a small status record: step, loss, speed, resources, traffic. Never weights or
gradients: a report is a flat record of named scalars (RANK_FIELDS), checked field by field,
and anything else is refused by name. The board keeps the loss curve of each run (rank 0's
points) and forgets the runs nobody has reported for a while, the oldest first when full.

The board lives in memory, but a token does not need it: it is an HMAC of the run id under
a key derived from the server's persisted secret. A server that restarted (and forgot its
runs) still knows a token it issued, so a run that registers again with its id and token
gets its card back under the same id; a server started with another secret refuses them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pynode.core.errors import DaisyError

# What a rank may report: name -> the types its value may have. None is allowed for all.
NUMBER = (int, float)
RANK_FIELDS: dict[str, tuple[type, ...]] = {
    "state": (str,),               # waiting | training | finished | stopped
    "reason": (str,),              # why it stopped (an error line), or ""
    "step": (int,), "steps": (int,),
    "loss": NUMBER, "heldout": NUMBER,
    "hash": (str,),                # state hash prefix after `step`
    "runtime": (str,),             # native | browser
    "device": (str,), "backend": (str,),
    "cores": (int,), "ram": (int,),  # usable cores, available bytes
    "microbatch_seconds": NUMBER,  # measured time of one microbatch
    "share": NUMBER,               # this rank's fraction of the step's microbatches
    "tokens_per_s": NUMBER,
    "bytes_sent": (int,), "bytes_received": (int,),
}
RUN_FIELDS: dict[str, tuple[type, ...]] = {"name": (str,), "command": (str,), "world": (int,)}
STATES = ("waiting", "training", "finished", "stopped")  # waiting: a room peer, no run yet
MAX_TEXT = 200            # characters of any string field
MAX_POINTS = 4096         # loss points kept per run (every other one dropped when full)
MAX_POINTS_PER_REPORT = 512
MAX_RANKS = 1024


class RunReportError(DaisyError, ValueError):
    """A status report or registration the board refuses (named field, reason)."""


class UnknownRunError(DaisyError, LookupError):
    """No run with this id (never registered, or forgotten), or not this token."""


class BadTokenError(DaisyError, PermissionError):
    """A registration again whose token is not its run id's under this server's secret."""


@dataclass
class Run:
    run_id: str
    name: str
    command: str
    world: int
    created: float
    updated: float
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    points: list[tuple[int, float, float | None]] = field(default_factory=list)  # (step, loss,
    #                                                            held-out or None), rank 0's

    def view(self, now: float) -> dict[str, Any]:
        """What /api/runs shows (a run holds no token: the board computes it)."""
        return {"run": self.run_id, "name": self.name, "command": self.command,
                "world": self.world, "age_s": round(now - self.created, 1),
                "idle_s": round(now - self.updated, 1),
                "ranks": [{"rank": r, **status} for r, status in sorted(self.ranks.items())],
                "points": [list(p) for p in self.points]}


def check_value(name: str, value: Any, kinds: tuple[type, ...]) -> Any:
    """`value` if it fits field `name`; RunReportError naming the field otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise RunReportError(f"field {name!r} must be {' or '.join(k.__name__ for k in kinds)}, "
                             f"got {type(value).__name__}")
    if isinstance(value, str) and len(value) > MAX_TEXT:
        raise RunReportError(f"field {name!r} is longer than {MAX_TEXT} characters")
    if isinstance(value, float) and not math.isfinite(value):
        raise RunReportError(f"field {name!r} must be finite, got {value}")
    if isinstance(value, int) and value < 0:
        raise RunReportError(f"field {name!r} must be >= 0, got {value}")
    return value


def check_fields(record: Any, allowed: dict[str, tuple[type, ...]]) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise RunReportError("a report is a JSON object")
    unknown = sorted(set(record) - set(allowed))
    if unknown:
        raise RunReportError(f"unknown fields: {', '.join(map(str, unknown))} (a report holds "
                             "status only: " + ", ".join(allowed) + ")")
    return {k: check_value(k, v, allowed[k]) for k, v in record.items()}


def check_points(points: Any) -> list[tuple[int, float, float | None]]:
    """[[step, loss, held-out or null], ...] of a report."""
    if not isinstance(points, list) or len(points) > MAX_POINTS_PER_REPORT:
        raise RunReportError(f"points must be a list of at most {MAX_POINTS_PER_REPORT} "
                             "[step, loss, heldout] entries")
    out = []
    for point in points:
        if not isinstance(point, list) or len(point) != 3:
            raise RunReportError("each point is [step, loss, heldout or null]")
        step = check_value("step", point[0], (int,))
        loss = check_value("loss", point[1], NUMBER)
        if step is None or loss is None:
            raise RunReportError("a point needs a step and a loss")
        out.append((step, float(loss), None if point[2] is None
                    else float(check_value("heldout", point[2], NUMBER))))
    return out


def check_run(record: Any, now: float, run_id: str) -> Run:
    """A run of `record` ({name, command, world}) with no reports yet."""
    info = check_fields(record, RUN_FIELDS)
    world = 1 if info.get("world") is None else info["world"]
    if not 1 <= world <= MAX_RANKS:
        raise RunReportError(f"field 'world' must be in 1..{MAX_RANKS}, got {world}")
    return Run(run_id=run_id, name=info.get("name") or "", command=info.get("command") or "",
               world=world, created=now, updated=now)


class RunBoard:
    """The runs this server knows (thread-safe).

    `secret`: the server's persisted secret (server.tokens.load_secret). A run's token is an
    HMAC of its id under a key derived from it with a label of its own, so that no other
    token the server signs with that secret passes for a run's, nor the reverse.
    """

    def __init__(self, max_runs: int, idle_s: float, *, secret: bytes,
                 clock: Callable[[], float] = time.time) -> None:
        self.max_runs, self.idle_s, self.clock = max_runs, idle_s, clock
        self._key = hmac.new(secret, b"dashboard-run:", hashlib.sha256).digest()
        self._runs: dict[str, Run] = {}
        self._lock = threading.Lock()

    def token_for(self, run_id: str) -> str:
        """Run `run_id`'s token: HMAC-SHA256 of the id, base64url without padding."""
        mac = hmac.new(self._key, run_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")

    def _verifies(self, run_id: str, token: str) -> bool:
        # ASCII only: compare_digest refuses other text, and no id or token of ours has any
        return run_id.isascii() and token.isascii() and \
            hmac.compare_digest(self.token_for(run_id), token)

    def register(self, record: Any) -> tuple[str, str]:
        """A new run of `record` ({name, command, world}); returns (run id, token)."""
        run = check_run(record, self.clock(), secrets.token_hex(8))
        with self._lock:
            self._forget_idle(run.created)
            self._add(run)
        return run.run_id, self.token_for(run.run_id)

    def register_again(self, record: Any) -> bool:
        """Run `record["run"]` again: its server restarted (or forgot it) while it trained on.

        `record` is {run, token, name, command, world}. True: the board did not have the run
        and holds it again, under that id, of name, command and world from `record`, with
        no ranks or points until reports bring them. False: the board has it and it stays
        as it is. BadTokenError if `token` is not that id's token here (issued by a server
        with another secret, or none), RunReportError for a bad field; either changes nothing.
        """
        if not isinstance(record, dict):
            raise RunReportError("a registration is a JSON object")
        record = dict(record)
        run_id = check_value("run", record.pop("run", None), (str,))
        token = check_value("token", record.pop("token", None), (str,))
        if run_id is None or token is None:
            raise RunReportError("registering a run again takes both its 'run' id and its "
                                 "'token', as POST /api/runs issued them")
        run = check_run(record, self.clock(), run_id)
        if not self._verifies(run_id, token):
            raise BadTokenError(f"run {run_id!r}: not its token on this server (a token "
                                "issued under another secret, or no token at all)")
        with self._lock:
            self._forget_idle(run.created)
            if run_id in self._runs:
                return False
            self._add(run)
        return True

    def _add(self, run: Run) -> None:
        if len(self._runs) >= self.max_runs:
            oldest = min(self._runs.values(), key=lambda r: r.updated)
            del self._runs[oldest.run_id]
        self._runs[run.run_id] = run

    def report(self, run_id: str, token: str, record: Any) -> int | None:
        """Rank `record["rank"]`'s status (and, from rank 0, its loss points). Returns the
        step of the run's first point here (None: none yet), so that rank 0 sees when the
        server lacks the start of its curve (another rank brought the run back after a
        restart, before rank 0's history came) and sends it again."""
        if not isinstance(record, dict):
            raise RunReportError("a report is a JSON object")
        record = dict(record)
        rank = check_value("rank", record.pop("rank", None), (int,))
        points = check_points(record.pop("points", []))
        status = check_fields(record, RANK_FIELDS)
        if status.get("state") not in (None, *STATES):
            raise RunReportError(f"field 'state' must be one of {', '.join(STATES)}")
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or not self._verifies(run_id, token):
                raise UnknownRunError(f"no run {run_id!r} with this token on this server")
            if rank is None or rank >= run.world:
                raise RunReportError(f"field 'rank' must be in 0..{run.world - 1}, got {rank}")
            run.updated = self.clock()
            run.ranks.setdefault(rank, {}).update(status)
            run.ranks[rank]["seen_s"] = run.updated
            if rank == 0:
                self._add_points(run, points)
            return run.points[0][0] if run.points else None

    @staticmethod
    def _add_points(run: Run, points: list[tuple[int, float, float | None]]) -> None:
        """New steps after the last; older ones (a history sent again) merge in by step."""
        steps = [run.points[-1][0] if run.points else -1] + [p[0] for p in points]
        if all(a < b for a, b in zip(steps[:-1], steps[1:], strict=True)):  # newer steps
            run.points.extend(points)
        else:
            by_step = {p[0]: p for p in run.points}
            by_step.update((p[0], p) for p in points)
            run.points = [by_step[s] for s in sorted(by_step)]
        while len(run.points) > MAX_POINTS:  # thin the past, keep the newest point
            run.points = run.points[:-1:2] + run.points[-1:]

    def views(self) -> list[dict[str, Any]]:
        """Every run, newest first, as /api/runs shows them."""
        now = self.clock()
        with self._lock:
            self._forget_idle(now)
            runs = sorted(self._runs.values(), key=lambda r: r.created, reverse=True)
            views = [r.view(now) for r in runs]
        for view in views:
            for rank in view["ranks"]:
                rank["seen_s"] = round(now - rank["seen_s"], 1)
        return views

    def _forget_idle(self, now: float) -> None:
        for run_id in [k for k, r in self._runs.items() if now - r.updated > self.idle_s]:
            del self._runs[run_id]
