"""--sync-every H over R virtual replicas: the same bits at every outer step whoever computes.

One trainer alone is the reference; `train --peers 3 --capacity 1,2,5` (loopback group), a
2-rank gloo cluster and a room of three peers over the in-memory mesh (one of them joining
late, at an outer boundary) must publish its hashes at every outer step. The run has a
short last outer step (7 steps, H = 3) and replicas of two microbatches each.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from pynode.browser import Checks
from pynode.cli.main import main
from pynode.cli.report import StepReporter
from pynode.comm.mesh import MemoryNetwork
from pynode.config import ConfigError, RunConfig
from pynode.core import optim
from pynode.core.plan import replica_microbatches
from pynode.run.outer import OuterTrainer
from pynode.run.protocol import RoomPeer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the run harness
from pynode_runs import Launched, free_port  # noqa: E402

CONFIG = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
          "microbatches": 8, "steps": 7, "lr": 0.003, "seed": 5, "sync_every": 3,
          "replicas": 4}
FLAGS = ["--width", "32", "--layers", "1", "--heads", "2", "--seq", "16", "--microbatch-size",
         "2", "--microbatches", "8", "--steps", "7", "--lr", "0.003", "--seed", "5",
         "--sync-every", "3", "--replicas", "4", "--no-progress", "--kernels", "numpy"]
OUTER_STEPS = [3, 6, 7]


@pytest.fixture(scope="module")
def reference(checks) -> dict[int, str]:
    """outer boundary step -> state hash, of one trainer alone."""
    trainer = checks.make_trainer(RunConfig.from_dict(CONFIG), None, None)
    assert isinstance(trainer, OuterTrainer)

    async def steps():
        return {(r := await trainer.step()).step: r.hash for _ in OUTER_STEPS}

    return asyncio.run(steps())


@pytest.fixture(scope="module")
def launched(tmp_path_factory, full_suite) -> dict[str, Launched]:
    """The multi-process runs, started together (the gloo pair in the full suite only)."""
    folder = tmp_path_factory.mktemp("syncevery")
    runs = {"peers3": Launched(folder, "peers3", ["train", *FLAGS, "--peers", "3",
                                                  "--capacity", "1,2,5"])}
    if full_suite:
        base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
        for rank in (0, 1):
            runs[f"gloo{rank}"] = Launched(folder, f"gloo{rank}", ["cluster", *FLAGS[:-2]],
                                           {**base, "RANK": str(rank)})
    return runs


def test_the_reference_reads_the_per_step_runs_microbatches_and_learns(reference):
    assert list(reference) == OUTER_STEPS
    # R replicas of M/R microbatches cover each step's M microbatches once
    covered = sorted(i for r in range(4) for i in replica_microbatches(r, 8, 4))
    assert covered == list(range(8))


def test_one_peer_learns_and_the_replica_count_is_part_of_the_run(checks):
    cfg = RunConfig.from_dict({**CONFIG, "steps": 30, "sync_every": 10})

    async def losses(c: RunConfig) -> list:
        trainer = checks.make_trainer(c, None, None)
        return [await trainer.step() for _ in range(3)]

    four = asyncio.run(losses(cfg))
    assert four[-1].loss < four[0].loss - 0.3, [r.loss for r in four]
    two = asyncio.run(losses(cfg.with_(replicas=2)))
    assert two[-1].hash != four[-1].hash  # the replica count is part of the run


def test_peers_3_with_capacities_1_2_5_publish_the_reference_hashes(launched, reference):
    done = launched["peers3"].wait()
    assert done.rc == 0, done.err[-2000:]
    assert {row["step"]: row["hash"] for row in done.log} == reference
    assert done.final_hash == reference[7]


@pytest.mark.full  # two more interpreters with torch: the full suite's
def test_a_gloo_pair_publishes_the_reference_hashes(launched, reference):
    for rank in (0, 1):
        done = launched[f"gloo{rank}"].wait()
        assert done.rc == 0, done.err[-2000:]
    assert {row["step"]: row["hash"] for row in launched["gloo0"].wait().log} == reference


class Page:
    def __init__(self, net: MemoryNetwork, peer_id: str, checks: Checks) -> None:
        self.steps: dict[int, str] = {}
        self.rows: dict[int, dict] = {}  # step -> the fields of its report
        self.failed = ""
        self.ended = ""  # "done" or "failed"
        self.leaders: list[list[str]] = []  # the ranks of each leader takeover it reported
        self.inner: list[tuple[int, int]] = []  # (replica, inner step) it reported taking
        self.peer = RoomPeer(net.join(peer_id), checks.make_trainer, self.record)
        self.task = asyncio.ensure_future(self.peer.serve())
        self.finished = asyncio.Event()

    def record(self, kind: str, fields: dict) -> None:
        if kind == "step":
            self.steps[fields["step"]] = fields["hash"]
            self.rows[fields["step"]] = fields
        elif kind == "leader":
            self.leaders.append(fields["ranks"])
        elif kind == "inner":
            self.inner.append((fields["replica"], fields["step"]))
        elif kind in ("done", "failed"):
            self.failed, self.ended = fields.get("error", ""), kind
            self.finished.set()


def test_a_room_with_a_late_joiner_publishes_the_reference_hashes(checks, reference):
    async def scenario():
        net = MemoryNetwork()
        a, b = Page(net, "a", checks), Page(net, "b", checks)
        while len(a.peer.hellos) < 1:
            await asyncio.sleep(0.01)
        await a.peer.start(CONFIG)
        while 3 not in a.steps:
            await asyncio.sleep(0.01)
        c = Page(net, "c", checks)  # joins at an outer boundary, synced from the leader
        pages = (a, b, c)
        await asyncio.wait_for(asyncio.gather(*(p.finished.wait() for p in pages)), 90)
        for page in pages:
            page.peer.router.stop()
            page.task.cancel()
        return pages

    a, b, c = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert not (a.failed or b.failed or c.failed), (a.failed, b.failed, c.failed)
    assert a.steps == b.steps == reference
    assert c.steps and all(reference[s] == h for s, h in c.steps.items())
    assert max(c.steps) == 7
    # each replica's every inner step taken once in the room, reported by who took it
    taken = sorted(a.inner + b.inner + c.inner)
    assert taken == [(r, s) for r in range(4) for s in range(1, 8)], taken
    # an outer step's report counts its inner steps (tokens/s: all the tokens of its replicas)
    for row in a.rows.values():
        tokens = row["share"] * 8 * 2 * 16 * row["inner"]  # microbatches, size, seq
        assert row["tokens_per_s"] * row["seconds"] == pytest.approx(tokens)
    assert [a.rows[s]["inner"] for s in OUTER_STEPS] == [3, 3, 1]


def test_a_room_member_lost_inside_an_outer_step_costs_time_not_bits(checks, reference,
                                                                     caplog):
    """Its replicas are recomputed by the others from the last boundary; cut off from all,
    it cannot tell that from everyone else vanishing, takes over alone (leader failover)
    and, alone, recomputes every replica to the same bits."""
    caplog.set_level(logging.WARNING, logger="pynode.run")

    async def scenario():
        net = MemoryNetwork()
        pages = [Page(net, f"tab{i}", checks) for i in range(3)]
        while len(pages[0].peer.hellos) < 2:
            await asyncio.sleep(0.01)
        await pages[0].peer.start(CONFIG)
        while 3 not in pages[2].steps:
            await asyncio.sleep(0.01)
        net.cut("tab2")
        await asyncio.wait_for(asyncio.gather(*(p.finished.wait() for p in pages)), 90)
        for page in pages:
            page.peer.router.stop()
            page.task.cancel()
        return pages

    pages = asyncio.run(asyncio.wait_for(scenario(), 120))
    for page in pages:
        assert not page.failed and page.steps == reference
    assert pages[2].leaders == [["tab2"]]
    assert "re-planning lost microbatches" in caplog.text  # it held replicas


def test_the_progress_bar_moves_with_the_inner_steps(checks, monkeypatch):
    """A terminal's bar shows the furthest inner step taken (the replicas run one after
    another), and each outer step's end; before, it jumped by H at each outer step."""

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    trainer = checks.make_trainer(RunConfig.from_dict(CONFIG), None, None)
    reporter = StepReporter(trainer, CONFIG["steps"], None, progress=True)
    seen: list = []
    trainer.after_inner.append(lambda replica, step: seen.append(reporter.bar.n))

    async def steps():
        for _ in OUTER_STEPS:
            reporter(await trainer.step())
            seen.append(("outer", reporter.bar.n))

    asyncio.run(steps())
    reporter.bar.close()
    want: list = []
    for start, end in zip([0, *OUTER_STEPS], OUTER_STEPS, strict=False):
        want += [*range(start + 1, end + 1), *[end] * (end - start) * 3, ("outer", end)]
    assert seen == want


def test_the_outer_step_is_torchs_nesterov_sgd():
    """torch.optim.SGD(nesterov=True) is the oracle: the same momentum bits, and weights
    within the float32 rounding of the step term (torch may fuse its multiply-adds)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    p = rng.standard_normal(1000).astype(np.float32)
    u = rng.standard_normal(1000).astype(np.float32) * np.float32(0.01)
    d = rng.standard_normal(1000).astype(np.float32) * np.float32(0.01)
    params, momentum = optim.nesterov_update({"w": p}, {"w": d}, {"w": u}, 0.7, 0.9)
    tp = torch.nn.Parameter(torch.from_numpy(p.copy()))
    sgd = torch.optim.SGD([tp], lr=0.7, momentum=0.9, nesterov=True)
    sgd.state[tp]["momentum_buffer"] = torch.from_numpy(u.copy())
    tp.grad = torch.from_numpy(d.copy())
    sgd.step()
    assert np.array_equal(momentum["w"], sgd.state[tp]["momentum_buffer"].numpy())
    step = (d.astype(np.float64) + np.float32(0.9) * momentum["w"].astype(np.float64)) \
        * np.float32(0.7)
    bound = np.spacing(np.abs(params["w"])) / 2 + 4 * np.finfo(np.float32).eps * np.abs(step)
    for got in (params["w"], tp.detach().numpy()):
        assert np.all(np.abs(got.astype(np.float64) - (p.astype(np.float64) - step)) <= bound)


@pytest.mark.parametrize("changes,message", [
    ({"sync_every": 0}, "sync_every must be a positive integer, got 0"),
    ({"replicas": 0}, "replicas must be a positive integer, got 0"),
    ({"replicas": 3}, "replicas (3) must divide microbatches (8)"),
    ({"sync_every": 1}, "replicas 4 needs sync_every H > 1"),
    ({"outer_lr": 0.0}, "outer_lr must be in (0, 2]"),
    ({"outer_momentum": 1.0}, "outer_momentum must be in [0, 1)"),
])
def test_bad_values_are_named(changes, message):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict({**CONFIG, **changes})
    assert message in str(caught.value)


@pytest.mark.parametrize("flags,message", [
    (["--sync-every", "0"], "ConfigError: --sync-every must be a positive integer, got 0"),
    # a per-step run took them silently, and its checkpoint's config carried them
    (["--sync-every", "1", "--replicas", "1", "--outer-lr", "1"], "ConfigError: --outer-lr 1.0 "
     "set the outer step of a run that syncs every H > 1 steps: with --sync-every 1 there is none"),
    (["--sync-every", "1", "--replicas", "1", "--outer-momentum", "0.5"],
     "ConfigError: --outer-momentum 0.5 set the outer step"),
    (["--sync-every", "5", "--replicas", "3"], "ConfigError: --replicas (3) must divide "
                                              "microbatches (4)"),
    (["--sync-every", "5", "--save-every", "7", "--save", "x.pt"],
     "ConfigError: --save-every 7: a --sync-every 5 run has states only every 5 steps"),
])
def test_the_command_line_refuses_bad_values_in_one_line(flags, message, capsys, tmp_path,
                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--steps", "10", "--no-progress", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_per_step_config_keeps_its_bytes_and_a_resume_cannot_switch_kinds(tmp_path):
    assert "sync_every" not in RunConfig().to_json()  # old configs and checkpoints unchanged
    outer = RunConfig.from_dict(CONFIG)
    assert RunConfig.from_dict(json.loads(outer.to_json())) == outer
    from pynode.run.assemble import read_resume
    from pynode.run.trainer import Trainer
    from pynode.tasks.gpt import GPTTask

    per_step = Trainer(RunConfig(width=32, layers=1, heads=2, seq=16, microbatches=8), GPTTask(),
                       None)
    with pytest.raises(ConfigError, match="per-step run and cannot continue as a --sync-every"):
        read_resume(per_step.state_bytes(), {"sync_every": 3, "replicas": 4})
    # and back: said as such, before the replicas a per-step run cannot have are judged
    # (that came out as "CheckpointError: ... replicas 4 needs sync_every H > 1")
    outer_ckpt = Trainer(RunConfig(width=32, layers=1, heads=2, seq=16, microbatches=8,
                                   sync_every=2, replicas=4), GPTTask(), None)
    with pytest.raises(ConfigError, match="--sync-every run and cannot continue as a per-step"):
        read_resume(outer_ckpt.state_bytes(), {"sync_every": 1})


def test_mesh_sim_counts_a_sync_every_run_per_inner_step(checks):
    """bench mesh-sim's --sync-every column: the one-peer bits, fewer bytes per step."""
    from pynode.bench import mesh_sim

    tiny = {**CONFIG, "microbatches": 4, "replicas": 2, "sync_every": 4, "steps": 8,
            "cross_check": 0}
    outer = RunConfig.from_dict(tiny)
    per_step = outer.with_(sync_every=1, replicas=1)
    alone = checks.make_trainer(outer, None, None)

    async def last_hash():
        return [(await alone.step()).hash for _ in range(2)][-1]

    want = asyncio.run(last_hash())
    rows = {c.sync_every: asyncio.run(mesh_sim.simulate(2, c, checks.make_trainer))
            for c in (outer, per_step)}
    assert rows[4]["same_hash_everywhere"] and rows[4]["final_hash"] == want
    sent = {h: row["bytes_per_peer_per_step_mean"] for h, row in rows.items()}
    # one reduction (pseudo-gradients and second-moment codes) for four steps' tokens
    assert 0 < sent[4] < 0.6 * sent[1], sent


def test_a_checkpoint_at_an_outer_boundary_resumes_to_the_same_bits(checks, reference):
    from pynode.run.assemble import read_resume

    trainer = checks.make_trainer(RunConfig.from_dict(CONFIG), None, None)

    async def go(t, count):
        return [(await t.step()).hash for _ in range(count)]

    assert asyncio.run(go(trainer, 1)) == [reference[3]]
    cfg, ckpt = read_resume(trainer.state_bytes(), {})
    assert cfg.sync_every == 3 and ckpt.step == 3 and ckpt.adam_step == 1
    resumed = checks.make_trainer(cfg, None, ckpt)
    assert asyncio.run(go(resumed, 2)) == [reference[6], reference[7]]


def test_second_moment_codes_round_trip_within_a_fifth_of_a_percent():
    rng = np.random.default_rng(7)
    v = np.ldexp(rng.random(4000) + 0.5, rng.integers(-60, 20, 4000)).astype(np.float32)
    codes = optim.second_moment_code(v)
    back = optim.second_moment_from_codes(codes, 1)
    assert np.all(np.abs(back.astype(np.float64) / v - 1) <= 2.0**-9)
    # the mean of R equal codes is the code itself: replicas that agree keep their v
    assert np.array_equal(optim.second_moment_from_codes(3 * codes, 3), back)
    assert optim.second_moment_from_codes(optim.second_moment_code(np.zeros(2, np.float32)),
                                          1).max() < 1e-29
    with pytest.raises(Exception, match="finite float32 values >= 0"):
        optim.second_moment_code(np.float32([-1.0]))


def test_save_every_writes_at_the_boundaries_of_a_run_resumed_off_the_grid(tmp_path):
    """A run of 20 steps at H = 8 ends on a short outer step; resumed, its boundaries are
    28, 36, ..., none a multiple of 8: `--save-every 8` never wrote (a crash lost it all)."""
    from types import SimpleNamespace

    from pynode.cli.report import Saver
    from pynode.run.trainer import StepResult

    state = SimpleNamespace(step=20)
    trainer = SimpleNamespace(state=state, state_bytes=lambda: f"state {state.step}".encode())
    path = tmp_path / "m.pt"
    on_step = Saver(str(path), 8).hook(trainer)
    written = []
    for boundary in (28, 36, 44):
        state.step = boundary
        on_step(StepResult(step=boundary, loss=1.0, hash="h", probe="p"))
        written.append(path.read_bytes() if path.exists() else None)
    assert written == [b"state 28", b"state 36", b"state 44"]
    per_step = Saver(str(tmp_path / "p.pt"), 3).hook(SimpleNamespace(
        state=SimpleNamespace(step=0), state_bytes=lambda: b"x"))
    wrote = []
    for step in range(1, 8):  # a per-step run writes every 3rd step, as before
        (tmp_path / "p.pt").unlink(missing_ok=True)
        per_step(StepResult(step=step, loss=1.0, hash="h", probe="p"))
        wrote.append((tmp_path / "p.pt").exists())
    assert wrote == [False, False, True, False, False, True, False]


def test_a_schedule_of_a_resumed_run_follows_its_own_boundaries():
    """Resumed at step 20 with H = 8 the run changes at 28, 36, ...: 28 was refused (not a
    multiple of 8) and 32 taken, to fail mid-run with 'resumed past it'."""
    from types import SimpleNamespace

    from pynode.cli.train import check_sync_every_flags
    from pynode.run.schedule import Change, check_reached

    cfg = RunConfig.from_dict({**CONFIG, "sync_every": 8, "steps": 60})
    args = SimpleNamespace(save_every=None)
    check_sync_every_flags(args, cfg, [Change(step=28, lr=0.001)], 20)
    with pytest.raises(ConfigError) as refused:
        check_sync_every_flags(args, cfg, [Change(step=32, lr=0.001)], 20)
    assert "step 20 plus multiples of 8 (28, 36, ...); steps [32] are not" in str(refused.value)
    with pytest.raises(ConfigError, match="resumes at step 20, after its changes at steps "
                                          "\\[12\\]: leave those out"):
        check_reached([Change(step=12, lr=0.001)], cfg.steps, 20)
    with pytest.raises(ConfigError, match="multiples of 8; steps \\[28\\] are not"):
        check_sync_every_flags(args, cfg, [Change(step=28, lr=0.001)])


@pytest.mark.parametrize("replicas,capacity,peers,says", [
    (1, None, 2, "--replicas 1 over 2 peers is 1/0; rank 1 computes none; --replicas 2 gives "
                 "every peer its share"),
    (2, "1,1,1", 3, "is 1/1/0 (the capacities ask for 0.667/0.667/0.667); rank 2 computes "
                    "none; --replicas 4 gives every peer some"),
    (4, "1,2,5", 3, "is 1/1/2 (the capacities ask for 0.5/1/2.5); --replicas 8 gives every "
                    "peer its share"),
    (2, None, 2, None),
    # every peer has some, and no divisor of 8 splits in proportion: no worse R suggested
    (8, "1,1,1,2", 4, "(the capacities ask for 1.6/1.6/1.6/3.2)"),
])
def test_local_peers_of_a_sync_every_run_hear_how_whole_replicas_split(replicas, capacity, peers,
                                                                       says):
    """Two desktops on `--sync-every H` (one replica by default) left the second idle with
    no word, and --capacity's note spoke of microbatches, which such a run does not split."""
    from pynode.cli.flags import parse_capacity, replicas_note

    cfg = RunConfig.from_dict({**CONFIG, "replicas": replicas})
    note = replicas_note(cfg, parse_capacity(capacity, peers), peers)
    assert note == says if says is None else says in note
    if capacity == "1,1,1,2":
        assert "gives every peer" not in note, note


def test_a_cancel_stops_an_outer_step_between_its_inner_steps(checks):
    """Ctrl-C cancels the command's task, but an outer step awaits nothing for its H inner
    steps: the cancel waited for all of them, and in the last outer step came after the
    run said it had finished. It now lands after the inner step under way; the state stays
    the last boundary's."""
    cfg = RunConfig.from_dict({**CONFIG, "sync_every": 6, "steps": 12, "replicas": 1})
    trainer = checks.make_trainer(cfg, None, None)
    before = trainer.state.hash()
    inner: list[int] = []

    def on_inner(replica: int, step: int) -> None:
        inner.append(step)
        if step == 2:  # Ctrl-C arrives during the second inner step
            asyncio.current_task().cancel()

    trainer.after_inner.append(on_inner)

    async def outer_step() -> None:
        await trainer.step()

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(outer_step())
    assert inner == [1, 2]  # not 1..6
    assert trainer.state.step == 0 and trainer.state.hash() == before


def test_a_sync_every_run_times_its_full_outer_steps(checks):
    """--summary held no timings for a --sync-every run ("phase_ms_per_step": {} on every
    rank): its outer steps never reached the step clock."""
    trainer = checks.make_trainer(RunConfig.from_dict(CONFIG), None, None)  # steps 3, 6, 7

    async def run() -> None:
        for _ in OUTER_STEPS:
            await trainer.step()

    asyncio.run(run())
    timings = trainer.clock.timings()
    # the first pays for start-up and the last is a shorter outer step: only step 6's
    assert [row[0] for row in timings["step_ms"]] == [6]
    phases = timings["phase_ms_per_step"]
    assert phases["compute"] > 0 and phases["hash"] > 0 and phases["verify"] == 0
    assert sum(phases.values()) == pytest.approx(timings["step_ms"][0][1])


def test_a_per_step_checkpoint_that_holds_an_outer_lr_still_loads(tmp_path):
    """Before --outer-lr was refused on a per-step run, such a run wrote it into its
    checkpoints: those still resume (and generate), and the flag given again is refused."""
    from pynode.run.assemble import read_resume
    from pynode.run.trainer import Trainer
    from pynode.tasks.gpt import GPTTask

    old = Trainer(RunConfig(width=32, layers=1, heads=2, seq=16, microbatches=8, outer_lr=1.0),
                  GPTTask(), None)
    cfg, _ = read_resume(old.state_bytes(), {"steps": 9})
    assert (cfg.sync_every, cfg.outer_lr, cfg.steps) == (1, 1.0, 9)
    with pytest.raises(ConfigError, match="the flags given with --resume do not fit its run: "
                                          "outer_lr 0.5 set the outer step"):
        read_resume(old.state_bytes(), {"outer_lr": 0.5})


def test_the_first_line_of_a_sync_every_run_says_its_outer_steps_go_unchecked(checks):
    from pynode.cli.report import run_header

    trainer = checks.make_trainer(RunConfig.from_dict(CONFIG), None, None)
    assert run_header(trainer).endswith("sync every 3 steps over 4 replicas  (no cross-peer "
                                        "checks: not yet in outer steps)")
    quiet = checks.make_trainer(RunConfig.from_dict({**CONFIG, "cross_check": 0}), None, None)
    assert run_header(quiet).endswith("sync every 3 steps over 4 replicas")


def test_the_first_line_says_when_sync_every_outlasts_the_run(checks):
    """An H longer than what is left of the run is one shorter outer step: said, not silent."""
    from pynode.cli.report import run_header

    long = {**CONFIG, "cross_check": 0, "sync_every": 9}
    trainer = checks.make_trainer(RunConfig.from_dict(long), None, None)
    assert run_header(trainer).endswith("sync every 9 steps over 4 replicas (one outer step: "
                                        "the run has 7 steps left)")
    trainer.state.step = 6
    assert run_header(trainer).endswith("(one outer step: the run has 1 step left)")
    exact = checks.make_trainer(RunConfig.from_dict({**long, "sync_every": 7}), None, None)
    assert run_header(exact).endswith("sync every 7 steps over 4 replicas")


def test_the_first_line_says_when_a_given_warmup_outlasts_the_run(checks):
    """--warmup 40 on a 7-step run: the rate rises all the way and never reaches --lr, said
    in the header; the default warm-up of a short trial run is not."""
    from pynode.cli.report import run_header

    per_step = {**CONFIG, "sync_every": 1, "replicas": 1, "cross_check": 0}
    long = checks.make_trainer(RunConfig.from_dict({**per_step, "warmup": 40}), None, None)
    assert run_header(long).endswith("from step 0  (--warmup 40 is longer than the run's 7 "
                                     "steps: the learning rate rises to 18% of --lr, never "
                                     "to it)")
    trial = checks.make_trainer(RunConfig.from_dict(per_step), None, None)  # warm-up 10
    assert run_header(trial).endswith("from step 0")
    far = checks.make_trainer(RunConfig.from_dict({**per_step, "warmup": 1000}), None, None)
    assert run_header(far).endswith("rises to 0.7% of --lr, never to it)")  # not "0%"
    fits = checks.make_trainer(RunConfig.from_dict({**per_step, "warmup": 7}), None, None)
    assert run_header(fits).endswith("from step 0")
