"""The run protocol: how a run starts, who is in it, how late joiners and ranks follow.

Every message is one `pack_message` (pynode.comm.wire: u32 length, JSON head with its kind
in "t", then a blob). Three carriers speak it:

In a room (RoomPeer, over a mesh channel tagged b"R"; each message starts with the tag).
Whoever starts a run leads it (rank 0): it proposes the config to every ready peer, fixes
the ranks from those that accept, and admits late joiners between steps, sending each the
state of the step just finished as a checkpoint (weights, optimizer state, step; the data
cursor is the step) that the joiner validates and checks against the agreed hash. From
then on every member runs the one loop (pynode.run.loop) with the leader's control
broadcast before each step; the step's hash and probe check stops any peer that forks.

    hello   {state, run}            on every new channel and on each change; `run` is
                                    {id, leader, step, steps} or null
    propose {run, config | bench}   leader -> ready idle peers (bench: {size, repeats}, an
                                    all-reduce benchmark instead of a run)
    accept / refuse {run, reason}   -> leader
    go      {run, config | bench, ranks, group}   leader -> accepted peers: start
    cancel  {run}                   leader -> accepted peers left out
    join    {run, open}             idle ready peer -> leader (`open`: peers it reaches)
    sync    {run, config, ranks, members, seq, group, hash, capacities, distrusted}
            + checkpoint
    survivor  {run, lost, held, words}   a member that lost the leader `lost` -> the next
                                    member in rank order it reaches (pynode.run.failover)
    takeover  {run, ranks, group, step, hash, capacities, distrusted}   the new leader ->
                                    each survivor it takes: rewind to `step`, go on
    decline   {run, leader}         -> a survivor: not taking over; `leader` (or null) leads
                                    the run now: ask it to join, else try the next member
    bye     {}                      a peer that leaves on purpose, before its links close:
                                    the others say it left, not that they lost it

When the leader vanishes mid-run, the survivors go on without it (RoomPeer.fail_over): the
next member in rank order takes over from the last step boundary they all agreed on, with
the old leader's steering of that boundary, and the run ends on the same hashes.

In a group (pynode.run.group), rank 0 broadcasts `go {config}` (+ checkpoint when resuming).
Behind a cluster bridge (pynode.run.cluster), rank 0 broadcasts to its ranks `go {config}`
(+ checkpoint), `end` when that run is over and `stop` when it leaves.
Every start is read by `read_start`, so each refuses the same bad configs and files.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from pynode.comm import webrtc
from pynode.comm.base import PeerLost
from pynode.comm.mesh import Mesh, MeshRouter
from pynode.comm.wire import MessageError, pack_message, unpack_message
from pynode.config import ConfigError, RunConfig
from pynode.core import checkpoint
from pynode.core.errors import DaisyError
from pynode.run.errors import ForkError, LeftRoom, LeftRun, RoomError
from pynode.run.loop import BeforeStep, train
from pynode.run.room import Reporter, Run, TrainerFactory, read_curve
from pynode.run.steering import Steering
from pynode.run.takeover import Takeover
from pynode.run.trainer import StepResult, Trainer

log = logging.getLogger(__name__)

TAG = b"R"
PROPOSE_WAIT_S = 5.0  # how long the leader waits for answers to a proposal
PENDING_S = 15.0  # a peer that accepted waits this long for `go` before it is free again
BENCH_TIMEOUT_S = 120.0  # per collective of an all-reduce benchmark
RESUME_WAIT_S = 10.0  # a resumed run waits this long for the ready peers to ask to join


def encode(kind: str, blob: bytes = b"", **fields: Any) -> bytes:
    """A run message of `kind` (without a carrier's tag)."""
    return pack_message({"t": kind, **fields}, blob)


def goodbye() -> bytes:
    """What a peer that leaves on purpose (Ctrl-C, a closed tab) sends every other peer
    before its links close, carrier tag and all: they then say it left, not that it was
    lost. A page's main thread sends these bytes itself as the tab goes (the worker's Python
    may not get to run), so they are the same for every receiver."""
    return TAG + encode("bye")


def decode(data: bytes | memoryview) -> tuple[dict[str, Any], bytes]:
    """(head, blob) of a run message; MessageError unless it is one."""
    head, blob = unpack_message(data)
    if not isinstance(head.get("t"), str):
        raise MessageError("a run message needs a kind (\"t\")")
    return head, blob


def start_message(kind: str, cfg: RunConfig, state: bytes | None = None,
                  **fields: Any) -> bytes:
    """A message that starts (or syncs into) a run of `cfg`, from checkpoint `state`."""
    return encode(kind, state or b"", config=json.loads(cfg.to_json()), **fields)


def read_start(data: bytes | memoryview | None = None, *, head: dict | None = None,
               blob: bytes = b"") -> tuple[dict[str, Any], RunConfig,
                                          checkpoint.CheckpointState | None]:
    """(head, config, checkpoint or None) of a start message (`data`, or its decoded
    `head` and `blob`): the config checked, the checkpoint validated against the model the
    config describes and, when the head names a "hash", against that. ConfigError or
    CheckpointError otherwise: nothing of it is used."""
    from pynode.run.assemble import checkpoint_expectations

    if head is None:
        head, blob = decode(data)
    try:
        cfg = RunConfig.from_dict(head["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"the run's config cannot be used: {exc}") from exc
    ckpt = None
    if blob:
        ckpt = checkpoint.load_checkpoint(blob, expect=checkpoint_expectations(cfg))
        if "hash" in head and ckpt.state_hash != head["hash"]:
            raise checkpoint.CheckpointError(
                f"the state sent hashes to {ckpt.state_hash[:16]}, the run agreed on "
                f"{str(head['hash'])[:16]}")
    return head, cfg, ckpt


class RoomPeer(Takeover, Steering):
    """This peer's part in the room's runs. `serve()` once; then `start` to lead a run.

    report(kind, fields) tells the page what happens:
      run     {run, leader, ranks, config, joined_at,   training started or joined; `step`
               joining, step, hash, curve, schedule}    and `hash`: the state it goes on
                                                        from; `joining`: the peers admitted
                                                        at its first step (a resumed start);
                                                        `config`: as it is now, every change
                                                        in `schedule` already in it (a
                                                        resume's own steps and lr too)
      step    {step, loss, hash, probe, members, seconds, inner, share, ...}
      inner   {run, replica, step}                      a --sync-every run: this peer took
                                                        inner step `step` of `replica`
      done    {step, hash}                              the run reached its last step
      failed  {error}                                   this peer stopped (fork, lost group)
      leader  {leader, lost, step, ranks, config,       the leader `lost` vanished; the run
               schedule}                                goes on from `step` under `leader`,
                                                        with the config and changes it had
                                                        there
      event   {level, text}                             peer lost, peer joined, ...
      joining {run, leader}                             asked to join a run, admitted at its
                                                        next step; {run: null}: no longer
      peers   {peer id: "ready" | "joining" | "training"}   peers whose Python said hello
      bench   {size, members, seconds, bytes_sent, exact}   an all-reduce benchmark's timing
    """

    def __init__(self, mesh: Mesh, make_trainer: TrainerFactory, report: Reporter,
                 before_step: Sequence[BeforeStep] = (), steerable: bool = True) -> None:
        """`before_step`: hooks of this peer's own (a cluster bridge's) after the control
        word of every step (see pynode.run.loop). `steerable`: a person can steer the runs
        this peer leads (a page can; `join` has no controls, so a paused run it takes over
        goes on rather than wait for a resume nobody can give)."""
        self.id = mesh.self_id
        self.steerable = steerable
        self.router = MeshRouter(mesh)
        self.chan = self.router.channel(TAG)
        self.coll_chan = self.router.channel(webrtc.TAG)
        self.make_trainer = make_trainer
        self.report = report
        self.before_step = tuple(before_step)
        self.hellos: dict[str, dict[str, Any]] = {}  # peer -> its last hello
        self.run: Run | None = None
        self.last_trainer: Trainer | None = None  # of the run that ended last (checkpoints)
        self._pending: tuple[str, str, float] | None = None  # see `pending`
        self.answers: dict[str, dict[str, str]] = {}  # run -> peer -> "accept"/"refuse"
        self.task: asyncio.Task | None = None
        self.benching = False
        # The leader's steering (pynode.run.schedule): a change asked for, applied at the
        # next step boundary on every peer, and whether the run waits between steps.
        self.requested: dict[str, Any] | None = None
        self.paused = False
        self.stopping = False
        self.left: str | None = None  # why the host removed or declined this peer (`leave`)
        self.finished: set[str] = set()  # runs this peer trained to their last step
        self.departed: set[str] = set()  # peers that said they leave (`bye`), not lost
        self.leaving = False  # this peer said `bye`: no `hello` after it (it would undo it)
        # Failover: survivors' reports to this peer as the next leader (run -> peer -> report)
        # and the answer of the member this peer reported to (run -> (peer, message)).
        self.survivors: dict[str, dict[str, dict[str, Any]]] = {}
        self.takeovers: dict[str, tuple[str, dict[str, Any]]] = {}

    # ----------------------------------------------------------------- messages
    async def serve(self) -> None:
        """Handle run messages forever (start it as a task)."""
        self.router.start()
        while True:
            peer, data = await self.chan.recv()
            try:
                if data is None:
                    self.hellos.pop(peer, None)
                    self.report_peers()
                elif not data:  # a new link: say who this peer is (unless it is leaving)
                    if not self.leaving:
                        self.send(peer, "hello", **self.hello())
                        self.maybe_join()
                else:
                    head, blob = decode(memoryview(data)[len(TAG):])
                    await self.handle(peer, head, blob)
            except (MessageError, ValueError, KeyError, TypeError) as exc:
                log.warning("room: bad message from %s: %s", peer, exc)
            except DaisyError as exc:
                self.report("failed", {"error": f"{type(exc).__name__}: {exc}"})

    def send(self, peer: str, kind: str, blob: bytes = b"", **fields: Any) -> None:
        self.chan.send(peer, TAG + encode(kind, blob, **fields))

    def hello(self) -> dict[str, Any]:
        run = self.run
        info = None if run is None else {"id": run.id, "leader": run.leader,
                                         "step": run.trainer.state.step, "steps": run.cfg.steps}
        state = "training" if run else "joining" if self.joining() else "ready"
        return {"state": state, "run": info}

    @property
    def pending(self) -> tuple[str, str, float] | None:
        """(run, leader, until): a proposal this peer accepted (until: when it gives up on
        its `go`) or a run it asked to join (until: inf)."""
        return self._pending

    @pending.setter
    def pending(self, value: tuple[str, str, float] | None) -> None:
        was = self.joining()
        self._pending = value
        now = self.joining()
        if now != was:  # its page says what it waits for; others do not count it as ready
            self.report("joining", {"run": now and now[0], "leader": now and now[1]})
            self.announce()

    def joining(self) -> tuple[str, str] | None:
        """(run, leader) of the run this peer asked to join and waits to be admitted to."""
        pending = self.pending
        return pending[:2] if pending is not None and pending[2] == float("inf") else None

    def check_free(self) -> None:
        """RoomError unless this peer can start a run now."""
        self.check_in_room()
        joining = self.joining()
        if self.run is None and joining is not None:
            raise RoomError(f"this peer waits to join the run of {joining[1]}: it is admitted "
                            "at that run's next step (not while its leader has it paused)")
        if self.run is not None or self.pending is not None or self.benching:
            raise RoomError("this peer is already in a run")

    def report_peers(self) -> None:
        """Which peers' Python said hello, and in what state: who a run can be started with."""
        self.report("peers", {p: h.get("state") for p, h in sorted(self.hellos.items())})

    def announce(self) -> None:
        if self.leaving:
            return
        for peer in self.chan.peers:
            self.send(peer, "hello", **self.hello())

    def say_goodbye(self) -> None:
        """Tell every peer this one leaves on purpose (before its links close), once."""
        if self.leaving:
            return
        self.leaving = True
        for peer in self.chan.peers:
            self.chan.send(peer, goodbye())

    async def handle(self, peer: str, head: dict[str, Any], blob: bytes) -> None:
        kind, run_id = head["t"], head.get("run")
        if self.left is not None:  # out of the room for good: no run, no proposal, no sync
            return
        if kind == "bye":
            self.departed.add(peer)
        elif kind == "hello":
            self.departed.discard(peer)
            self.hellos[peer] = head
            self.report_peers()
            self.maybe_join()
        elif kind == "propose":
            self.on_propose(peer, run_id, head)
        elif kind in ("accept", "refuse"):
            self.answers.get(run_id, {}).setdefault(peer, kind)
        elif kind == "go" and self.pending and self.pending[:2] == (run_id, peer):
            self.pending = None
            coll = await webrtc.connect(self.coll_chan, head["ranks"], group=head["group"])
            if "bench" in head:
                size, repeats = int(head["bench"]["size"]), int(head["bench"]["repeats"])
                self.task = asyncio.ensure_future(self.run_bench(coll, size, repeats))
                return
            try:
                cfg = RunConfig.from_dict(head["config"])
                trainer = self.make_trainer(cfg, coll, None)
            except DaisyError as exc:  # refused here (its memory, its data), as a sync is
                await coll.close()  # the others drop us at once instead of at their deadline
                self.report("failed", {"error": f"could not take part in the run: "
                                                f"{type(exc).__name__}: {exc}"})
                return
            self.launch(Run(run_id, peer, cfg, trainer, coll))
        elif kind == "cancel" and self.pending and self.pending[:2] == (run_id, peer):
            self.pending = None
        elif kind == "join" and self.run and self.run.leader == self.id and run_id == self.run.id:
            self.run.joins[peer] = set(head.get("open", []))
        elif kind == "sync" and self.run is None and self.pending and self.pending[1] == peer:
            self.pending = None
            await self.on_sync(peer, head, blob)
        elif kind == "survivor":
            self.on_survivor(peer, head)
        elif kind in ("takeover", "decline") and self.run and self.run.id == run_id:
            self.takeovers[run_id] = (peer, head)

    # ----------------------------------------------------------------- starting
    async def start(self, config: dict[str, Any]) -> list[str]:
        """Lead a run of `config` with every ready idle peer; returns the ranks (peer ids).

        ConfigError for a config that cannot be trained, RoomError while a run is going.
        """
        cfg = RunConfig.from_dict(config)
        check_task(cfg)
        run_id, ranks, coll = await self.gather({"config": json.loads(cfg.to_json())})
        self.launch(Run(run_id, self.id, cfg, self.make_trainer(cfg, coll, None), coll))
        return ranks

    async def start_resumed(
        self, cfg: RunConfig, ckpt: checkpoint.CheckpointState, wait_s: float = RESUME_WAIT_S
    ) -> list[str]:
        """Lead a run continuing the validated checkpoint `ckpt`: start alone from it and
        admit every ready idle peer before the first step; each receives the checkpoint in
        its `sync`, validates it and checks its hash. Returns the ranks (peer ids)."""
        self.check_free()
        check_task(cfg)
        ready = {p for p, h in self.hellos.items()
                 if h.get("state") == "ready" and h.get("run") is None and p in self.chan.peers}
        coll = await webrtc.connect(self.coll_chan, [self.id], group=secrets.randbits(32))
        run = Run(secrets.token_hex(6), self.id, cfg, self.make_trainer(cfg, coll, ckpt), coll)
        self.run = run  # peers hear of the run in our hello and ask to join it
        self.announce()
        deadline = time.monotonic() + wait_s
        while not ready <= set(run.joins) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        self.run = None
        if self.left is not None:  # removed while it waited for its joiners
            await coll.close()
            self.check_in_room()
        self.launch(run)  # who asked in time joins at the first step, anyone later later
        return [self.id, *sorted(run.joins)]

    async def bench(self, size: int, repeats: int) -> dict[str, Any]:
        """Lead an all-reduce benchmark with every ready idle peer: `repeats` reductions of
        `size` int64 each; returns (and reports as "bench") the seconds of each."""
        if not (isinstance(size, int) and isinstance(repeats, int) and size > 0 and repeats > 0):
            raise ConfigError(f"bench needs positive integers, got size {size!r}, "
                              f"repeats {repeats!r}")
        _, _, coll = await self.gather({"bench": {"size": size, "repeats": repeats}})
        return await self.run_bench(coll, size, repeats)

    async def gather(self, plan: dict[str, Any]) -> tuple[str, list[str], webrtc.MeshCollective]:
        """Propose `plan` to every ready idle peer; ranks are this peer and those that accept."""
        self.check_free()
        run_id = secrets.token_hex(6)
        asked = sorted(p for p, h in self.hellos.items()
                       if h.get("state") == "ready" and h.get("run") is None
                       and p in self.chan.peers)
        self.answers[run_id] = {}
        for peer in asked:
            self.send(peer, "propose", run=run_id, **plan)
        loop = asyncio.get_running_loop()
        until = loop.time() + PROPOSE_WAIT_S
        self.pending = (run_id, self.id, until)
        try:
            while len(self.answers[run_id]) < len(asked) and loop.time() < until:
                await asyncio.sleep(0.02)
        finally:
            answers = self.answers.pop(run_id)
            self.pending = None
        ranks = [self.id, *sorted(p for p, a in answers.items() if a == "accept")]
        if self.left is not None:  # removed while it waited: those that accepted are let go
            for peer in ranks[1:]:
                self.send(peer, "cancel", run=run_id)
            self.check_in_room()
        group = secrets.randbits(32)
        for peer in ranks[1:]:
            self.send(peer, "go", run=run_id, ranks=ranks, group=group, **plan)
        return run_id, ranks, await webrtc.connect(self.coll_chan, ranks, group=group)

    async def run_bench(self, coll: webrtc.MeshCollective, size: int, repeats: int) -> dict:
        self.benching = True
        try:
            x = np.full(size, coll.rank + 1, np.int64)  # (size,) int64
            await coll.barrier(timeout=BENCH_TIMEOUT_S)
            seconds, exact = [], True
            for _ in range(repeats):
                started = time.perf_counter()
                result = await coll.allreduce_int64(x, timeout=BENCH_TIMEOUT_S)
                seconds.append(time.perf_counter() - started)
                want = sum(r + 1 for r in result.contributors)
                exact = exact and bool(np.all(result.total == want))
            report = {"size": size, "members": len(coll.members), "seconds": seconds,
                      "bytes_sent": coll.bytes_sent, "exact": exact}
            self.report("bench", report)
            return report
        finally:
            await coll.close()
            self.benching = False

    def on_propose(self, leader: str, run_id: str, head: dict[str, Any]) -> None:
        now = asyncio.get_running_loop().time()
        if self.pending is not None and self.pending[2] < now:
            self.pending = None
        reason = ""
        try:
            if "bench" not in head:
                check_task(RunConfig.from_dict(head["config"]))
        except (ConfigError, DaisyError, TypeError) as exc:
            reason = f"cannot train this config: {exc}"
        if self.run is not None or self.pending is not None or self.benching:
            reason = "busy in another run"
        if reason:
            self.send(leader, "refuse", run=run_id, reason=reason)
            return
        self.pending = (run_id, leader, now + PENDING_S)
        self.send(leader, "accept", run=run_id)

    # ----------------------------------------------------------------- late joiners
    def maybe_join(self) -> None:
        """Ask the leader of a run we are not in to admit us (again, as channels open)."""
        if self.run is not None or self.left is not None:
            return
        now = asyncio.get_running_loop().time()
        if self.pending is not None and now <= self.pending[2] != float("inf"):
            return  # accepted a proposal (or proposing): wait for that
        for peer, hello in self.hellos.items():
            run = hello.get("run")
            # a leader's hello from before the end of a run this peer finished with it
            # (its last one, saying so, may come after another member's)
            if run and run.get("leader") == peer and peer in self.chan.peers \
                    and run.get("id") not in self.finished:
                self.pending = (run["id"], peer, float("inf"))
                self.send(peer, "join", run=run["id"], open=sorted(self.chan.peers))
                return
        self.pending = None

    def admit_joiners(self, run: Run) -> list[str]:
        """Leader, between steps: admit every joiner that reaches all members."""
        admitted = []
        for peer, reach in list(run.joins.items()):
            if peer in run.coll.ranks:  # a member once (lost, or it refused the run): its id
                del run.joins[peer]     # cannot take a second rank ("already has a rank"
                log.info("room: %s asked to join the run it left; not admitted", peer)
                continue                # stopped the leader)
            others = set(run.coll.member_ids()) - {self.id}
            if peer in self.chan.peers and others <= reach:
                run.coll.admit(peer)
                admitted.append(peer)
                del run.joins[peer]
        return admitted

    def send_sync(self, run: Run, peer: str) -> None:
        trainer = run.trainer
        self.chan.send(peer, TAG + start_message(
            "sync", run.cfg, trainer.state_bytes(), run=run.id, ranks=list(run.coll.ranks),
            members=list(run.coll.members), seq=run.coll.seq, group=run.coll.group,
            hash=trainer.state.hash(), capacities=trainer.capacities,
            distrusted=sorted(trainer.distrusted), curve=run.curve))

    async def on_sync(self, leader: str, head: dict[str, Any], blob: bytes) -> None:
        coll = await webrtc.connect(self.coll_chan, head["ranks"], group=head["group"],
                                    members=head["members"], seq=head["seq"])
        try:
            if not blob:
                raise checkpoint.CheckpointError("the sync carries no state")
            _, cfg, ckpt = read_start(head=head, blob=blob)
            trainer = self.make_trainer(cfg, coll, ckpt)
        except DaisyError as exc:
            await coll.close()  # the others drop us at once instead of at their deadline
            self.report("failed", {"error": f"could not sync with the run: {exc}"})
            return
        trainer.adopt_capacities(head["capacities"])
        # ranks the group's cross-check left out plan no microbatches here either
        trainer.distrusted = set(head.get("distrusted", ()))
        self.launch(Run(head["run"], leader, cfg, trainer, coll,
                        curve=read_curve(head.get("curve"))), joined=True)

    def checkpoint(self) -> bytes:
        """The .pt bytes of the running (or last finished) run's state, at a step boundary."""
        trainer = self.run.trainer if self.run is not None else self.last_trainer
        if trainer is None:
            raise RoomError("no run has started on this peer yet: no state to save or to "
                            "generate from")
        return trainer.state_bytes()

    def leave(self, reason: str) -> None:
        """The host removed or declined this peer: it is out of the room for good. The run
        it is in stops where it stands (the state stays, for a checkpoint), whatever its
        links do next (closing them would leave it a group of one that trains on), and it
        starts, joins and answers nothing from then on. A run waiting on its group is
        cancelled; one that a cancel misses (Python 3.11's wait_for can swallow one) stops
        at its next step or failover (check_in_room)."""
        self.left = reason
        self.pending = None
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def check_in_room(self) -> None:
        """LeftRoom once this peer left the room (`leave`)."""
        if self.left is not None:
            raise LeftRoom(self.left)

    # ----------------------------------------------------------------- training
    def launch(self, run: Run, joined: bool = False) -> None:
        self.run = run
        run.keep()  # a fresh start (same seed), a verified checkpoint or sync
        run.trainer.after_inner.append(lambda replica, step: self.report(  # --sync-every
            "inner", {"run": run.id, "replica": replica, "step": step}))
        self.report("run", {"run": run.id, "leader": run.leader, "ranks": list(run.coll.ranks),
                            "config": json.loads(run.cfg.to_json()),
                            "joined_at": run.trainer.state.step if joined else None,
                            # admitted at the first step (a resumed start), not ranks yet
                            "joining": sorted(run.joins),
                            # the state it goes on from: a page keeps the steps it had
                            # only where they led to this state (a resume of its own run)
                            "step": run.trainer.state.step, "hash": run.trainer.state.hash(),
                            # the run's loss before this peer joined it, for its chart
                            "curve": list(run.curve),
                            # its changes so far: a resumed checkpoint's, or a sync's
                            "schedule": list(run.trainer.schedule)})
        self.announce()
        self.task = asyncio.ensure_future(self.train(run, skip_control=joined))

    async def train(self, run: Run, skip_control: bool = False) -> None:
        """Every member: the one loop, with the leader's control broadcast before each step
        (a joiner synced between steps skips its first: the others had it already). A lost
        leader is replaced (fail_over) and the loop goes on from the boundary agreed on."""
        trainer = run.trainer
        before = set(run.coll.member_ids())

        async def control(_: Trainer) -> None:
            nonlocal skip_control
            self.check_in_room()
            if not skip_control:
                await self.control(run)
            skip_control = False

        def report_step(result: StepResult) -> None:
            nonlocal before
            before = self.report_step(run, result, before)
            run.keep()  # check_agreement passed: every member holds this state

        rejoin = False
        try:
            while True:
                try:
                    await train(trainer, before_step=(control, *self.before_step),
                                on_step=(report_step,))
                    break
                except PeerLost as exc:
                    self.check_in_room()  # its links closed as it left: no group of one
                    if not await self.fail_over(run, exc):
                        raise
                    skip_control, before = False, set(run.coll.member_ids())
            self.finished.add(run.id)
            self.report("done", {"step": trainer.state.step, "hash": trainer.state.hash()})
        except (LeftRoom, asyncio.CancelledError):
            if self.left is None:  # a cancel of its own: not this peer leaving the room
                raise
            # a step under way when it left is not one the group agreed on: not kept
            kept = run.agreed[-1]
            if trainer.state.step != kept.step:
                trainer.rewind(kept.state, kept.cfg, kept.schedule)
            self.report("event", {"level": "warn", "text": f"stopped training at step "
                                  f"{trainer.state.step}: {self.left}"})
        except ForkError as exc:
            self.report("failed", {"error": f"fork detected: {exc}"})
        except PeerLost as exc:
            who = "the leader" if 0 in exc.ranks else "the group"
            self.report("failed", {"error": f"lost {who}: {exc}"})
        except LeftRun as exc:
            self.report("event", {"level": "warn", "text": str(exc)})
            rejoin = True
        except DaisyError as exc:
            self.report("failed", {"error": f"{type(exc).__name__}: {exc}"})
        finally:
            await run.coll.close()
            self.last_trainer = trainer
            self.run = None
            self.announce()
        if rejoin:
            self.maybe_join()

    def report_step(self, run: Run, result: StepResult, before: set[str]) -> set[str]:
        now = set(run.coll.member_ids())
        for peer in sorted(before - now):
            level, gone = (("info", f"peer {peer} left") if peer in self.departed
                           else ("warn", f"lost peer {peer}"))
            self.report("event", {"level": level, "text": f"{gone} at step {result.step}; its "
                                  "microbatches were re-planned"})
        run.record(result.step, result.loss, result.heldout)
        trainer, cfg = run.trainer, run.cfg
        mine = len(result.plan.get(trainer.rank(), [])) // trainer.options.share[1]
        self.report("step", {"step": result.step, "loss": result.loss, "hash": result.hash,
                             "probe": result.probe, "members": sorted(now),
                             "seconds": result.seconds, "heldout": result.heldout,
                             "plan": result.plan,
                             # this peer's part of the step, for the dashboards
                             "microbatch_seconds": trainer.microbatch_seconds,
                             "share": mine / cfg.microbatches,
                             "tokens_per_s": mine * cfg.microbatch_size * cfg.seq
                             * result.inner / max(result.seconds, 1e-9),
                             "inner": result.inner,
                             "bytes_sent": run.coll.bytes_sent, "change": result.change})
        return now


def check_task(cfg: RunConfig) -> None:
    """ConfigError unless this peer can build the task of `cfg` (e.g. torch's in a page)."""
    from pynode.tasks import load_task

    try:
        load_task(cfg.task)
    except DaisyError as exc:
        raise ConfigError(f"task {cfg.task!r}: {exc}") from exc
