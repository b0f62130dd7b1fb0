"""A room peer's part when its run loses the leader: who leads next, and the rewind.

RoomPeer (pynode.run.protocol) takes these methods from `Takeover`. The decisions are
pure functions in pynode.run.failover; here are the messages around them. After losing
the leader, each survivor reports what it holds (`survivor`) to the next member in rank
order it still reaches and waits for its answer; that member gathers the reports, picks
the boundary to continue from and tells each survivor (`takeover`), or says who leads
now (`decline`). Everyone rewinds to that boundary in the new group and trains on.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pynode.comm import webrtc
from pynode.comm.base import PeerLost
from pynode.run import failover
from pynode.run.errors import LeftRun

if TYPE_CHECKING:
    from pynode.comm.mesh import MeshChannel
    from pynode.run.room import Reporter, Run


class Takeover:
    """RoomPeer's failover. Uses RoomPeer's id, channels, hellos, run, steering fields,
    report, send and announce; keeps the failover's own messages in `survivors` (run ->
    peer -> report, while this peer may lead next) and `takeovers` (run -> (peer, answer)
    of the member this peer reported to)."""

    id: str
    chan: MeshChannel
    coll_chan: MeshChannel
    hellos: dict[str, dict[str, Any]]
    run: Run | None
    requested: dict[str, Any] | None
    paused: bool
    stopping: bool
    steerable: bool
    report: Reporter
    survivors: dict[str, dict[str, dict[str, Any]]]
    takeovers: dict[str, tuple[str, dict[str, Any]]]
    departed: set[str]

    async def fail_over(self, run: Run, lost: PeerLost) -> bool:
        """After `lost`: if it lost the leader, find the member that leads now (the next in
        rank order that answers, or this peer) and rewind to where it continues. False when
        this is no failover (the leader lost others, or a trainer behind a cluster bridge,
        whose ranks could not rewind with it); LeftRun when the run went on without us."""
        coll = run.coll
        if run.leader == self.id or 0 not in lost.ranks or run.trainer.collective is not coll:
            return False
        gone, step = run.leader, run.trainer.state.step
        order = [coll.ranks[r] for r in sorted(coll.members) if r != 0]
        await coll.close()
        what = (f"the leader {gone} left after step" if gone in self.departed
                else f"lost the leader {gone} after step")
        self.report("event", {"level": "warn", "text": f"{what} {step}: failing over"})
        tried: set[str] = set()
        while True:
            leader = failover.next_leader(order, self.id, self.chan.peers, tried)
            if leader == self.id:
                await self.take_over(run, gone, order)
                return True
            self.takeovers.pop(run.id, None)
            self.send(leader, "survivor", run=run.id, lost=gone,
                      **failover.report_of(run.agreed, run.words))
            answer = await self.answer_of(run, leader)
            if answer is not None and answer["t"] == "takeover":
                await self.follow(run, leader, answer, gone, order)
                return True
            if answer is not None and answer.get("leader"):
                raise LeftRun(f"the run goes on under {answer['leader']} without this peer: "
                              "asking to join it again")
            tried.add(leader)  # gone, silent or not in the run: the next one

    async def answer_of(self, run: Run, peer: str) -> dict[str, Any] | None:
        """`peer`'s takeover or decline; None if it vanished or said nothing in time."""
        until = time.monotonic() + run.trainer.deadline()
        while time.monotonic() < until and peer in self.chan.peers:
            answer = self.takeovers.get(run.id)
            if answer is not None and answer[0] == peer:
                del self.takeovers[run.id]
                return answer[1]
            await asyncio.sleep(0.02)
        return None

    def on_survivor(self, peer: str, head: dict[str, Any]) -> None:
        """A survivor's report: kept while this peer may still take over (it has not seen
        the loss yet, or is gathering reports), else declined with who leads now."""
        run = self.run
        if run is not None and run.id == head["run"] and run.leader == head["lost"]:
            self.survivors.setdefault(run.id, {})[peer] = head
            return
        leader = run.leader if run is not None and run.id == head["run"] else None
        self.send(peer, "decline", run=head["run"], leader=leader)

    async def take_over(self, run: Run, gone: str, order: list[str]) -> None:
        """Lead the run from here: wait for the survivors' reports (each one that this peer
        still reaches, at most a step deadline), decide where to continue, tell them."""
        def awaited(peer: str) -> bool:  # reachable, and its hello still says it is in
            said = self.hellos.get(peer, {}).get("run") or {}
            return peer in self.chan.peers and said.get("id") == run.id

        expected = {p for p in order if p != self.id}
        until = time.monotonic() + run.trainer.deadline()
        while time.monotonic() < until:
            reports = self.survivors.get(run.id, {})
            if not {p for p in expected if awaited(p)} - set(reports):
                break
            await asyncio.sleep(0.02)
        reports = {p: r for p, r in self.survivors.pop(run.id, {}).items() if r["lost"] == gone}
        plan = failover.plan_takeover(
            self.id, failover.report_of(run.agreed, run.words), reports, order)
        old, trainer = run.coll.ranks, run.trainer
        capacities = failover.remap(trainer.capacities, old, plan.ranks)
        distrusted = sorted(failover.remap({r: 0 for r in trainer.distrusted}, old, plan.ranks))
        group = secrets.randbits(32)
        run.leader = self.id
        self.announce()  # those left out find the run's new leader in our hello
        for peer in plan.ranks[1:]:
            self.send(peer, "takeover", run=run.id, ranks=plan.ranks, group=group,
                      step=plan.step, hash=plan.hash, capacities=capacities,
                      distrusted=distrusted, left_out=plan.left_out)
        for peer in plan.left_out:
            self.send(peer, "decline", run=run.id, leader=self.id)
        coll = await webrtc.connect(self.coll_chan, plan.ranks, group=group)
        self.requested, self.stopping = plan.change, False
        self.paused = plan.pause and self.steerable
        if plan.pause and not self.steerable:
            self.report("event", {"level": "warn", "text": "the leader that left had paused "
                                  "the run; this peer leads it now and has no controls to "
                                  "resume it, so the run goes on"})
        self.rewind(run, plan.step, coll, capacities, distrusted, gone)
        self.say_missing(order, plan.ranks, plan.left_out, gone, plan.step)

    def say_missing(self, order: Sequence[str], ranks: Sequence[str], left_out: Sequence[str],
                    gone: str, step: int) -> None:
        """Members of the run before the failover (`order`) that are not in the group going
        on from `step` (`ranks`), and not left out to join it again: lost with the leader
        (or left with it, having said so). Said once each; the leader's loss said it alone."""
        for peer in order:
            if peer in ranks or peer in left_out:
                continue
            left = peer in self.departed
            self.report("event", {"level": "info" if left else "warn", "text":
                                  f"{'peer ' + peer + ' left' if left else 'lost peer ' + peer}"
                                  f" with the leader {gone}: the run goes on after step {step} "
                                  "without it"})

    async def follow(self, run: Run, leader: str, head: dict[str, Any], gone: str,
                     order: Sequence[str]) -> None:
        """The new leader's takeover: rewind to its step and go on in its group."""
        step = int(head["step"])
        if not any(a.step == step and a.hash == head["hash"] for a in run.agreed):
            raise LeftRun(f"{leader} took over from step {step}, whose state this peer does "
                          "not hold: asking to join the run again")
        coll = await webrtc.connect(self.coll_chan, head["ranks"], group=head["group"])
        run.leader = leader
        for peer in self.survivors.pop(run.id, {}):  # reported here: the run is `leader`'s
            self.send(peer, "decline", run=run.id, leader=leader)
        self.rewind(run, step, coll, {int(r): c for r, c in head["capacities"].items()},
                    head["distrusted"], gone)
        self.announce()
        self.say_missing(order, head["ranks"], head.get("left_out") or [], gone, step)

    def rewind(self, run: Run, step: int, coll: webrtc.MeshCollective,
               capacities: dict[int, float], distrusted: Sequence[int], gone: str) -> None:
        """Continue `run` from its agreed boundary `step` in the group of `coll`."""
        agreed = next(a for a in run.agreed if a.step == step)
        trainer = run.trainer
        trainer.rewind(agreed.state, agreed.cfg, agreed.schedule)
        trainer.collective = coll
        trainer.adopt_capacities(capacities)
        trainer.distrusted = set(distrusted)
        run.coll, run.cfg, run.joins = coll, trainer.cfg, {}
        run.agreed = [a for a in run.agreed if a.step <= step]
        run.words = [w for w in run.words if w[0] < step]
        run.curve = [c for c in run.curve if c[0] <= step]  # the steps past it come again
        # the config and changes it goes on under: those after `step` are taken back
        self.report("leader", {"leader": run.leader, "lost": gone, "step": step,
                               "ranks": list(coll.ranks),
                               "config": json.loads(trainer.cfg.to_json()),
                               "schedule": list(trainer.schedule)})
