"""A native peer in a room: signaling, the aiortc mesh and the run protocol glued together.

server/pyodide_app/node.js does the same for a tab. `NativePeer` is what `python -m pynode join`
runs (pynode.cli_join reads the flags): it joins, waits for approval, serves the room's run
protocol (pynode.room) and reports to the terminal (`say`, a progress bar, --log), to the
pages (the "ui" channel) and to the server (status frames). With a cluster behind it
(`--cluster`), its trainer reduces through the cluster first (pynode.comm.bridge).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

from pynode.cli_train import StepReporter
from pynode.config import RunConfig
from pynode.core import checkpoint
from pynode.room import RoomError
from pynode.trainer import StepResult, Trainer

# Test hook, read only here: "STEP:KIND" makes this peer misbehave in step STEP, as it starts
# computing (whether or not the plan gave it microbatches). kill: SIGKILL itself; stall:
# block its training loop (its links stay up, its messages stop: the deadline drops it).
FAULT_ENV = "PYNODE_JOIN_FAULT"
JOIN_WAIT_S = 10.0  # a resumed run waits this long for the ready peers to ask to join
STATUS_EVERY_S = 0.25  # status frames to the server at most this often (it allows 50/s)
EXIT_DONE, EXIT_FAILED, EXIT_REFUSED = 0, 3, 4


def say(text: str) -> None:
    """A line for the person at the terminal (above the progress bar, if one is drawn)."""
    line = f"{time.strftime('%H:%M:%S')} {text}"
    try:
        from tqdm import tqdm

        tqdm.write(line, file=sys.stderr)
    except ImportError:
        print(line, file=sys.stderr, flush=True)


class NativePeer:
    """One native peer's life in a room, from joining to the end of its run."""

    def __init__(self, args: argparse.Namespace, units: Any, gemm: Any,
                 bridge: Any = None) -> None:
        self.args, self.units, self.gemm, self.bridge = args, units, gemm, bridge
        self.net: Any = None
        self.signaling: Any = None
        self.mesh: Any = None
        self.room: Any = None
        self.serving: asyncio.Task | None = None
        self.trainer: Trainer | None = None
        self.reporter: StepReporter | None = None
        self.agreed: bytes | None = None  # checkpoint of the last step every member agreed on
        self.shown: dict[str, Any] = {"state": "ready", "step": 0, "loss": None, "hash": None,
                                      "probe": None, "leader": None, "run": None, "error": None}
        self.last_status = 0.0
        self.approving: set[str] = set()  # pending peers this host approved (network loop)
        self.main = asyncio.get_running_loop()
        self.finished: asyncio.Future[int] = self.main.create_future()

    # ----------------------------------------------------------------- lifecycle
    async def run(self, cfg: RunConfig | None, resume: Any) -> int:
        await self.connect()
        if not self.signaling.approved:
            say(f"waiting for the host to approve this peer ({self.signaling.peer_id})")
            if not await self.until(lambda: self.signaling.approved, None):
                return await self.finished
            say("the host approved this peer")
        from pynode.room import RoomPeer

        self.room = RoomPeer(self.mesh, self.make_trainer, self.report)
        self.serving = asyncio.ensure_future(self.room.serve())
        if cfg is not None:
            await self.lead(cfg, resume)
        else:
            say("ready: waiting for a run to start (or to be synced into one)")
        return await self.finished

    async def connect(self) -> None:
        from pynode.comm.native_mesh import NativeMesh, NetThread
        from pynode.signaling_client import SignalingClient

        self.net = NetThread()
        self.signaling = SignalingClient(self.args.server, room=self.args.room,
                                         create=self.args.create)
        # Listening before the join: the first roster or offer must find us ready.
        self.mesh = NativeMesh(self.signaling, self.net, self.args.ice_server)
        self.mesh.show(self.shown)
        self.net.call(self.listen)
        joined = await self.net.run(self.signaling.start())
        kind = "private room" if joined.get("private") else "automatic room"
        say(f"joined {kind} {joined.get('room') or ''} as peer {joined['peer']} "
            f"({joined['role']}, {joined['state']})".replace("  ", " "))
        if self.args.create:
            say(f"share this link: {self.args.server.rstrip('/')}/?room={joined['room']}")

    def listen(self) -> None:
        """Signaling events this peer acts on (called on the network loop)."""
        sig = self.signaling
        lost: list[bool] = []

        def refused(frame: dict[str, Any]) -> None:
            verb = "declined" if frame["type"] == "denied" else "removed"
            text = f"the host {verb} this peer: {frame.get('reason', '')}"
            self.main.call_soon_threadsafe(self.finish, EXIT_REFUSED, text)

        def socket(frame: dict[str, Any]) -> None:
            if sig.closing or sig.closed_reason is not None:
                return
            if not frame["open"]:
                lost.append(True)
                say("signaling connection lost; reconnecting (training goes on)")
            elif lost:
                lost.clear()
                say("signaling connection restored")

        sig.on("denied", refused)
        sig.on("removed", refused)
        sig.on("socket", socket)
        sig.on("roster", self.approve_pending)
        sig.on("error", lambda f: say(f"server: {f.get('message')} ({f.get('code')})"))

    def approve_pending(self, frame: dict[str, Any]) -> None:
        """Host of a room this peer created: approve who opens its link (network loop).
        After a server restart members come back pending and are approved again."""
        if not self.args.create or self.signaling.role != "host":
            return
        pending = {e["id"] for e in frame.get("peers", []) if e.get("state") == "pending"}
        for peer in sorted(pending - self.approving):
            self.signaling.send("approve", peer=peer)
            say(f"approved peer {peer}")
        self.approving = pending  # asked once per wait; asked again if it comes back pending

    async def until(self, predicate: Any, timeout: float | None) -> bool:
        """Poll `predicate` (state the network thread updates); False if `timeout` passed
        or this peer finished meanwhile (declined, removed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not predicate():
            if self.finished.done() or (deadline is not None and time.monotonic() > deadline):
                return False
            await asyncio.sleep(0.1)
        return True

    async def close(self) -> None:
        if self.room is not None:
            self.serving.cancel()
            self.room.router.stop()
        if self.mesh is not None:
            await self.mesh.flush()
            await asyncio.sleep(0.5)  # SCTP acknowledges what flush handed to the wire
            await self.mesh.close()
        if self.signaling is not None:
            await self.net.run(self.signaling.close())
        if self.net is not None:
            self.net.stop()
        if self.reporter is not None:
            self.reporter.close()

    def finish(self, code: int, text: str = "") -> None:
        if text:
            say(text)
        if not self.finished.done():
            self.finished.set_result(code)

    # ----------------------------------------------------------------- leading
    async def lead(self, cfg: RunConfig, resume: Any) -> None:
        want, room = self.args.min_peers, self.room

        def ready() -> list[str]:
            return [p for p, h in room.hellos.items()
                    if h.get("state") == "ready" and h.get("run") is None]

        say(f"waiting for {want} ready peer(s), this one included")
        if not await self.until(lambda: len(ready()) + 1 >= want, self.args.wait):
            if self.finished.done():
                return
            raise RoomError(f"only {len(ready()) + 1} of {want} peers were ready after "
                            f"{self.args.wait:g} s; nothing started")
        if resume is None:
            ranks = await room.start(json.loads(cfg.to_json()))
        else:
            ranks = await room.start_resumed(cfg, resume, JOIN_WAIT_S)
        say(f"leading the run with {len(ranks)} peer(s): {', '.join(ranks)}")

    # ----------------------------------------------------------------- training
    def make_trainer(self, cfg: RunConfig, collective: Any, resume: Any) -> Trainer:
        """A trainer on the verified units and gated GEMM (the loop of `pynode train`);
        behind a cluster, one whose collective reduces through the cluster first."""
        if self.bridge is not None:
            state = None if resume is None else checkpoint.save_checkpoint(resume)
            collective = self.bridge.wrap(collective, cfg.to_json(), state)
        trainer = verified_trainer(self.units, self.gemm, cfg, collective, resume,
                                self.bridge is not None)
        if self.args.timeout is not None:
            trainer.min_deadline = self.args.timeout
        install_fault(trainer)
        self.trainer = trainer
        return trainer

    def report(self, kind: str, fields: dict[str, Any]) -> None:
        """What the room reports (see pynode.room.RoomPeer), on the training loop."""
        if kind == "run":
            self.on_run(fields)
        elif kind == "step":
            self.on_step(fields)
        elif kind in ("done", "failed"):
            self.on_end(kind, fields)
        elif kind == "event":
            say(fields["text"])
        if kind in ("run", "step", "done", "failed") and self.mesh is not None:
            self.mesh.show(self.shown)

    def on_run(self, fields: dict[str, Any]) -> None:
        cfg = fields["config"]
        self.shown.update(state="training", leader=fields["leader"], run=fields["run"],
                          error=None)
        joined = fields["joined_at"]
        say(f"training: run {fields['run']} led by {fields['leader']}, {len(fields['ranks'])} "
            f"peer(s), {cfg['steps']} steps" + ("" if joined is None else
                                                  f"; synced at step {joined}, hash verified"))
        if self.reporter is None and self.trainer is not None:
            self.reporter = StepReporter(self.trainer, cfg["steps"], self.args.log,
                                         progress=not self.args.no_progress)

    def on_step(self, fields: dict[str, Any]) -> None:
        result = StepResult(step=fields["step"], loss=fields["loss"], hash=fields["hash"],
                            probe=fields["probe"], seconds=fields["seconds"])
        if self.reporter is not None:
            self.reporter(result)
        self.shown.update(step=result.step, loss=result.loss, hash=result.hash,
                          probe=result.probe)
        if self.args.save and self.trainer is not None:
            from pynode.session import checkpoint_bytes, write_atomically

            self.agreed = checkpoint_bytes(self.trainer)
            if self.args.save_every and result.step % self.args.save_every == 0:
                write_atomically(self.args.save, self.agreed)
        now = time.monotonic()
        if now - self.last_status >= STATUS_EVERY_S:
            self.last_status = now
            loss = result.loss if result.loss == result.loss else None  # NaN is not JSON
            self.net.call(lambda: self.signaling.send(
                "status", step=result.step, hash=result.hash, probe=result.probe, loss=loss))

    def on_end(self, kind: str, fields: dict[str, Any]) -> None:
        if self.bridge is not None:
            asyncio.ensure_future(self.bridge.end_run())
        if kind == "failed":
            self.shown.update(state="failed", error=fields["error"])
            self.save(final=False)
            self.finish(EXIT_FAILED, f"stopped: {fields['error']}")
            return
        self.shown["state"] = "done"
        self.save(final=True)
        print(fields["hash"])
        self.finish(EXIT_DONE, f"run finished at step {fields['step']}, "
                               f"hash {fields['hash'][:16]}")

    def save(self, final: bool) -> None:
        from pynode.session import checkpoint_bytes, write_atomically

        if not self.args.save or self.trainer is None:
            return
        data = checkpoint_bytes(self.trainer) if final else self.agreed
        if data is None:
            return
        write_atomically(self.args.save, data)
        step = checkpoint.load_checkpoint(data).step
        say(f"saved {'the' if final else 'the last agreed'} state (step {step}) to "
            f"{self.args.save}")


def verified_trainer(units: Any, gemm: Any, cfg: RunConfig, collective: Any, resume: Any,
                  cluster: bool = False) -> Trainer:
    """A trainer of `cfg` on verified `units` and `gemm`, from checkpoint `resume` or fresh;
    a ClusterTrainer (its share of the cluster's microbatches) when `cluster`."""
    from pynode.comm.bridge import ClusterTrainer
    from pynode.session import state_from_checkpoint
    from pynode.tasks import load_task

    task = load_task(cfg.task)
    uses_gemm = getattr(task, "uses_units", True)
    state = None if resume is None else state_from_checkpoint(resume)
    kind = ClusterTrainer if cluster else Trainer
    trainer = kind(cfg, task, gemm if uses_gemm else None, collective, state)
    trainer.units = units
    if cluster:
        inner = collective.inner
        trainer.cluster_rank, trainer.cluster_size = inner.rank, inner.world_size
    return trainer


def install_fault(trainer: Trainer) -> None:
    """For the fault tests: PYNODE_JOIN_FAULT=STEP:KIND, KIND one of kill (SIGKILL before the
    step's compute), stall (the training loop hangs, links stay up) or sum (SIGKILL while
    handing out its reduced chunk, after the leader committed the all-reduce)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    step_text, _, kind = spec.partition(":")
    at = int(step_text)
    original = trainer.microbatch_partial
    if kind == "sum":
        from pynode.comm.webrtc import Op

        coll = trainer.collective
        plain_send = coll._send

        def send(peer: str, op: Op, *args: Any, **kw: Any) -> None:
            plain_send(peer, op, *args, **kw)
            if op == Op.SUM and trainer.state.step + 1 == at:
                os.kill(os.getpid(), signal.SIGKILL)

        coll._send = send
        return

    def faulty(indices: list[int]) -> Any:
        if trainer.state.step + 1 == at:  # with or without microbatches of its own
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "stall":
                time.sleep(3600)
        return original(indices)

    trainer.microbatch_partial = faulty  # type: ignore[method-assign]
