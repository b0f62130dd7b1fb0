"""A native peer in a room: signaling, the aiortc mesh and the run protocol glued together.

server/pyodide_app/node.js does the same for a tab. `NativePeer` is what `python -m pynode
join` runs (pynode.cli.join reads the flags): it joins, waits for approval, serves the room's
run protocol (pynode.run.protocol) and reports to the terminal (`say`, a progress bar,
--log), to the pages (the "ui" channel) and to the server (status frames). With a cluster
behind it (`--cluster`), its trainer reduces through the cluster first (pynode.run.cluster).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from pynode.cli.faults import install_fault
from pynode.cli.flags import train_options
from pynode.cli.report import Saver, StepReporter, final_status, say
from pynode.config import RunConfig
from pynode.core import checkpoint
from pynode.run.assemble import build_trainer
from pynode.run.outer import stop_if_cancelled
from pynode.run.protocol import RoomError, goodbye
from pynode.run.schedule import is_stop
from pynode.run.trainer import StepResult, Trainer

JOIN_WAIT_S = 10.0  # a resumed run waits this long for the ready peers to ask to join
STATUS_EVERY_S = 0.25  # status frames to the server at most this often (it allows 50/s)
SERVER_ERROR_REPEAT_S = 30.0  # the same error of the server said at most this often
EXIT_DONE, EXIT_FAILED, EXIT_REFUSED = 0, 3, 4  # refused: declined, removed, not approved
RUN_STOP_S = 10.0  # a removed peer's run stops at once (its task cancelled); at most this


# What a step report says of this peer's part (pynode.run.protocol.RoomPeer.report_step).
PART_FIELDS = ("microbatch_seconds", "share", "tokens_per_s")


def resources(gemm: Any) -> dict[str, Any]:
    """What the pages' dashboards show of this machine, as a tab tells its own."""
    from pynode import platform

    return {"runtime": "native", "gemm": getattr(gemm, "backend_name", None),
            "kernels": getattr(getattr(gemm, "kernels", None), "name", None),
            "cores": platform.cpu_count(), "ram": platform.memory_bytes(),
            "device": platform.device_name()}


def outer_note(cfg: dict[str, Any]) -> str:
    """', syncs every H steps over R replicas' for a --sync-every run's config, else ''."""
    every = cfg.get("sync_every", 1)
    return f", syncs every {every} steps over {cfg.get('replicas', 1)} replicas" \
        if every > 1 else ""


# How long `join` waits for its own links' first RTT and scan before printing the matrix
# (heartbeats every 0.5 s: pynode.comm.native_mesh.BEAT_S), and how often it looks.
MATRIX_WAIT_S = 3.0
MATRIX_POLL_S = 0.25


def link_failed_text(peer: str) -> str:
    """What to do about a pair that cannot connect (the page says the same, node.js)."""
    return (f"no connection to peer {peer}: no ICE candidate pair works between the two "
            "networks. On one LAN allow UDP between the machines (and multicast DNS for "
            "tabs); across networks the server needs a TURN server (--ice-server); or put "
            "both on one VPN. See docs/NETWORKS.md.")


def route_kind(local: str | None, remote: str | None) -> str:
    """What a link's ICE candidate types mean, in plain words ("host" is ICE's word for a
    machine's own address, not the room's host): ", direct" for host -> host, ", relayed by
    the TURN server" where an end is a relay; else nothing (an end ICE learned from the
    other's checks reads `prflx`, even the other's relay: its address tells, NETWORKS.md)."""
    if local == remote == "host":
        return ", direct"
    if "relay" in (local, remote):
        return ", relayed by the TURN server"
    return ""


def matrix_line(row: dict[str, Any]) -> str:
    """One link of the connectivity matrix, as `join` prints it."""
    def number(value: Any, unit: str) -> str:
        return "?" if value is None else f"{value:g} {unit}"

    return (f"{row['a']} -> {row['b']}: {row['state']}, {row['local'] or '?'} -> "
            f"{row['remote'] or '?'}{route_kind(row['local'], row['remote'])}, "
            f"RTT {number(row['rtt_ms'], 'ms')}, "
            f"{number(row['mbps'], 'MB/s')}")


class NativePeer:
    """One native peer's life in a room, from joining to the end of its run."""

    def __init__(self, args: argparse.Namespace, units: Any, gemm: Any,
                 bridge: Any = None, status: Any = None) -> None:
        self.args, self.units, self.gemm, self.bridge = args, units, gemm, bridge
        self.status = status  # a --dashboard StatusReporter, or None
        self.net: Any = None
        self.signaling: Any = None
        self.mesh: Any = None
        self.matrix_printer: asyncio.Future | None = None  # print_matrix at a run's start
        self.command_task: asyncio.Task | None = None  # run()'s: Ctrl-C cancels it
        self.room: Any = None
        self.serving: asyncio.Task | None = None
        self.trainer: Trainer | None = None
        self.reporter: StepReporter | None = None
        self.saver = Saver(args.save, args.save_every, tell=say, log=getattr(args, "log", None))
        self.save_step: Any = None  # the saver's hook for the current trainer
        self.kept: str | None = None  # --stay: what --save holds of the last run, said
        self.shown: dict[str, Any] = {"state": "ready", "step": 0, "loss": None, "hash": None,
                                      "probe": None, "leader": None, "run": None, "error": None,
                                      "bytes_sent": 0, "bytes_received": 0,  # as a tab's
                                      **resources(gemm)}
        self.last_status = 0.0
        self.approving: set[str] = set()  # pending peers this host approved (network loop)
        self.next_status: asyncio.Task | None = None  # --stay --dashboard: the next card
        self.main = asyncio.get_running_loop()
        self.finished: asyncio.Future[int] = self.main.create_future()

    # ----------------------------------------------------------------- lifecycle
    async def run(self, cfg: RunConfig | None, resume: Any) -> int:
        self.command_task = asyncio.current_task()
        try:
            code = await self._run(cfg, resume)
        except BaseException:  # interrupted (Ctrl-C): keep what the room agreed on, as train does
            self.say_goodbye()  # before the run's collective says its own BYE: "left", not "lost"
            await self.run_stopped(cancel=True)
            self.tell_last_agreed()
            raise
        if code == EXIT_REFUSED:  # removed mid-run: --save was lost, with no word of it
            await self.run_stopped()
            self.tell_last_agreed()
        return code

    def leave_room(self, reason: str) -> None:
        """Declined or removed by the host: out of the room for good. A run under way stops
        where it stands (RoomPeer.leave), as a removed page's does: it went on to fail over
        to itself as a group of one, and then wrote to a log the command had closed."""
        if self.room is not None:
            self.room.leave(reason)
        self.finish(EXIT_REFUSED, f"this peer leaves the room: {reason}")

    async def run_stopped(self, cancel: bool = False) -> None:
        """Until the room's run task has ended: cancelled by leave_room (it says where it
        stopped), or here (`cancel`: Ctrl-C left a leader's task training on, writing steps
        to the log the command had closed), before the log closes."""
        task = self.room.task if self.room is not None else None
        if task is not None and not task.done():
            if cancel:
                task.cancel()
            await asyncio.wait([task], timeout=RUN_STOP_S)

    def tell_last_agreed(self) -> None:
        """--save's last agreed state, said on a line of its own (the progress bar closed
        first: the line was glued onto it)."""
        if self.reporter is not None:
            self.reporter.close()
        if self.kept is not None and self.trainer is None:  # --stay, between runs
            say(self.kept)
            return
        self.saver.tell_last_agreed()

    async def _run(self, cfg: RunConfig | None, resume: Any) -> int:
        await self.connect()
        if not self.signaling.approved:
            wait = self.args.approval_wait
            say(f"waiting for the host to approve this peer ({self.signaling.peer_id}), "
                f"at most {wait:g} s")
            if not await self.until(lambda: self.signaling.approved, wait):
                if self.finished.done():  # declined or removed: it said so
                    return await self.finished
                # An unknown code and an undecided room answer alike (docs/SERVER.md "Rooms"):
                # the wait is the same for both, so it tells nothing about the code.
                # This peer leaves the room now: its id can no longer be approved.
                self.finish(EXIT_REFUSED, f"nobody approved this peer within {wait:g} s: "
                            "check the room code, or run join again and have the room's "
                            "host approve the peer id it then shows (--approval-wait sets "
                            "the wait). A "
                            "room whose host left (its page closed, its `join --create` "
                            "ended) approves nobody until the host is back: --create makes "
                            "a new one")
                return await self.finished
            say("the host approved this peer")
        from pynode.run.protocol import RoomPeer

        hooks = () if self.bridge is None else (self.bridge.before_step,)
        self.room = RoomPeer(self.mesh, self.make_trainer, self.report, hooks, steerable=False)
        self.serving = asyncio.ensure_future(self.room.serve())
        if cfg is not None:
            await self.lead(cfg, resume)
        else:
            say("ready: waiting for a run to start (or to be synced into one)")
        return await self.finished

    async def connect(self) -> None:
        from pynode.comm.native_mesh import NativeMesh, NetThread
        from pynode.comm.signaling import SignalingClient

        self.net = NetThread()
        self.signaling = SignalingClient(self.args.server, room=self.args.room,
                                         create=self.args.create)
        # Listening before the join: the first roster or offer must find us ready.
        self.mesh = NativeMesh(self.signaling, self.net, self.args.ice_server, self.on_link,
                               goodbye())
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
            verb = "the host declined" if frame["type"] == "denied" else "removed by the host"
            self.main.call_soon_threadsafe(self.leave_room, frame.get("reason") or verb)

        def socket(frame: dict[str, Any]) -> None:  # an outage said once, and its end
            if sig.closing or sig.closed_reason is not None:
                return
            if not frame["open"] and not lost:
                lost.append(True)
                going_on = " (training goes on)" if self.shown["state"] == "training" else ""
                say(f"signaling connection lost; reconnecting{going_on}")
            elif frame["open"] and lost:
                lost.clear()
                back.append(True)
                say("signaling connection restored")

        def joined(frame: dict[str, Any]) -> None:  # a restarted server asks for approval anew
            if back and frame.get("state") == "pending":
                say("the server restarted: this peer waits for the host's approval again "
                    "(a run under way goes on)")
            back.clear()

        back: list[bool] = []
        sig.on("denied", refused)
        sig.on("removed", refused)
        sig.on("socket", socket)
        sig.on("joined", joined)
        sig.on("roster", self.approve_pending)
        said: dict[tuple[Any, Any], float] = {}

        def server_error(frame: dict[str, Any]) -> None:  # each error once in a while
            key, now = (frame.get("code"), frame.get("message")), time.monotonic()
            if now - said.get(key, -SERVER_ERROR_REPEAT_S) >= SERVER_ERROR_REPEAT_S:
                said[key] = now
                say(f"server: {frame.get('message')} ({frame.get('code')})")

        sig.on("error", server_error)

    def on_link(self, route: dict[str, Any]) -> None:
        """A link opened or failed (training loop): say over which candidate types, or what
        to do about it."""
        if route["state"] == "failed":
            say(link_failed_text(route["peer"]))
        else:
            say(f"link to peer {route['peer']} open: {route['local']} -> {route['remote']} "
                f"candidates ({route['localAddress']} -> {route['remoteAddress']})"
                f"{route_kind(route['local'], route['remote'])}")

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
            self.say_goodbye()
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

    def say_goodbye(self) -> None:
        """Tell the room this peer leaves on purpose, before its links close (the
        others then say it left, not that they lost it). On one link, this `bye` goes out
        ahead of the run's collective BYE, so a leader reads it first."""
        if self.room is not None and self.mesh is not None:
            self.room.say_goodbye()

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
        """A trainer on the verified units and gated GEMM; behind a cluster, one whose
        collective reduces through the cluster first and that computes rank 0's share."""
        share = (0, 1)
        if self.bridge is not None:
            state = None if resume is None else checkpoint.save_checkpoint(resume)
            collective = self.bridge.wrap(collective, cfg, state)
            share = (0, self.bridge.inner.world_size)
        options = train_options(self.args, share=share)
        trainer = build_trainer(cfg, collective, resume, arithmetic=(self.units, self.gemm),
                                options=options)
        install_fault(trainer)
        trainer.after_inner.append(self.stop_if_interrupted)
        self.trainer, self.save_step = trainer, self.saver.hook(trainer)
        return trainer

    def stop_if_interrupted(self, replica: int, step: int) -> None:
        """After each inner step of a --sync-every outer step: Ctrl-C cancels the command's
        task, not the room's, whose outer step awaits nothing for its H inner steps, so
        the room's asks the command's as `train`'s asks its own."""
        if self.command_task is not None:
            stop_if_cancelled(self.command_task)

    def report(self, kind: str, fields: dict[str, Any]) -> None:
        """What the room reports (see pynode.run.protocol.RoomPeer), on the training loop."""
        if kind == "run":
            self.on_run(fields)
        elif kind == "step":
            self.on_step(fields)
        elif kind in ("done", "failed"):
            self.on_end(kind, fields)
        elif kind == "event":
            say(fields["text"])
        elif kind == "joining" and fields["run"]:
            say(f"asked {fields['leader']} to join its run: admitted at its next step (not "
                "while it is paused)")
        elif kind == "leader":
            self.shown["leader"] = fields["leader"]
            who = "this peer" if fields["leader"] == self.room.id else fields["leader"]
            say(f"the run goes on after step {fields['step']} led by {who}, with "
                f"{len(fields['ranks'])} peer(s)")
        elif kind == "control":
            given = fields.get("change") or {}
            change = {k: v for k, v in given.items() if k != "step"}
            if is_stop(given):  # the run's total set to the step reached
                say(f"the leader stopped the run at step {given['step']}")
            elif change:
                # the change's step is the last before it (a schedule's "after step N")
                say(f"after step {given['step']}: "
                    + ", ".join(f"{k} {v}" for k, v in change.items()))
            else:
                say(f"{'paused' if fields['paused'] else 'resumed'} after step {fields['step']} "
                    "by the leader")
        if kind in ("run", "step", "done", "failed", "leader") and self.mesh is not None:
            self.mesh.show(self.shown)

    async def print_matrix(self) -> None:
        """The connectivity matrix (pynode.comm.native_mesh `matrix`), one line per link.
        A link opened just before the run has had no heartbeat echo or scan yet: this
        peer's own rows get up to MATRIX_WAIT_S to measure them (they printed `RTT ?`)."""
        rows = await self.mesh.matrix()
        waited = 0.0
        while waited < MATRIX_WAIT_S and any(
                r["a"] == self.mesh.self_id and r["state"] == "connected"
                and (r["rtt_ms"] is None or r["mbps"] is None) for r in rows):
            await asyncio.sleep(MATRIX_POLL_S)
            waited += MATRIX_POLL_S
            rows = await self.mesh.matrix()
        say(f"connectivity: {len(rows)} link(s) (from -> to: state, candidate types, RTT, "
            "MB/s of the scan)")
        for row in rows:
            say("  " + matrix_line(row))

    def on_run(self, fields: dict[str, Any]) -> None:
        cfg = fields["config"]
        self.shown.update(state="training", leader=fields["leader"], run=fields["run"],
                          error=None)
        joined = fields["joined_at"]
        joining = fields.get("joining") or []
        joins = f" and {len(joining)} joining at its first step" if joining else ""
        synced = "" if joined is None else f"; synced at step {joined}, hash verified"
        say(f"training: run {fields['run']} led by {fields['leader']}, {len(fields['ranks'])} "
            f"peer(s){joins}, {cfg['steps']} steps" + outer_note(cfg) + synced)
        self.matrix_printer = asyncio.ensure_future(self.print_matrix())  # held: not collected
        if self.reporter is None and self.trainer is not None:
            self.reporter = StepReporter(self.trainer, cfg["steps"], self.args.log,
                                         progress=not self.args.no_progress)
        if self.status is not None and self.trainer is not None:
            self.status.attach(self.trainer)

    def on_step(self, fields: dict[str, Any]) -> None:
        result = StepResult(step=fields["step"], loss=fields["loss"], hash=fields["hash"],
                            probe=fields["probe"], seconds=fields["seconds"],
                            plan=fields.get("plan", {}), heldout=fields.get("heldout"),
                            inner=fields.get("inner", 1), change=fields.get("change"))
        if self.reporter is not None:
            self.reporter(result)
        if self.status is not None:
            self.status(result)
        self.shown.update(step=result.step, loss=result.loss, hash=result.hash,
                          probe=result.probe, heldout=fields.get("heldout"),
                          **{k: fields.get(k) for k in PART_FIELDS})
        if self.mesh is not None:
            self.shown.update(bytes_sent=self.mesh.sent_bytes,
                              bytes_received=self.mesh.received_bytes)
            if self.status is not None:
                self.status.traffic(self.mesh.sent_bytes, self.mesh.received_bytes)
        if self.save_step is not None:
            self.save_step(result)
        now = time.monotonic()
        if now - self.last_status >= STATUS_EVERY_S:
            self.last_status = now
            loss = result.loss if result.loss == result.loss else None  # NaN is not JSON
            self.net.call(lambda: self.send_status(
                step=result.step, hash=result.hash, probe=result.probe, loss=loss))

    def send_status(self, **fields: Any) -> None:
        """The room's status frame (network loop), while this peer is approved: back from a
        server restart it waits for approval again, and the server refuses status frames
        meanwhile (one refusal a step was said, 14 in 4 s)."""
        if self.signaling.approved:
            self.signaling.send("status", **fields)

    def on_end(self, kind: str, fields: dict[str, Any]) -> None:
        if self.reporter is not None:  # the bar ends first: the hash on stdout was glued
            self.reporter.close()      # onto it, and the bar drawn again after the end
        if self.bridge is not None:
            asyncio.ensure_future(self.bridge.end_run())
        state = "stopped" if kind == "failed" else "finished"
        if self.status is not None:
            self.status.finish(state, fields.get("error", ""))
        say(final_status(0, self.trainer, state, fields.get("error", ""),
                         getattr(self.trainer, "collective", None)).replace("rank 0: ", "", 1))
        if kind == "failed":
            self.shown.update(state="failed", error=fields["error"])
            self.save(final=False)
            if not self.stay_for_next_run():
                self.finish(EXIT_FAILED)  # the status line above said why
            return
        self.shown["state"] = "done"
        self.save(final=True)
        print(fields["hash"], flush=True)
        if not self.stay_for_next_run():
            self.finish(EXIT_DONE)  # the status line above said it

    def stay_for_next_run(self) -> bool:
        """--stay: ready for the room's next run, as a tab is (a machine given to a room
        needed `join` started and approved again for each run); False without it. The next
        run has its own bar, --log rows (appended), --save and dashboard card."""
        if not getattr(self.args, "stay", False):  # it left without a word, tabs staying
            say("left the room with the run's end (with --stay a peer waits there for the "
                "room's next run)")
            return False
        self.reporter = self.trainer = self.save_step = None
        self.saver = Saver(self.args.save, self.args.save_every, tell=say,
                           log=getattr(self.args, "log", None))
        self.shown.update(state="ready", error=None)
        if self.status is not None:  # its card ended with the run: a new one for the next
            self.status = None
            self.next_status = asyncio.ensure_future(self.register_next_run())
        say("ready for the room's next run (--stay; Ctrl-C leaves the room)")
        return True

    async def register_next_run(self) -> None:
        """A dashboard card for the next run (--stay --dashboard); without one if the
        server does not take it (said once)."""
        from pynode.cli.dashboard import DashboardError, StatusReporter, register

        try:
            target = await asyncio.to_thread(register, self.args.dashboard, "join", 1)
        except DashboardError as exc:
            say(f"the next run goes without a dashboard card: {exc}")
            return
        self.status = StatusReporter(target, 0, state="waiting")

    def save(self, final: bool) -> None:
        if self.trainer is None:
            return
        line = self.saver.final(self.trainer) if final else self.saver.last_agreed()
        if line:
            say(line)
            step = self.trainer.state.step if final else self.saver.agreed_step
            self.kept = f"--save {self.args.save} holds the last run's state (step {step})"
