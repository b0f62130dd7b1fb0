"""pynode.run.protocol over the in-process MemoryNetwork with real trainers, as the page runs it.

Hashes are compared with a single trainer of the same config: the room must not change a bit,
whoever starts, whoever joins late and whoever vanishes.
"""

from __future__ import annotations

import asyncio

import pytest

from pynode.browser import Checks
from pynode.comm.mesh import MemoryNetwork, Mesh
from pynode.config import ConfigError
from pynode.run.protocol import RoomError, RoomPeer

CONFIG = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
          "microbatches": 4, "steps": 4, "lr": 0.003, "seed": 5}


@pytest.fixture(scope="module")
def reference(checks) -> list[str]:
    """Per-step hashes of one trainer alone, for CONFIG with `steps` up to 8."""
    from pynode.config import RunConfig

    trainer = checks.make_trainer(RunConfig.from_dict({**CONFIG, "steps": 8}), None, None)

    async def steps():
        return [(await trainer.step()).hash for _ in range(8)]

    return asyncio.run(steps())


class Page:
    """A RoomPeer plus what it reported, like one browser tab."""

    def __init__(self, net: MemoryNetwork, peer_id: str, checks: Checks,
                 mesh: Mesh | None = None, before_step=(), steerable: bool = True) -> None:
        self.reports: list[tuple[str, dict]] = []
        self.peer = RoomPeer(mesh or net.join(peer_id), checks.make_trainer, self.record,
                             before_step, steerable=steerable)
        self.task = asyncio.ensure_future(self.peer.serve())
        self.finished = asyncio.Event()

    def record(self, kind: str, fields: dict) -> None:
        self.reports.append((kind, fields))
        if kind in ("done", "failed"):
            self.finished.set()

    def hashes(self) -> dict[int, str]:
        return {f["step"]: f["hash"] for k, f in self.reports if k == "step"}

    def kinds(self, kind: str) -> list[dict]:
        return [f for k, f in self.reports if k == kind]


async def settle(pages: list[Page], timeout: float = 60) -> None:
    await asyncio.wait_for(asyncio.gather(*(p.finished.wait() for p in pages)), timeout)


async def wait_for_step(page: Page, step: int) -> None:
    while max(page.hashes(), default=0) < step:
        await asyncio.sleep(0.01)


async def room_run(checks, count: int, steps: int, net: MemoryNetwork | None = None
                   ) -> list[Page]:
    """`count` pages in one in-memory room (`net`, or a new one), the first leading a run
    of CONFIG for `steps`."""
    net = net or MemoryNetwork()
    pages = [Page(net, f"tab{i}", checks) for i in range(count)]
    await asyncio.sleep(0.05)
    await pages[0].peer.start({**CONFIG, "steps": steps})
    return pages


async def room_with_odd_peer(checks, count: int, make_trainer, config: dict) -> tuple[
        MemoryNetwork, list[Page]]:
    """`count` pages in one in-memory room, the last one's trainers made by `make_trainer`
    (a broken or slow peer); the first leads a run of `config`."""
    net = MemoryNetwork()
    pages = [Page(net, f"tab{i}", checks) for i in range(count)]
    pages[-1].peer.make_trainer = make_trainer
    await asyncio.sleep(0.05)
    await pages[0].peer.start(config)
    return net, pages


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


async def steps_of(trainer, count: int) -> list[str]:
    return [(await trainer.step()).hash for _ in range(count)]


async def pause_and_lose_the_leader(net: MemoryNetwork, pages: list[Page]) -> None:
    """tab0 starts a 6-step run, pauses it with a new lr after step 2 and vanishes once the
    others heard that word."""
    await asyncio.sleep(0.05)
    await pages[0].peer.start({**CONFIG, "steps": 6})
    await wait_for_step(pages[1], 2)
    pages[0].peer.steer(pause=True, lr=0.001)
    while not all(p.kinds("control") for p in pages[1:]):
        await asyncio.sleep(0.01)
    net.cut("tab0")


async def replayed(checks: Checks, steps: int, schedule: list[dict]) -> dict[int, str]:
    """Per-step hashes of one trainer alone running CONFIG for `steps` steps while it replays
    `schedule` (what `train --schedule` does)."""
    from pynode.config import RunConfig
    from pynode.run.loop import train
    from pynode.run.schedule import change_from_dict, replay

    alone = checks.make_trainer(RunConfig.from_dict({**CONFIG, "steps": steps}), None, None)
    got: dict[int, str] = {}
    await train(alone, before_step=(replay([change_from_dict(c) for c in schedule]),),
                on_step=(lambda r: got.__setitem__(r.step, r.hash),))
    return got


def test_three_peers_train_the_reference_hashes(checks, reference):
    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(3)]
        await asyncio.sleep(0.05)  # hellos
        ranks = await pages[1].peer.start(CONFIG)
        assert ranks[0] == "tab1" and sorted(ranks) == ["tab0", "tab1", "tab2"]
        await settle(pages)
        for page in pages:
            assert page.hashes() == {s + 1: h for s, h in enumerate(reference[:4])}
            assert page.kinds("done")[0]["hash"] == reference[3]
            assert page.kinds("run")[0]["leader"] == "tab1"
    run(body())


def test_a_peer_whose_first_microbatch_was_slow_keeps_its_share(checks, reference):
    """A peer's first microbatch may take seconds (numba compiling on a fresh install). It
    was its measured speed from then on: planned no microbatch, it measured nothing again
    and idled for the rest of the run (a user trial, a native peer among two tabs). Now the
    warm-up is not a speed (pynode/run/speed.py): the peer computes in the later steps."""
    import time

    computed: dict[int, int] = {}

    def stalls_once(cfg, coll, resume):
        trainer = checks.make_trainer(cfg, coll, resume)
        first = trainer.contribution
        calls = []

        def contribution(index):
            calls.append(index)
            if len(calls) == 1:
                time.sleep(0.5)
            return first(index)

        trainer.contribution = contribution
        trainer.before_compute.append(lambda step, mine: computed.__setitem__(step, len(mine)))
        return trainer

    async def body():
        _, pages = await room_with_odd_peer(checks, 3, stalls_once, {**CONFIG, "steps": 8})
        await settle(pages)
        for page in pages:
            assert page.hashes() == {s + 1: h for s, h in enumerate(reference)}

    run(body())
    assert computed[1] == 1, computed  # 4 microbatches over 3: its one was the slow one
    assert sum(computed[s] for s in range(3, 9)) >= 3, computed


def test_a_resumed_start_says_who_joins_at_its_first_step(checks, reference):
    """A leader resuming a checkpoint starts alone and admits the ready peers at its first
    step: its run report names them (`join` printed "1 peer(s)", then "leading the run with
    2 peer(s)", a user trial), and says the state it goes on from, which a page uses to
    keep its earlier steps only where this run continues them."""
    from pynode.config import RunConfig
    from pynode.core import checkpoint

    alone = checks.make_trainer(RunConfig.from_dict({**CONFIG, "steps": 6}), None, None)
    run(steps_of(alone, 2))
    saved = checkpoint.load_checkpoint(alone.state_bytes())

    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(2)]
        await asyncio.sleep(0.05)
        cfg = RunConfig.from_dict({**CONFIG, "steps": 6})
        ranks = await pages[0].peer.start_resumed(cfg, saved, 10)
        assert ranks == ["tab0", "tab1"]
        await settle(pages)
        return pages

    pages = run(body())
    started = pages[0].kinds("run")[0]
    assert started["ranks"] == ["tab0"] and started["joining"] == ["tab1"]
    assert (started["step"], started["hash"]) == (2, reference[1])
    joined = pages[1].kinds("run")[0]
    assert (joined["step"], joined["hash"]) == (2, reference[1])
    for page in pages:
        assert page.hashes() == {s + 1: reference[s] for s in range(2, 6)}

    async def fresh_start():
        pages = await room_run(checks, 1, 2)
        await settle(pages)
        return pages[0].kinds("run")[0]

    fresh = run(fresh_start())
    initial = checks.make_trainer(RunConfig.from_dict({**CONFIG, "steps": 2}), None, None)
    assert (fresh["step"], fresh["joining"]) == (0, [])
    assert fresh["hash"] == initial.state.hash()


def test_a_resumed_runs_report_carries_the_checkpoints_schedule(checks):
    """A checkpoint holds its run's changes (config["schedule"]), and the trainer resumed
    from it has them, but the run report a page shows the run from had none: a resumed
    run's page listed no change and its Download schedule saved []. The leader's report
    and the joiner's (synced from the leader's state) carry them."""
    from pynode.config import RunConfig
    from pynode.run.assemble import read_resume
    from pynode.run.schedule import Change

    alone = checks.make_trainer(RunConfig.from_dict({**CONFIG, "steps": 6}), None, None)
    run(steps_of(alone, 1))
    alone.apply_change(Change(step=1, lr=0.001))
    run(steps_of(alone, 1))
    cfg, saved = read_resume(alone.state_bytes(), {})  # as the page's resume reads it
    assert saved.config["schedule"] == [{"step": 1, "lr": 0.001}]

    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(2)]
        await asyncio.sleep(0.05)
        await pages[0].peer.start_resumed(cfg, saved, 10)
        await settle(pages)
        return pages

    pages = run(body())
    for page in pages:
        assert page.kinds("run")[0]["schedule"] == [{"step": 1, "lr": 0.001}], page.reports
        assert not page.kinds("failed"), page.kinds("failed")


def test_a_peer_that_refuses_the_run_it_accepted_leaves_at_once(checks, reference):
    """A peer whose trainer refuses the run after it accepted (its memory, its data) kept
    its link to the run's collective: the others waited for it until their deadline (30 s)
    before they re-planned its microbatches. It closes the link, as a failed sync does."""
    import time

    from pynode.run.assemble import MemoryRefusal

    def refuses(cfg, coll, resume):
        raise MemoryRefusal("this config needs about 9 MiB, only 1 MiB available here")

    async def body():
        started = time.monotonic()
        _, pages = await room_with_odd_peer(checks, 3, refuses, {**CONFIG, "steps": 4})
        await settle(pages)
        return pages, time.monotonic() - started

    pages, took = run(body())
    assert "MemoryRefusal: this config needs" in pages[2].kinds("failed")[0]["error"]
    for page in pages[:2]:
        assert page.hashes() == {s + 1: h for s, h in enumerate(reference[:4])}
    assert took < 20, took  # not the 30 s deadline


def test_a_late_joiner_is_synced_and_ends_on_the_same_hash(checks, reference):
    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(2)]
        await asyncio.sleep(0.05)
        await pages[0].peer.start({**CONFIG, "steps": 8})
        await wait_for_step(pages[0], 2)
        late = Page(net, "late", checks)
        await settle([*pages, late])
        joined = late.hashes()
        assert joined and min(joined) > 2, joined
        assert all(reference[s - 1] == h for s, h in joined.items())
        assert late.kinds("done")[0]["hash"] == reference[7]
        assert late.kinds("run")[0]["joined_at"] == min(joined) - 1
        # the run's loss before it joined, as the leader saw it (a page's chart starts there)
        at = min(joined) - 1
        before = [[f["step"], f["loss"], f["heldout"]] for f in pages[0].kinds("step")
                  if f["step"] <= at]
        assert late.kinds("run")[0]["curve"] == before and len(before) == at
        assert any("late joined" in e["text"] for e in pages[1].kinds("event"))
        assert set(pages[0].kinds("step")[-1]["members"]) == {"tab0", "tab1", "late"}
    run(body())


def test_a_vanished_member_costs_time_not_bits(checks, reference, caplog):
    """The loss is said once, by the room in its words ("lost peer tab2 at step S"): the
    transport's own "dropping rank(s) [2]" warning came beside it on a join's terminal."""
    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(3)]
        await asyncio.sleep(0.05)
        await pages[0].peer.start({**CONFIG, "steps": 6})
        await wait_for_step(pages[2], 2)
        net.cut("tab2")
        await settle(pages)
        for page in pages[:2]:
            assert page.hashes() == {s + 1: h for s, h in enumerate(reference[:6])}
            assert any("lost peer tab2" in e["text"] for e in page.kinds("event"))
        # Cut off from everyone, tab2 cannot tell that from everyone else vanishing: it
        # takes over alone and, alone, still trains the same bits.
        assert [f["ranks"] for f in pages[2].kinds("leader")] == [["tab2"]]
        assert set(pages[2].hashes().values()) == set(reference[:6])
    with caplog.at_level("WARNING", logger="pynode.comm"):
        run(body())
    assert "dropping rank" not in caplog.text


def test_a_peer_that_says_goodbye_left_it_was_not_lost(checks, reference):
    """A peer that leaves on purpose (Ctrl-C, a closed tab) says `bye` before its links
    close: the others say it left (an info line, not "lost peer"), and a leader's leave is
    a failover in those words; the bits are the same as after a loss."""
    async def body():
        net = MemoryNetwork()
        pages = await room_run(checks, 3, 8, net)
        await wait_for_step(pages[2], 2)
        pages[2].peer.say_goodbye()
        net.cut("tab2")
        await wait_for_step(pages[1], 4)
        pages[0].peer.say_goodbye()
        net.cut("tab0")
        await settle(pages[1:2])
        events = pages[1].kinds("event")
        left = [e for e in events if "tab2" in e["text"]]
        assert [e["level"] for e in left] == ["info"], events
        assert left[0]["text"].startswith("peer tab2 left at step ")
        assert any(e["text"].startswith("the leader tab0 left after step ") for e in events)
        assert not any("lost" in e["text"] for e in events), events
        assert pages[1].hashes() == {s + 1: h for s, h in enumerate(reference[:8])}
    run(body())


def test_a_peer_says_nothing_after_its_goodbye(checks):
    """Ctrl-C on a join peer: `bye` first, then its run ends, and a run's end announces the
    peer's state. That `hello` undid the `bye` on the others: a leader said "lost peer" of
    a peer that had left. After `bye`, a peer says no more `hello`."""
    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(2)]
        await asyncio.sleep(0.05)
        assert "tab1" in pages[0].peer.hellos
        pages[1].peer.say_goodbye()
        pages[1].peer.announce()  # as a run's end does
        await asyncio.sleep(0.1)
        assert "tab1" in pages[0].peer.departed
    run(body())


@pytest.mark.parametrize("links_first", [False, True])
def test_a_removed_member_stops_where_it_stands_and_the_others_go_on(checks, reference,
                                                                     links_first):
    """The host removes tab2 in the middle of a run: its links close as a cut's do, but it
    does not take over alone and train on (a page did, to "Finished"); it stops at the step
    it reached, starts nothing more, and the others end on the reference bits. Its links
    may close before the server's word reaches it: it took over alone meanwhile (steps of
    the same bits), and stops when the word comes."""
    async def slow(_trainer) -> None:
        # alone after its links closed, it ran to the run's end before the word came
        # (once in a CI run): a step of it takes longer than the test's look for the word
        await asyncio.sleep(0.05)

    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks, before_step=(slow,) if i == 2 else ())
                 for i in range(3)]
        await asyncio.sleep(0.05)
        await pages[0].peer.start({**CONFIG, "steps": 6})
        await wait_for_step(pages[2], 2)
        if links_first:
            net.cut("tab2")
            while not pages[2].kinds("leader"):
                await asyncio.sleep(0.01)
        pages[2].peer.leave("this page leaves the room: removed by the host")
        net.cut("tab2")
        await settle(pages[:2])
        await asyncio.sleep(0.2)  # a run going on alone would take a step meanwhile
        removed = pages[2]
        reached = max(removed.hashes())
        assert reached < 6 and removed.peer.run is None and removed.peer.task.done()
        assert bool(removed.kinds("leader")) == links_first and not removed.kinds("done")
        assert removed.kinds("event")[-1]["text"] == (
            f"stopped training at step {reached}: this page leaves the room: removed by "
            "the host")
        assert all(reference[s - 1] == h for s, h in removed.hashes().items())
        # its state still downloads: the last step the group agreed on
        assert removed.peer.last_trainer.state.hash() == reference[reached - 1]
        assert len(removed.peer.checkpoint()) > 1000
        with pytest.raises(RoomError, match="removed by the host"):
            await removed.peer.start(CONFIG)
        for page in pages[:2]:
            assert page.hashes() == {s + 1: h for s, h in enumerate(reference[:6])}
    run(body())


def test_a_finished_run_is_not_asked_to_join_again(checks, reference):
    """A member that finished a run may hear another member's last hello before the
    leader's: it then still held the leader's hello from the run's start, and asked to join
    the run it had just finished (the page said "asked tab0 to join its run")."""
    async def body():
        pages = await room_run(checks, 3, 3)
        await settle(pages)
        run_id = pages[1].kinds("run")[0]["run"]
        stale = {"t": "hello", "state": "training",
                 "run": {"id": run_id, "leader": "tab0", "step": 0, "steps": 3}}
        await pages[1].peer.handle("tab0", stale, b"")
        await pages[1].peer.handle("tab2", {"t": "hello", "state": "ready", "run": None}, b"")
        assert not [f for f in pages[1].kinds("joining") if f["run"]], pages[1].reports
        assert pages[1].peer.pending is None
        other = {**stale, "run": {**stale["run"], "id": "another"}}  # a run it was not in
        await pages[1].peer.handle("tab0", other, b"")
        assert pages[1].kinds("joining")[-1] == {"run": "another", "leader": "tab0"}
        for page in pages:
            assert page.hashes() == {s + 1: h for s, h in enumerate(reference[:3])}
    run(body())


def test_a_lost_leader_is_replaced_by_the_next_peer_and_no_bit_changes(checks, reference):
    """The leader vanishes after step 2: the next member in rank order leads, everyone
    continues from the step all agreed on, and a peer arriving later joins the new leader.
    Every peer ends on the hashes of one trainer alone."""
    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(3)]
        await asyncio.sleep(0.05)
        assert (await pages[0].peer.start({**CONFIG, "steps": 8}))[:2] == ["tab0", "tab1"]
        await wait_for_step(pages[1], 2)
        net.cut("tab0")
        while not pages[1].kinds("leader"):
            await asyncio.sleep(0.01)
        late = Page(net, "late", checks)
        await settle([*pages[1:], late])
        pages[0].peer.task.cancel()
        for page in pages[1:]:
            assert page.hashes() == {s + 1: h for s, h in enumerate(reference[:8])}
            assert page.kinds("done")[0]["hash"] == reference[7]
            (change,) = page.kinds("leader")
            assert change["leader"] == "tab1" and change["lost"] == "tab0"
            assert change["ranks"] == ["tab1", "tab2"] and change["step"] >= 2
            # the config it goes on under, as the page shows it (node.js takes it whole)
            assert change["config"] == page.kinds("run")[0]["config"]
            assert change["schedule"] == []
            assert not page.kinds("failed")
        joined = late.hashes()
        assert joined and all(reference[s - 1] == h for s, h in joined.items())
        assert late.kinds("run")[0]["leader"] == "tab1"
        assert late.kinds("done")[0]["hash"] == reference[7]
    run(body())


def test_a_member_lost_with_the_leader_is_named(checks, reference):
    """The leader and a member vanish together: the survivors said "lost the leader" and
    went on one peer short, the member's loss said nowhere (report_step compares members
    within one group). The new leader and its follower name it."""
    async def body():
        net = MemoryNetwork()
        pages = await room_run(checks, 4, 8, net)
        await wait_for_step(pages[1], 2)
        net.cut("tab0")
        net.cut("tab3")
        await settle(pages[1:3])
        for page in (pages[0], pages[3]):
            page.peer.task.cancel()
        for page in pages[1:3]:
            assert page.hashes() == {s + 1: h for s, h in enumerate(reference[:8])}
            (change,) = page.kinds("leader")
            named = [e["text"] for e in page.kinds("event") if "tab3" in e["text"]]
            assert named == [f"lost peer tab3 with the leader tab0: the run goes on after step "
                             f"{change['step']} without it"], page.kinds("event")
    run(body())


def test_the_new_leader_lost_too_is_replaced_by_the_next(checks, reference):
    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(4)]
        await asyncio.sleep(0.05)
        await pages[0].peer.start({**CONFIG, "steps": 8})
        await wait_for_step(pages[1], 2)
        net.cut("tab0")
        await wait_for_step(pages[2], max(pages[2].hashes()) + 2)
        net.cut("tab1")
        await settle(pages[2:])
        for page in pages[:2]:
            page.peer.task.cancel()
        for page in pages[2:]:
            assert page.hashes() == {s + 1: h for s, h in enumerate(reference[:8])}
            assert [(f["lost"], f["leader"]) for f in page.kinds("leader")] == [
                ("tab0", "tab1"), ("tab1", "tab2")]
            assert page.kinds("leader")[-1]["ranks"] == ["tab2", "tab3"]
    run(body())


class CutAtFirstCheckResult(Mesh):
    """The leader's end of the network, cut right after it sent the first result of step
    `step`'s hash check: one member passed that step's agreement, the others did not."""

    def __init__(self, net: MemoryNetwork, peer_id: str, step: int) -> None:
        self.net, self.end, self.self_id, self.step = net, net.join(peer_id), peer_id, step
        self.page: Page | None = None

    @property
    def peers(self) -> frozenset[str]:
        return self.end.peers

    def send(self, peer: str, data: bytes) -> None:
        from pynode.comm.webrtc import HEADER, TAG, Op
        from pynode.comm.wire import Kind

        self.end.send(peer, data)
        run = self.page.peer.run if self.page is not None else None
        if data[:1] == TAG and len(data) >= HEADER.size and run is not None:
            op, kind = HEADER.unpack_from(data)[2], HEADER.unpack_from(data)[7]
            if op == Op.RESULT and kind == Kind.ALLGATHER and run.trainer.state.step == self.step:
                self.net.cut(self.self_id)

    async def recv(self) -> tuple[str, bytes | None]:
        return await self.end.recv()


def test_survivors_that_disagree_on_the_last_step_rewind_to_the_one_all_hold(checks, reference):
    """The leader dies as it hands out step 2's hash check: tab1 passed step 2, tab2 did
    not. The new leader takes the boundary both hold (1); step 2 is computed again by the
    two of them, to the same bits."""
    async def body():
        net = MemoryNetwork()
        mesh = CutAtFirstCheckResult(net, "tab0", 2)
        pages = [Page(net, "tab0", checks, mesh), *(Page(net, f"tab{i}", checks)
                                                     for i in (1, 2))]
        mesh.page = pages[0]
        await asyncio.sleep(0.05)
        await pages[0].peer.start({**CONFIG, "steps": 5, "cross_check": 0})
        await settle(pages[1:])
        pages[0].peer.task.cancel()
        steps = [[f["step"] for f in page.kinds("step")] for page in pages[1:]]
        assert steps == [[1, 2, 2, 3, 4, 5], [1, 2, 3, 4, 5]]
        for page in pages[1:]:
            assert page.kinds("leader")[0]["step"] == 1
            assert [f["hash"] for f in page.kinds("step")] == [reference[s - 1] for s in
                                                               [f["step"] for f in
                                                                page.kinds("step")]]
            assert page.kinds("done")[0]["hash"] == reference[4]
    run(body())


def test_the_leaders_change_and_pause_carry_over_to_the_next_leader(checks):
    """The leader asks for a new lr and a pause at one boundary, and vanishes while the room
    waits: the next leader keeps the run paused with the change applied; resumed by it, the
    run ends on the hashes of one trainer replaying the recorded schedule."""
    from pynode.core.checkpoint import load_checkpoint

    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(3)]
        await pause_and_lose_the_leader(net, pages)
        while not all(p.kinds("leader") for p in pages[1:]):
            await asyncio.sleep(0.01)
        paused_at = {p.kinds("leader")[0]["step"] for p in pages[1:]}
        await asyncio.sleep(1.5)  # the new leader keeps the room paused
        assert {max(p.hashes()) for p in pages[1:]} == paused_at
        with pytest.raises(RoomError, match="only the leader"):
            pages[2].peer.steer(pause=False)
        assert pages[1].peer.steer(pause=False)["paused"] is False
        await settle(pages[1:])
        pages[0].peer.task.cancel()
        (step,) = paused_at
        for page in pages[1:]:
            # the takeover's report: the config and changes agreed at that boundary, not
            # yet the lost leader's lr of it (the new leader's word brings that again)
            (took,) = page.kinds("leader")
            assert took["schedule"] == [], took["schedule"]
            assert took["config"] == page.kinds("run")[0]["config"], took["config"]
            controls = page.kinds("control")
            assert controls[-1] == {"step": step, "paused": False}
            assert [c["change"] for c in controls if c.get("change")] == [
                {"step": step, "lr": 0.001}] * 2, "applied once by each leader"
        schedule = load_checkpoint(pages[1].peer.checkpoint()).config["schedule"]
        assert schedule == [{"step": step, "lr": 0.001}]
        got = await replayed(checks, 6, schedule)
        assert got == pages[1].hashes() == pages[2].hashes()
    run(body())


def test_a_peer_without_controls_that_takes_over_a_paused_run_goes_on(checks):
    """As above, but the next leader is a `join` peer (no controls: nobody could resume
    it): it says so and goes on with the change applied; the run ends on the hashes of one
    trainer replaying the schedule."""
    from pynode.core.checkpoint import load_checkpoint

    async def body():
        net = MemoryNetwork()
        pages = [Page(net, "tab0", checks), Page(net, "tab1", checks, steerable=False),
                 Page(net, "tab2", checks)]
        await pause_and_lose_the_leader(net, pages)
        await settle(pages[1:])
        pages[0].peer.task.cancel()
        (step,) = {p.kinds("leader")[0]["step"] for p in pages[1:]}
        assert pages[1].kinds("leader")[0]["leader"] == "tab1"
        warned = [e["text"] for e in pages[1].kinds("event") if "no controls" in e["text"]]
        assert len(warned) == 1, pages[1].kinds("event")
        schedule = load_checkpoint(pages[1].peer.checkpoint()).config["schedule"]
        assert schedule == [{"step": step, "lr": 0.001}]
        got = await replayed(checks, 6, schedule)
        assert got == pages[1].hashes() == pages[2].hashes()
        assert max(got) == 6
    run(body())


async def paused_with_a_joiner(checks) -> tuple[Page, Page]:
    """tab0 leads a 400-step run, paused after step 2, and `late` waits to join it."""
    async def yielding(_trainer) -> None:
        await asyncio.sleep(0.01)  # alone, the leader's loop would never let the test in

    net = MemoryNetwork()
    page = Page(net, "tab0", checks, before_step=(yielding,))
    await asyncio.sleep(0.05)
    await page.peer.start({**CONFIG, "steps": 400})
    await wait_for_step(page, 2)
    page.peer.steer(pause=True)
    while not page.kinds("control"):
        await asyncio.sleep(0.01)
    late = Page(net, "late", checks)
    while not page.peer.run.joins:
        await asyncio.sleep(0.01)
    return page, late


def test_a_joiner_admitted_with_a_change_syncs_into_the_changed_run(checks):
    """The leader resumes a pause with a new lr while a peer waits to join: one control word
    admits it and carries the change. The joiner skips that word, so its sync must carry the
    changed run (it used to carry the old lr: a fork at the next step)."""
    from pynode.core.checkpoint import load_checkpoint

    async def body():
        page, late = await paused_with_a_joiner(checks)
        leader = page.peer
        # while it waits it says so, to its page and in its hello, and starts nothing else
        assert late.kinds("joining") == [{"run": leader.run.id, "leader": "tab0"}]
        assert late.peer.hello()["state"] == "joining"
        with pytest.raises(RoomError, match="waits to join the run of tab0"):
            await late.peer.start({**CONFIG, "steps": 4})
        leader.steer(pause=False, lr=0.001)
        while len(late.hashes()) < 2 and not late.kinds("failed"):
            await asyncio.sleep(0.01)
        leader.steer(stop=True)
        await settle([page, late])
        assert not page.kinds("failed") and not late.kinds("failed")
        # admitted (synced), it no longer waits: every change of its wait is reported
        assert late.kinds("joining")[-1] == {"run": None, "leader": None}
        joined = late.kinds("run")[0]["joined_at"]
        assert [c["change"] for c in page.kinds("control") if c.get("change")][0] == {
            "step": joined, "lr": 0.001}, "admitted with the change, in one word"
        schedule = load_checkpoint(late.peer.checkpoint()).config["schedule"]
        got = await replayed(checks, 400, schedule)
        assert late.hashes() and all(got[s] == h for s, h in late.hashes().items())
        assert page.hashes() == got
    run(body())


def test_a_stop_admits_no_joiner_into_the_run_it_ends(checks):
    """A peer waiting to join as the leader stopped was admitted by the Stop's own word:
    synced into a run that ended at once, its page said "Finished" where the others said
    "Stopped" (its run report held the Stop already; a review)."""
    async def body():
        page, late = await paused_with_a_joiner(checks)
        page.peer.steer(stop=True)
        await settle([page])
        deadline = asyncio.get_running_loop().time() + 30
        while late.kinds("joining")[-1]["run"] is not None:  # the run's end said to it
            assert asyncio.get_running_loop().time() < deadline, late.reports
            await asyncio.sleep(0.01)
        assert page.kinds("done") and not page.kinds("failed")
        assert not late.kinds("run"), "synced into the run its Stop ended"
    run(body())


class LateToHear(Mesh):
    """A peer's end of the network that learns of `peer`'s loss `delay` seconds late (as a
    busy or throttled peer would)."""

    def __init__(self, net: MemoryNetwork, peer_id: str, peer: str, delay: float) -> None:
        self.end, self.self_id, self.late_for, self.delay = net.join(peer_id), peer_id, peer, delay

    @property
    def peers(self) -> frozenset[str]:
        return self.end.peers

    def send(self, peer: str, data: bytes) -> None:
        self.end.send(peer, data)

    async def recv(self) -> tuple[str, bytes | None]:
        peer, data = await self.end.recv()
        if data is None and peer == self.late_for:
            await asyncio.sleep(self.delay)
        return peer, data


def test_a_survivor_too_late_for_the_takeover_is_declined_and_joins_again(checks):
    """tab2 hears of the leader's loss 2 s late; tab1 waits for its report no longer than
    its step deadline (shortened to 0.5 s here), takes over alone, and declines tab2's late
    report: tab2 asks the new leader to join and is synced, on the reference hashes."""
    from pynode.config import RunConfig

    steps = 30
    alone = checks.make_trainer(RunConfig.from_dict({**CONFIG, "steps": steps}), None, None)
    reference30 = run(steps_of(alone, steps))

    async def slowly(_trainer) -> None:
        await asyncio.sleep(0.1)  # the run outlasts tab2's return

    async def body():
        net = MemoryNetwork()
        pages = [Page(net, "tab0", checks), Page(net, "tab1", checks, before_step=(slowly,)),
                 Page(net, "tab2", checks, LateToHear(net, "tab2", "tab0", 2.0))]
        await asyncio.sleep(0.05)
        await pages[0].peer.start({**CONFIG, "steps": steps})
        await wait_for_step(pages[1], 2)
        trainer = pages[1].peer.run.trainer
        trainer.deadline = lambda: 0.5
        net.cut("tab0")
        while not pages[1].kinds("leader"):
            await asyncio.sleep(0.01)
        del trainer.deadline
        await settle(pages[1:])
        pages[0].peer.task.cancel()
        assert [f["ranks"] for f in pages[1].kinds("leader")] == [["tab1"]]
        assert any("asking to join it again" in e["text"] for e in pages[2].kinds("event"))
        rejoined = pages[2].kinds("run")[-1]
        assert rejoined["leader"] == "tab1" and rejoined["joined_at"] is not None
        assert not pages[2].kinds("leader") and not pages[2].kinds("failed")
        for page in pages[1:]:
            assert all(reference30[s - 1] == h for s, h in page.hashes().items())
            assert page.kinds("done")[0]["hash"] == reference30[-1]
    run(body())


def test_bad_config_or_busy_peer_starts_nothing(checks):
    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(ConfigError):
            await pages[0].peer.start({**CONFIG, "heads": 3})
        with pytest.raises(ConfigError):
            await pages[0].peer.start({**CONFIG, "bogus": 1})
        assert not pages[0].kinds("run") and not pages[1].kinds("run")
        await pages[0].peer.start({**CONFIG, "steps": 2})
        with pytest.raises(RoomError):
            await pages[1].peer.start(CONFIG)
        await settle(pages)
    run(body())


def test_a_peer_that_never_said_ready_is_left_out(checks, reference):
    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(2)]
        net.join("failed-gate")  # reachable, but no room peer answers: it never says hello
        await asyncio.sleep(0.05)
        assert pages[0].kinds("peers")[-1] == {"tab1": "ready"}
        ranks = await pages[0].peer.start({**CONFIG, "steps": 2})
        assert "failed-gate" not in ranks
        await settle(pages)
        assert pages[1].hashes() == {1: reference[0], 2: reference[1]}
    run(body())


def corrupting(checks: Checks, at_step: int):
    """make_trainer whose trainer flips one weight after step `at_step`: a broken peer."""
    def make(cfg, coll, resume):
        trainer = checks.make_trainer(cfg, coll, resume)

        def flip(t):
            if t.state.step == at_step:
                name = next(iter(t.state.params))
                t.state.params[name] = t.state.params[name].copy()
                t.state.params[name].reshape(-1)[0] += 1.0
        trainer.after_update.append(flip)
        return trainer
    return make


def test_a_fork_between_two_peers_stops_both_with_a_clear_message(checks, reference):
    async def body():
        _, pages = await room_with_odd_peer(checks, 2, corrupting(checks, 2),
                                            {**CONFIG, "steps": 5})
        await settle(pages)
        for page in pages:
            assert "fork detected" in page.kinds("failed")[0]["error"]
            assert max(page.hashes()) == 1, "nobody may report a step past the fork"
    run(body())


def test_a_diverged_minority_is_resynced_from_the_majority(checks, reference):
    async def body():
        _, pages = await room_with_odd_peer(checks, 3, corrupting(checks, 2),
                                            {**CONFIG, "steps": 4})
        await settle(pages)
        for page in pages:
            assert page.kinds("done")[0]["hash"] == reference[3]
    run(body())


def test_a_tab_whose_gradients_are_wrong_is_outvoted_and_its_work_left_out(
    checks, reference, caplog
):
    """One tab's gradients go wrong from step 2 (no GEMM is wrong, so only the cross-peer
    check sees it): every microbatch is recomputed by another tab, the majority names it,
    and every tab ends on the reference hashes."""
    from pynode.cli.faults import WrongGradients
    from pynode.config import RunConfig

    alone = checks.make_trainer(RunConfig.from_dict({**CONFIG, "steps": 6, "microbatches": 6}),
                                None, None)
    reference6 = run(steps_of(alone, 6))

    def wrong(cfg, coll, resume):
        trainer = checks.make_trainer(cfg, coll, resume)
        trainer.task = WrongGradients(trainer, 2)
        return trainer

    async def body():
        net, pages = await room_with_odd_peer(checks, 3, wrong, {**CONFIG, "steps": 6,
                                                                 "cross_check": 1,
                                                                 "microbatches": 6})
        await wait_for_step(pages[0], 3)
        late = Page(net, "late", checks)  # learns who is left out from the sync
        await settle([*pages, late])
        for page in pages:
            assert page.hashes() == {s + 1: h for s, h in enumerate(reference6[:6])}
        joined = late.hashes()
        assert joined and all(reference6[s - 1] == h for s, h in joined.items())
        assert late.kinds("done")[0]["hash"] == reference6[5]

    with caplog.at_level("WARNING", logger="pynode.run"):
        run(body())
    assert "ranks [2] computed it wrong" in caplog.text
    assert "this peer (rank 2) computed differently from the majority" in caplog.text
    assert "re-planning lost microbatches" not in caplog.text  # every peer planned alike


def test_a_tab_whose_gemm_is_wrong_is_named_and_left_out_without_stopping_the_room(
    checks, caplog
):
    """One tab computes with a GEMM wrong at every product of inner size = width (and at the
    probe's) and no per-call check: the cross-peer check outvotes its microbatches and
    leaves its work out. Its GEMM probe differs from the others' at every step; a
    distrusted peer's probe is not asked (only its state), so the room goes on and every
    tab ends on the clean hashes."""
    from pynode.cli.faults import WrongAtWidth
    from pynode.config import RunConfig
    from pynode.core.gemm import select_gemm
    from pynode.core.probe import PROBE_SHAPE
    from pynode.run.assemble import build_trainer

    cfg = {**CONFIG, "steps": 3, "cross_check": 1, "microbatches": 6}
    reference3 = run(steps_of(checks.make_trainer(RunConfig.from_dict(cfg), None, None), 3))

    def wrong(config, coll, resume):
        gemm = select_gemm(checks.units, order=["numpy_int"], check=False, audit_every=10**9)
        probe_k = PROBE_SHAPE[1]  # and at the GEMM probe's inner size: its probe differs
        gemm.backend = WrongAtWidth(WrongAtWidth(gemm.backend, cfg["width"]), probe_k)
        gemm.audit.calls = 1  # past the audit's first call, which would catch it at once
        return build_trainer(config, coll, resume, arithmetic=(checks.units, gemm))

    async def body():
        _, pages = await room_with_odd_peer(checks, 3, wrong, cfg)
        await settle(pages)
        for page in pages:
            assert page.hashes() == {s + 1: h for s, h in enumerate(reference3)}

    with caplog.at_level("WARNING", logger="pynode.run"):
        run(body())
    assert "ranks [2] computed it wrong" in caplog.text and "fork" not in caplog.text


def test_allreduce_benchmark_over_the_room(checks):
    async def body():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(3)]
        await asyncio.sleep(0.05)
        result = await pages[0].peer.bench(10_000, 3)
        assert result["members"] == 3 and result["exact"] and len(result["seconds"]) == 3
        await asyncio.sleep(0.2)
        for page in pages[1:]:
            assert page.kinds("bench")[0]["exact"]
        with pytest.raises(ConfigError):
            await pages[0].peer.bench(0, 3)
        ranks = await pages[1].peer.start({**CONFIG, "steps": 1})
        assert len(ranks) == 3, "peers are free again after a benchmark"
        await settle(pages)
    run(body())


def test_the_leaders_pause_change_and_stop_apply_at_one_step_on_every_peer(checks):
    """Pause (the others wait between two steps), an lr change, then a stop: every peer
    applies each at the same step boundary, and one trainer replaying the recorded schedule
    (what `train --schedule` does) gives the same hashes."""
    from pynode.core.checkpoint import load_checkpoint

    async def body():
        pages = await room_run(checks, 3, steps=12)
        leader = pages[0].peer
        with pytest.raises(RoomError, match="only the leader"):
            pages[1].peer.steer(lr=0.001)
        with pytest.raises(ConfigError, match="lr must be in"):
            leader.steer(lr=2.0)
        with pytest.raises(ConfigError, match="pause must be true or false, got 'no'"):
            leader.steer(pause="no")  # a string is not a resume
        await wait_for_step(pages[0], 2)
        leader.steer(pause=True)
        while not all(p.kinds("control") for p in pages):
            await asyncio.sleep(0.01)
        paused_at = {p.kinds("control")[0]["step"] for p in pages}
        assert len(paused_at) == 1 and all(p.kinds("control")[0]["paused"] for p in pages)
        await asyncio.sleep(1.5)  # two pause words later, nobody has stepped
        assert {max(p.hashes()) for p in pages} == paused_at
        leader.steer(pause=False, lr=0.001)
        await wait_for_step(pages[0], max(paused_at) + 2)
        leader.steer(stop=True)
        await settle(pages)
        changes = [[c["change"] for c in p.kinds("control") if c.get("change")] for p in pages]
        assert changes[0] == changes[1] == changes[2]
        (lr, stop) = changes[0]
        assert lr == {"step": max(paused_at), "lr": 0.001}
        assert stop["steps"] == stop["step"] and stop["step"] > lr["step"]
        assert all(max(p.hashes()) == stop["step"] for p in pages)
        assert pages[1].hashes() == pages[0].hashes() == pages[2].hashes()
        ckpt_config = load_checkpoint(pages[1].peer.checkpoint()).config
        assert ckpt_config["schedule"] == changes[0] and ckpt_config["steps"] == stop["step"]

        got = await replayed(checks, 12, changes[0])
        assert got == pages[0].hashes()
    run(body())


def test_steps_set_to_the_step_reached_while_paused_end_the_run(checks):
    """A paused run told to end where it is (steps = the step reached) ends, as Stop does;
    it stayed paused ("Paused after step 10 of 10") until someone pressed Resume."""

    async def body():
        pages = await room_run(checks, 2, steps=12)
        leader = pages[0].peer
        await wait_for_step(pages[0], 2)
        leader.steer(pause=True)
        while not all(p.kinds("control") for p in pages):
            await asyncio.sleep(0.01)
        at = pages[0].kinds("control")[0]["step"]
        leader.steer(steps=at)
        await settle(pages, timeout=30)
        assert all(max(p.hashes()) == at for p in pages)
        changes = [c["change"] for c in pages[1].kinds("control") if c.get("change")]
        assert changes == [{"steps": at, "step": at}], changes
    run(body())


def test_the_pages_steer_request_refuses_fields_it_does_not_know():
    """`daisychain.steer({step: 100})` (for `steps`) is refused with the fields steer takes,
    not accepted as a request of nothing; so is a pause that is not a boolean."""
    import json
    import types

    from pynode.browser import BrowserPeer

    asked = []

    def steer(*args):
        asked.append(args)
        return {"requested": None, "paused": False, "stopping": False, "step": 3}

    page = types.SimpleNamespace(room=types.SimpleNamespace(steer=steer))
    for request in ({"step": 100}, {"lr": 0.001, "warmup": 3}, [1]):
        answer = json.loads(BrowserPeer.steer(page, json.dumps(request)))
        assert answer["ok"] is False, answer
        assert "steer takes lr, steps, pause and stop" in answer["error"] or (
            request == [1] and "is an object" in answer["error"]), answer
    assert asked == []
    assert json.loads(BrowserPeer.steer(page, json.dumps({"pause": True})))["ok"] is True
    assert asked == [(None, None, True, False)]


@pytest.mark.parametrize("sent,kept", [
    ([[1, 2.5, None], [2, 2.25, 2.0]], [[1, 2.5, None], [2, 2.25, 2.0]]),
    ([[2, 2.5, None], [1, 2.25, None]], []),  # steps that do not rise
    ([[1, "2.5", None]], []), ([[True, 2.5, None]], []), ([[1, 2.5]], []),
    ("not a list", []), (None, []),
])
def test_a_syncs_curve_is_read_as_sent_or_left_out(sent, kept):
    """A joiner draws the run's loss from the sync's curve; one that is not a curve (an
    old or a faulty peer's) is left out, and the sync goes on: it is no part of the state."""
    from pynode.run.room import read_curve

    assert read_curve(sent) == kept


def test_a_long_runs_curve_is_thinned_and_keeps_its_first_steps():
    """A joiner of a long run draws it from its first step: past CURVE_KEPT points every
    other one of the past is dropped (as the dashboard's server keeps a curve), not the
    oldest ones."""
    from pynode.run.room import CURVE_KEPT, Run

    run = Run("r", "tab0", None, None, None)
    for step in range(1, 3 * CURVE_KEPT + 1):
        run.record(step, 2.0, None)
    steps = [point[0] for point in run.curve]
    assert len(steps) <= CURVE_KEPT and steps[0] == 1 and steps[-1] == 3 * CURVE_KEPT
    assert steps == sorted(set(steps))
