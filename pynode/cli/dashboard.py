"""`--dashboard URL`: a native run reports its status to a DaisyChain server's /dashboard.

Rank 0 registers the run (POST /api/runs) and gets its id and a token only the run's
ranks learn (through the group: `share_run`); then every rank posts its own status, at
most once a second and once more at the end, from a background thread, so a slow or
vanished server never holds a step up (a failed report is said once, and training goes on).
A status is step, loss, speed, resources and traffic: never weights or gradients
(server/runs.py refuses any other field).

A server that restarted has forgotten the run (404 unknown_run); the rank whose report
meets that registers it again with the same id and token (which the server can still check
if it kept its secret) and sends the report again; rank 0 also sends its loss points again,
so that the card comes back with its whole curve.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from pynode import platform
from pynode.core.errors import DaisyError
from pynode.run.room import thinned as thin_curve
from pynode.run.trainer import StepResult, Trainer

log = logging.getLogger("pynode.dashboard")

REPORT_EVERY_S = 1.0
HTTP_TIMEOUT_S = 5.0
MAX_NAME = 200  # characters of a run's name (the server's MAX_TEXT)
MAX_POINTS = 4096  # loss points the server keeps of a run (server/runs.py MAX_POINTS)
MAX_POINTS_PER_REPORT = 512  # the server's MAX_POINTS_PER_REPORT
SHARE_TIMEOUT_S = 120.0


class DashboardError(DaisyError):
    """The --dashboard server did not register the run (its answer is in the message)."""


@dataclass(frozen=True)
class DashboardRun:
    url: str    # the server, http://HOST:PORT
    run: str    # the id the server gave the run
    token: str  # the run's secret: reports carry it
    # What it was registered as, to register it again on a server that restarted. The
    # defaults read the blobs of a rank 0 that sent only the three fields above.
    name: str = ""
    command: str = ""
    world: int = 1

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    def card_line(self) -> str:
        """The line that says where the run's card is (its anchor on /dashboard)."""
        return f"dashboard: {self.url}/dashboard#run-{self.run} (this run's card)"

    @classmethod
    def from_bytes(cls, data: bytes) -> DashboardRun | None:
        """A shared run, as another rank's version wrote it: fields it does not know are
        left out (a newer rank's), missing ones take their defaults (an older rank's)."""
        if not data:
            return None
        fields = json.loads(data)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in fields.items() if k in known})


def post_json(url: str, body: dict, token: str | None = None) -> bytes:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        return response.read()


def server_said(exc: urllib.error.HTTPError) -> dict[str, str]:
    """A DaisyChain server's refusal, {error, message}, or {} for any other answer."""
    try:
        said = json.loads(exc.read())
    except (ValueError, OSError):
        return {}
    if not isinstance(said, dict) or not all(isinstance(said.get(k), str)
                                             for k in ("error", "message")):
        return {}
    return said


def refusal(exc: urllib.error.HTTPError, said: dict[str, str] | None = None) -> str:
    """One line for an HTTP error: a DaisyChain server's own message, else the status and
    what --dashboard expects (never the page it sent). `said`: server_said(exc), if read."""
    said = server_said(exc) if said is None else said
    if said:
        return f"HTTP {exc.code}: {said['message']}"
    return (f"HTTP {exc.code}, not a DaisyChain server's answer; --dashboard takes the "
            "server's own address, http(s)://HOST:PORT")


def server_of(url: str) -> str:
    """The server of a --dashboard address: the addresses a browser shows (…/dashboard, a
    card's …/dashboard#run-ID, which every run prints) are taken for their server's."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path.rstrip("/")
    if path.endswith("/dashboard"):
        path = path[: -len("/dashboard")]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def unreachable(exc: BaseException) -> str:
    """Why a request reached no server, in words ("Connection refused"), not urllib's
    "<urlopen error [Errno 111] Connection refused>"."""
    reason = getattr(exc, "reason", exc)
    return getattr(reason, "strerror", None) or str(reason)


def register(url: str, command: str, world: int, name: str = "") -> DashboardRun:
    """A new run on the server at `url`; DashboardError naming what the server said. Its
    card is named after this machine (`join on HOST`): a room's peers each have one."""
    name = name or f"{command} on {socket.gethostname()}"[:MAX_NAME]
    if not url.startswith(("http://", "https://")):
        raise DashboardError(f"--dashboard must be a server URL http(s)://HOST:PORT, got {url!r}")
    base = server_of(url)
    try:
        reply = json.loads(post_json(f"{base}/api/runs",
                                     {"name": name, "command": command, "world": world}))
    except urllib.error.HTTPError as exc:
        raise DashboardError(f"--dashboard {url} refused the run: {refusal(exc)}") from exc
    except (OSError, ValueError) as exc:
        raise DashboardError(f"--dashboard {url}: no DaisyChain server answered at {base} "
                             f"({unreachable(exc)}): is `python -m server` running there?"
                             ) from exc
    return DashboardRun(base, reply["run"], reply["token"], name, command, world)


async def share_run(collective: Any, mine: DashboardRun | None) -> DashboardRun | None:
    """Rank 0's registered run (or None: no dashboard) reaches every rank of the group."""
    blob = await collective.broadcast_bytes(
        (mine.to_bytes() if mine else b"") if collective.rank == 0 else None,
        timeout=SHARE_TIMEOUT_S)
    return DashboardRun.from_bytes(blob)


class StatusReporter:
    """One rank's status reports to `target` (a loop hook: call it with each StepResult)."""

    def __init__(self, target: DashboardRun, rank: int, collective: Any = None,
                 state: str = "training") -> None:
        # state: "waiting" for a room peer until a run starts (attach), else "training"
        self.target, self.rank, self.collective = target, rank, collective
        self.trainer: Trainer | None = None
        self.status: dict[str, Any] = {"rank": rank, "state": state, "runtime": "native",
                                       "device": platform.device_name(),
                                       "cores": platform.cpu_count(),
                                       "ram": platform.memory_bytes()}
        self.points: list[list] = []  # rank 0's loss points not yet sent
        # rank 0's points sent so far, thinned as the server thins them: what a server that
        # restarted gets again (only the sender thread touches it)
        self.sent_points: list[list] = []
        self.heldout: float | None = None
        self.failed = False
        self.told_registered_again = False
        self.refused_again = False  # the server refused to register the run again
        self.wake = threading.Condition()
        self.closed = False
        self.sender = threading.Thread(target=self._send_loop, name="dashboard", daemon=True)
        self.sender.start()

    def attach(self, trainer: Trainer) -> None:
        """The trainer whose steps this reports (its backend, the run length)."""
        from pynode.cli.report import gemm_summary

        self.trainer = trainer
        with self.wake:
            self.status.update(state="training", steps=trainer.cfg.steps, step=trainer.state.step,
                               backend=gemm_summary(trainer.gemm)[:200])

    def __call__(self, result: StepResult) -> None:
        trainer = self.trainer
        if result.heldout is not None:
            self.heldout = result.heldout
        update: dict[str, Any] = {"step": result.step, "loss": finite(result.loss),
                                  "heldout": self.heldout, "hash": result.hash[:16]}
        if trainer is not None:
            cfg = trainer.cfg
            mine = len(result.plan.get(trainer.rank(), [])) // trainer.options.share[1]
            update.update(
                microbatch_seconds=round(trainer.microbatch_seconds, 6),
                share=round(mine / cfg.microbatches, 4),
                tokens_per_s=round(mine * cfg.microbatch_size * cfg.seq
                                   / max(result.seconds, 1e-9), 1))
        if self.collective is not None:
            update["bytes_sent"] = int(self.collective.bytes_sent)
            received = self.collective.bytes_received
            update["bytes_received"] = None if received is None else int(received)
        with self.wake:
            self.status.update(update)
            if self.rank == 0 and update["loss"] is not None:
                self.points.append([result.step, update["loss"], finite(result.heldout)])
            self.wake.notify()

    def traffic(self, sent: int, received: int | None) -> None:
        """Bytes this peer sent and received so far (a room peer's mesh counts them)."""
        with self.wake:
            self.status.update(bytes_sent=int(sent),
                               bytes_received=None if received is None else int(received))

    def finish(self, state: str, reason: str = "") -> None:
        """The last report (finished or stopped, and why), sent before this returns."""
        with self.wake:
            self.status.update(state=state, reason=reason[:200])
            self.closed = True
            self.wake.notify()
        self.sender.join(timeout=2 * HTTP_TIMEOUT_S)

    def _send_loop(self) -> None:
        last = 0.0
        while True:
            with self.wake:
                self.wake.wait_for(lambda: self.closed, timeout=max(0.0, last + REPORT_EVERY_S
                                                                      - time.monotonic()))
                points = self.points[:MAX_POINTS_PER_REPORT]
                del self.points[:MAX_POINTS_PER_REPORT]
                body = {**self.status, "points": points}
                closing = self.closed and not self.points
            last = time.monotonic()
            answer = self._post(body)
            if answer is None and self.closed:
                return  # closing, and not taken: no more tries (they came without a pause)
            if answer is None:  # not taken: its points go with the next report
                with self.wake:
                    self.points[:0] = points
                    self.points = thinned(self.points)
            else:
                self.sent_points = thinned(self.sent_points + points)
                self._fill_in(body, answer)
            if closing:
                return

    def _fill_in(self, body: dict, answer: dict) -> None:
        """Rank 0 sends its whole curve again where the server's begins later than the
        curve it sent (another rank brought the run back after a restart first)."""
        first = answer.get("first_point", False)  # False: an older server, which never says
        sent = self.sent_points
        if self.rank != 0 or not sent or first is False or (first is not None
                                                           and first <= sent[0][0]):
            return
        for start in range(0, len(sent), MAX_POINTS_PER_REPORT):
            if self._post({**body, "points": sent[start:start + MAX_POINTS_PER_REPORT]},
                          may_register_again=False) is None:
                return

    def _post(self, body: dict, may_register_again: bool = True) -> dict | None:
        """Send one report; the server's answer, or None (and the one warning) if it did
        not take it."""
        url = f"{self.target.url}/api/runs/{self.target.run}/status"
        try:
            answer = post_json(url, body, self.target.token)
        except urllib.error.HTTPError as exc:
            said = server_said(exc)
            forgotten = exc.code == 404 and said.get("error") == "unknown_run"
            if forgotten and may_register_again and not self.refused_again:
                if self._register_again():
                    return self._post(body, may_register_again=False)
                return None  # _register_again said why
            self._warn(refusal(exc, said))
            return None
        except (OSError, ValueError) as exc:
            self._warn(unreachable(exc))
            return None
        if self.failed:
            self.failed = False
            log.info("rank %d: the dashboard %s takes status reports again", self.rank,
                     self.target.url)
        try:
            said = json.loads(answer) if answer else {}
        except ValueError:
            said = {}
        return said if isinstance(said, dict) else {}

    def _register_again(self) -> bool:
        """The server forgot the run (it restarted): register it again with its id and token
        (any rank may: the first brings the run back, the others find it there). Rank 0's
        curve follows in its next report (_fill_in)."""
        target = self.target
        try:
            # a rank of a run shared by an older rank (world unknown: 1) still fits in it
            post_json(f"{target.url}/api/runs", {"run": target.run, "token": target.token,
                                                 "name": target.name, "command": target.command,
                                                 "world": max(target.world, self.rank + 1)})
        except urllib.error.HTTPError as exc:
            # a refusal (another secret, a server that cannot register a run again) is final
            self.refused_again = 400 <= exc.code < 500
            # said even after an outage's warning: it is why this run reports no more
            self._warn(f"it had forgotten the run and refused it again: {refusal(exc)}",
                       final=self.refused_again)
            return False
        except (OSError, ValueError) as exc:
            self._warn("it had forgotten the run and did not register it again: "
                       f"{unreachable(exc)}")
            return False
        if not self.told_registered_again:
            self.told_registered_again = True
            log.info("rank %d: the dashboard %s had forgotten the run (a restart?); it is "
                     "registered again as %s", self.rank, target.url, target.run)
        return True

    def _warn(self, why: str, final: bool = False) -> None:
        """Once an outage (the first report not taken), and a `final` refusal always."""
        if not self.failed or final:
            self.failed = True
            then = ("this run sends it no more" if final
                    else "the next report it takes says so")
            log.warning("rank %d: the dashboard %s took no status report (%s); training "
                        "goes on, and %s", self.rank, self.target.url, why, then)


def thinned(points: list[list]) -> list[list]:
    """`points` as the server keeps them: every other one of the past dropped when full."""
    return thin_curve(points, MAX_POINTS)


def finite(value: float | None) -> float | None:
    return None if value is None or value != value or value in (float("inf"), float("-inf")) \
        else float(value)
