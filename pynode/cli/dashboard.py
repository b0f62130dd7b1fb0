"""`--dashboard URL`: a native run reports its status to a DaisyChain server's /dashboard.

Rank 0 registers the run (POST /api/runs) and gets its id and a token only the run's
ranks learn (through the group: `share_run`); then every rank posts its own status, at
most once a second and once more at the end, from a background thread, so a slow or
vanished server never holds a step up (a failed report is said once, and training goes on).
A status is step, loss, speed, resources and traffic: never weights or gradients
(server/runs.py refuses any other field).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from pynode import platform
from pynode.core.errors import DaisyError
from pynode.run.trainer import StepResult, Trainer

log = logging.getLogger("pynode.dashboard")

REPORT_EVERY_S = 1.0
HTTP_TIMEOUT_S = 5.0
MAX_NAME = 200  # characters of a run's name (the server's MAX_TEXT)
SHARE_TIMEOUT_S = 120.0


class DashboardError(DaisyError):
    """The --dashboard server did not register the run (its answer is in the message)."""


@dataclass(frozen=True)
class DashboardRun:
    url: str    # the server, http://HOST:PORT
    run: str    # the id the server gave the run
    token: str  # the run's secret: reports carry it

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> DashboardRun | None:
        return cls(**json.loads(data)) if data else None


def post_json(url: str, body: dict, token: str | None = None) -> bytes:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        return response.read()


def refusal(exc: urllib.error.HTTPError) -> str:
    """One line for an HTTP error: a DaisyChain server's own message, else the status and
    what --dashboard expects (never the page it sent)."""
    try:
        said = json.loads(exc.read())
        return f"HTTP {exc.code}: {said['message']}"
    except (ValueError, KeyError, TypeError, OSError):
        return (f"HTTP {exc.code}, not a DaisyChain server's answer; --dashboard takes the "
                "server's own address, http(s)://HOST:PORT")


def register(url: str, command: str, world: int, name: str = "") -> DashboardRun:
    """A new run on the server at `url`; DashboardError naming what the server said. Its
    card is named after this machine (`join on HOST`): a room's peers each have one."""
    name = name or f"{command} on {socket.gethostname()}"[:MAX_NAME]
    if not url.startswith(("http://", "https://")):
        raise DashboardError(f"--dashboard must be a server URL http(s)://HOST:PORT, got {url!r}")
    base = url.rstrip("/")
    if base.endswith("/dashboard"):  # the address the browser shows: the server is above it
        base = base[: -len("/dashboard")]
    try:
        reply = json.loads(post_json(f"{base}/api/runs",
                                     {"name": name, "command": command, "world": world}))
    except urllib.error.HTTPError as exc:
        raise DashboardError(f"--dashboard {url} refused the run: {refusal(exc)}") from exc
    except (OSError, ValueError) as exc:
        raise DashboardError(f"--dashboard {url}: no DaisyChain server answered ({exc})") from exc
    return DashboardRun(base, reply["run"], reply["token"])


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
        self.heldout: float | None = None
        self.failed = False
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
                body = {**self.status, "points": self.points[:512]}
                del self.points[:512]
                closing = self.closed and not self.points
            last = time.monotonic()
            self._post(body)
            if closing:
                return

    def _post(self, body: dict) -> None:
        url = f"{self.target.url}/api/runs/{self.target.run}/status"
        try:
            post_json(url, body, self.target.token)
        except (OSError, ValueError) as exc:
            if not self.failed:
                self.failed = True
                log.warning("rank %d: the dashboard %s took no status report (%s); training "
                            "goes on without it", self.rank, self.target.url, exc)


def finite(value: float | None) -> float | None:
    return None if value is None or value != value or value in (float("inf"), float("-inf")) \
        else float(value)
