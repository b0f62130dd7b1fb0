"""/dashboard and /api/runs: what a run may report (status, never weights), who may report
it (the token the server issued), what anyone sees, a run that comes back after its server
restarted, and a real `cluster` run reporting to a real server over HTTP while it trains."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from server.runs import (
    MAX_POINTS,
    MAX_POINTS_PER_REPORT,
    BadTokenError,
    RunBoard,
    RunReportError,
    UnknownRunError,
)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pynode_runs import Launched, free_port  # noqa: E402

SECRET = b"the server's persisted secret, 32"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ the board, no I/O
def test_a_registered_run_shows_its_ranks_and_loss_points_but_never_its_token():
    board = RunBoard(max_runs=4, idle_s=60, secret=SECRET)
    run, token = board.register({"name": "n", "command": "cluster", "world": 2})
    board.report(run, token, {"rank": 1, "state": "training", "step": 3, "loss": 2.5,
                              "cores": 4, "runtime": "native"})
    board.report(run, token, {"rank": 0, "step": 3, "loss": 2.5,
                              "points": [[1, 3.0, None], [2, 2.75, 2.9], [3, 2.5, None]]})
    board.report(run, token, {"rank": 0, "step": 3, "points": [[3, 2.5, None]]})  # resent
    (view,) = board.views()
    assert view["run"] == run and view["world"] == 2
    assert [r["rank"] for r in view["ranks"]] == [0, 1]
    assert view["ranks"][1]["cores"] == 4 and view["ranks"][1]["state"] == "training"
    assert view["points"] == [[1, 3.0, None], [2, 2.75, 2.9], [3, 2.5, None]]
    assert token not in json.dumps(board.views())


def test_a_room_peer_waiting_for_a_run_says_so_then_training(monkeypatch):
    """A `join` peer reported "training" (no step) for as long as it waited for a room's
    run, and the board's silence check never fired for it."""
    from types import SimpleNamespace

    from pynode.cli import dashboard

    posted: list[dict] = []
    monkeypatch.setattr(dashboard, "post_json",
                        lambda url, body, token=None: posted.append(body) or b"{}")
    reporter = dashboard.StatusReporter(dashboard.DashboardRun("http://board", "r", "t"), 0,
                                        state="waiting")
    waiting = dict(reporter.status)
    reporter.attach(SimpleNamespace(cfg=SimpleNamespace(steps=5), state=SimpleNamespace(step=0),
                                    gemm=None))
    assert reporter.status["state"] == "training"  # its room's run started
    reporter.finish("finished")
    assert waiting["state"] == "waiting" and posted[-1]["state"] == "finished"
    assert reporter.status["steps"] == 5
    board = RunBoard(max_runs=4, idle_s=60, secret=SECRET)
    run, token = board.register({"name": "join", "command": "join", "world": 1})
    board.report(run, token, {"rank": 0, "state": "waiting"})  # a state the board takes
    assert board.views()[0]["ranks"][0]["state"] == "waiting"


@pytest.mark.parametrize("record, match", [
    ({"rank": 0, "weights": [0.1, 0.2]}, "unknown fields: weights"),
    ({"rank": 0, "gradients": "AAAA"}, "unknown fields: gradients"),
    ({"rank": 0, "loss": "2.5"}, "'loss' must be int or float"),
    ({"rank": 0, "loss": float("nan")}, "'loss' must be finite"),
    ({"rank": 0, "hash": "x" * 500}, "'hash' is longer than"),
    ({"rank": 0, "state": "exploded"}, "'state' must be one of"),
    ({"rank": 2}, "'rank' must be in 0..1"),
    ({"step": 1}, "'rank' must be in 0..1"),
    ({"rank": 0, "points": [[1, 2.0]]}, "each point is"),
    ({"rank": 0, "points": [[1, 2.0, None]] * 513}, "at most 512"),
    ([1, 2], "a report is a JSON object"),
])
def test_anything_but_status_is_refused_by_name_and_changes_nothing(record, match):
    board = RunBoard(max_runs=4, idle_s=60, secret=SECRET)
    run, token = board.register({"world": 2})
    before = board.views()
    with pytest.raises(RunReportError, match=match):
        board.report(run, token, record)
    assert board.views() == before


def test_another_token_or_run_is_unknown():
    board = RunBoard(max_runs=4, idle_s=60, secret=SECRET)
    run, token = board.register({"world": 1})
    other, other_token = board.register({"world": 1})
    with pytest.raises(UnknownRunError):
        board.report(run, other_token, {"rank": 0, "step": 1})
    with pytest.raises(UnknownRunError):
        board.report("feedbeef", token, {"rank": 0, "step": 1})
    assert all(view["ranks"] == [] for view in board.views())


def test_idle_runs_are_forgotten_and_a_full_board_drops_the_stalest():
    clock = Clock()
    board = RunBoard(max_runs=2, idle_s=60, secret=SECRET, clock=clock)
    a, a_token = board.register({"world": 1})
    clock.now += 10
    b, _ = board.register({"world": 1})
    clock.now += 10
    board.report(a, a_token, {"rank": 0, "step": 1})  # a is fresher than b now
    c, _ = board.register({"world": 1})
    assert {v["run"] for v in board.views()} == {a, c}
    clock.now += 61
    assert board.views() == []


def test_a_long_curve_is_thinned_and_keeps_its_newest_point():
    board = RunBoard(max_runs=1, idle_s=60, secret=SECRET)
    run, token = board.register({"world": 1})
    for start in range(1, MAX_POINTS + 600, 500):
        board.report(run, token, {"rank": 0, "points": [[s, 1.0 / s, None] for s in
                                                        range(start, start + 500)]})
    points = board.views()[0]["points"]
    assert len(points) <= MAX_POINTS and points[-1][0] == start + 499
    assert [p[0] for p in points] == sorted({p[0] for p in points})


# ------------------------------------------------------------------ a server that restarted
def test_a_token_holds_on_any_board_of_the_same_secret_and_no_other():
    """The token is the secret's, not the board's memory: a new board of the same secret
    (the server restarted) checks it, one of another secret does not."""
    run, token = RunBoard(max_runs=4, idle_s=60, secret=SECRET).register({"world": 1})
    again = RunBoard(max_runs=4, idle_s=60, secret=SECRET)
    assert again.token_for(run) == token
    assert again.register_again({"run": run, "token": token, "world": 1}) is True
    again.report(run, token, {"rank": 0, "step": 1})
    other = RunBoard(max_runs=4, idle_s=60, secret=b"another server's secret, 32 bytes")
    with pytest.raises(BadTokenError, match=f"run '{run}': not its token on this server"):
        other.register_again({"run": run, "token": token, "world": 1})
    assert other.views() == []


def test_registering_again_brings_the_run_back_with_its_id_name_and_world():
    first = RunBoard(max_runs=4, idle_s=60, secret=SECRET)
    run, token = first.register({"name": "cluster on a", "command": "cluster", "world": 3})
    first.report(run, token, {"rank": 0, "step": 2, "points": [[1, 3.0, None], [2, 2.5, None]]})
    board = RunBoard(max_runs=4, idle_s=60, secret=SECRET)  # the server restarted
    with pytest.raises(UnknownRunError):
        board.report(run, token, {"rank": 0, "step": 3})
    assert board.register_again({"run": run, "token": token, "name": "cluster on a",
                                 "command": "cluster", "world": 3}) is True
    (view,) = board.views()
    assert (view["run"], view["name"], view["command"], view["world"]) == \
        (run, "cluster on a", "cluster", 3)
    assert view["ranks"] == [] and view["points"] == []  # until reports bring them
    board.report(run, token, {"rank": 2, "step": 3})  # the world it was registered with
    board.report(run, token, {"rank": 0, "step": 3, "points": [[1, 3.0, None], [2, 2.5, None],
                                                               [3, 2.25, None]]})
    assert board.views()[0]["points"] == [[1, 3.0, None], [2, 2.5, None], [3, 2.25, None]]
    assert token not in json.dumps(board.views())


@pytest.mark.parametrize("record, error, match", [
    ({"token": "forged", "world": 1}, BadTokenError, "run '.*': not its token on this server"),
    ({"token": "ünïcode", "world": 1}, BadTokenError, "run '.*': not its token on this server"),
    ({"token": None, "world": 1}, RunReportError, "takes both its 'run' id and its 'token'"),
    ({"token": 5, "world": 1}, RunReportError, "'token' must be str"),
    ({"world": 0}, RunReportError, "'world' must be in 1..1024"),
    ({"weights": [1.0]}, RunReportError, "unknown fields: weights"),
])
def test_registering_again_without_the_runs_token_is_refused_and_changes_nothing(
        record, error, match):
    """`record`: the registration but its id (with the run's own token unless it says)."""
    board = RunBoard(max_runs=4, idle_s=60, secret=SECRET)
    run, token = board.register({"name": "n", "world": 2})
    board.report(run, token, {"rank": 0, "step": 1, "points": [[1, 2.0, None]]})
    other, _ = board.register({"world": 1})
    before = board.views()
    for run_id in (run, "feedbeefcafe0000"):  # a run the board has, one it has not
        with pytest.raises(error, match=match):
            board.register_again({"run": run_id, "token": token, **record})
        assert board.views() == before
    with pytest.raises(BadTokenError):  # another run's token is no token of this one
        board.register_again({"run": run, "token": board.token_for(other), "world": 2})
    assert board.views() == before


def test_a_run_the_board_has_stays_as_it_is_when_registered_again():
    clock = Clock()
    board = RunBoard(max_runs=4, idle_s=60, secret=SECRET, clock=clock)
    run, token = board.register({"name": "train on a", "command": "train", "world": 2})
    board.report(run, token, {"rank": 1, "step": 4, "points": []})
    board.report(run, token, {"rank": 0, "step": 4, "points": [[4, 1.5, None]]})
    clock.now += 5
    before = board.views()
    assert board.register_again({"run": run, "token": token, "name": "another name",
                                 "command": "cluster", "world": 1}) is False
    assert board.views() == before


def test_a_run_registered_again_keeps_the_board_limits():
    clock = Clock()
    first = RunBoard(max_runs=1, idle_s=60, secret=SECRET, clock=clock)
    run, token = first.register({"world": 1})
    board = RunBoard(max_runs=1, idle_s=60, secret=SECRET, clock=clock)
    newer, _ = board.register({"world": 1})
    clock.now += 1
    assert board.register_again({"run": run, "token": token, "world": 1}) is True
    assert [v["run"] for v in board.views()] == [run]  # a full board drops the stalest
    clock.now += 61
    assert board.views() == []  # and forgets an idle one
    assert board.register_again({"run": run, "token": token, "world": 1}) is True
    assert newer not in {v["run"] for v in board.views()}


# ------------------------------------------------------------------ HTTP
def test_the_routes_issue_tokens_check_them_and_serve_the_page(make_config):
    from server import create_app

    client = create_app(make_config(static_dir=None)).test_client()
    issued = client.post("/api/runs", json={"command": "train", "world": 1})
    assert issued.status_code == 201
    run, token = issued.json["run"], issued.json["token"]
    url = f"/api/runs/{run}/status"
    assert client.post(url, json={"rank": 0}).status_code == 401
    assert client.post(url, json={"rank": 0}, headers={"Authorization": "Bearer x"}
                       ).json["error"] == "unknown_run"
    bad = client.post(url, json={"rank": 0, "params": [1]},
                      headers={"Authorization": f"Bearer {token}"})
    assert bad.status_code == 400 and "unknown fields: params" in bad.json["message"]
    taken = client.post(url, json={"rank": 0, "step": 1, "loss": 5.5, "points": [[1, 5.5, None]]},
                        headers={"Authorization": f"Bearer {token}"})
    assert (taken.status_code, taken.json) == (200, {"first_point": 1})
    listed = client.get("/api/runs")
    assert listed.headers["Cache-Control"] == "no-store"
    assert listed.json["runs"][0]["ranks"][0]["loss"] == 5.5
    assert token not in listed.get_data(as_text=True)
    page = client.get("/dashboard")
    assert page.status_code == 200 and b"/static/dashboard.js" in page.data
    assert client.get("/static/dashboard.js").status_code == 200
    assert client.post("/api/runs", json={"world": 0}).status_code == 400


def test_the_route_registers_a_run_again_on_a_restarted_server_and_refuses_other_tokens(
        make_config):
    """A new app on the same data folder is the server restarted: it has forgotten the run
    and takes it back (201, then 200: idempotent); a forged token, or the token on a server
    given another secret, is refused as bad_token, and the board stays as it was."""
    from server import create_app

    first = create_app(make_config(static_dir=None)).test_client()
    issued = first.post("/api/runs", json={"name": "n", "command": "train", "world": 1})
    run, token = issued.json["run"], issued.json["token"]
    restarted = create_app(make_config(static_dir=None)).test_client()
    url, auth = f"/api/runs/{run}/status", {"Authorization": f"Bearer {token}"}
    assert restarted.post(url, json={"rank": 0}, headers=auth).json["error"] == "unknown_run"
    again = {"run": run, "token": token, "name": "n", "command": "train", "world": 1}
    back = restarted.post("/api/runs", json=again)
    assert back.status_code == 201 and (back.json["run"], back.json["token"]) == (run, token)
    assert back.headers["Cache-Control"] == "no-store"
    assert restarted.post("/api/runs", json=again).status_code == 200
    first = restarted.post(url, json={"rank": 0, "step": 1}, headers=auth)
    assert (first.status_code, first.json) == (200, {"first_point": None})  # no points yet
    before = restarted.get("/api/runs").json
    assert [(v["run"], v["name"]) for v in before["runs"]] == [(run, "n")]
    forged = restarted.post("/api/runs", json={**again, "token": "A" * len(token)})
    assert forged.status_code == 403 and forged.json["error"] == "bad_token"
    assert f"run '{run}': not its token on this server" in forged.json["message"]
    half = restarted.post("/api/runs", json={"run": run, "world": 1})
    assert half.status_code == 400 and half.json["error"] == "bad_registration"
    assert [v["run"] for v in restarted.get("/api/runs").json["runs"]] == [run]
    renewed = create_app(make_config(static_dir=None, secret="a new secret, 16+ chars")
                         ).test_client()
    refused = renewed.post("/api/runs", json=again)
    assert refused.status_code == 403 and refused.json["error"] == "bad_token"
    assert renewed.get("/api/runs").json["runs"] == []


# ------------------------------------------------------------------ a real run
@pytest.mark.slow
def test_a_cluster_run_appears_on_the_dashboard_with_its_ranks_and_live_loss(
        live, make_config, tmp_path):
    """Two gloo ranks with --dashboard on rank 0: while they train, /api/runs shows both
    ranks and a growing loss curve; at the end both finished, and the curve is the loss of
    every step exactly as rank 0's --log wrote it. Every rank prints its one status line."""
    server = live(make_config(static_dir=None))
    # 160 steps: several seconds, so that a few of the once-a-second reports land mid-run
    # (40 steps took ~3 s, and once no report showed both ranks training before it ended)
    steps = 160
    config = ["--steps", str(steps), "--width", "32", "--layers", "1", "--heads", "2", "--seq",
              "16", "--microbatch-size", "2", "--microbatches", "4", "--no-progress",
              "--kernels", "numpy", "--eval-every", "80"]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    ranks = [Launched(tmp_path, "rank0", ["cluster", *config, "--dashboard", server.url],
                      {**env, "RANK": "0"}),
             Launched(tmp_path, "rank1", ["cluster", *config], {**env, "RANK": "1"})]
    live_views = []
    deadline = time.monotonic() + 240
    while any(r.proc.poll() is None for r in ranks) and time.monotonic() < deadline:
        with urllib.request.urlopen(f"{server.url}/api/runs", timeout=5) as reply:
            runs = json.loads(reply.read())["runs"]
        if runs and len(runs[0]["ranks"]) == 2 and runs[0]["points"] and all(
                r.get("state") == "training" for r in runs[0]["ranks"]):
            live_views.append(runs[0])
        time.sleep(0.1)
    done = [r.wait() for r in ranks]
    assert [d.rc for d in done] == [0, 0], done[0].err[-2000:] + done[1].err[-2000:]
    assert live_views, "no view showed both ranks training with a loss"
    assert 0 < live_views[0]["points"][-1][0] < steps  # seen mid-run: the loss is live
    (final,) = json.loads(urllib.request.urlopen(f"{server.url}/api/runs").read())["runs"]
    assert final["command"] == "cluster" and final["world"] == 2
    assert final["name"] == f"cluster on {socket.gethostname()}"  # whose card it is
    assert [(r["rank"], r["state"], r["step"], r["runtime"]) for r in final["ranks"]] == \
        [(0, "finished", steps, "native"), (1, "finished", steps, "native")]
    for rank in final["ranks"]:
        assert rank["cores"] >= 1 and rank["bytes_sent"] > 0 and 0 < rank["share"] <= 1
        assert rank["bytes_received"] > 0
        assert rank["hash"] == done[0].final_hash[:16]
    log = done[0].log
    assert final["points"] == [[row["step"], row["loss"], row.get("heldout")] for row in log]
    assert [p[2] is not None for p in final["points"]] == [s % 80 == 0 for s in range(1, steps + 1)]
    # rank 0 says where the run's card is: its anchor on /dashboard
    assert f"dashboard: {server.url}/dashboard#run-{final['run']} (this run's card)" in \
        done[0].err
    for rank, d in enumerate(done):
        # rank 1 of a cluster says it at its terminal's time, as its other lines
        (line,) = [ln for ln in d.err.splitlines()
                   if re.match(rf"(\d\d:\d\d:\d\d )?rank {rank}: finished \(", ln)]
        assert f"step {steps}/{steps}, state hash {done[0].final_hash[:16]}" in line


# ------------------------------------------------------------------ the reporter, restarts
def test_a_shared_run_carries_what_it_was_registered_as_and_old_blobs_still_read():
    from pynode.cli.dashboard import DashboardRun

    run = DashboardRun("http://h:8000", "ab12", "tok", "cluster on a", "cluster", 4)
    assert DashboardRun.from_bytes(run.to_bytes()) == run
    old = DashboardRun.from_bytes(b'{"url": "http://h:8000", "run": "ab12", "token": "tok"}')
    assert (old.run, old.token, old.name, old.command, old.world) == ("ab12", "tok", "", "", 1)
    assert DashboardRun.from_bytes(b"") is None


def test_the_reporter_keeps_the_curve_as_the_server_keeps_it():
    """What rank 0 sends again after a restart is what the server had: the same thinning,
    checked against the board itself fed the same reports."""
    from pynode.cli import dashboard

    assert (dashboard.MAX_POINTS, dashboard.MAX_POINTS_PER_REPORT) == \
        (MAX_POINTS, MAX_POINTS_PER_REPORT)
    board = RunBoard(max_runs=1, idle_s=60, secret=SECRET)
    run, token = board.register({"world": 1})
    sent: list[list] = []
    for start in range(1, 3 * MAX_POINTS, 300):
        points = [[s, 1.0 / s, None] for s in range(start, start + 300)]
        board.report(run, token, {"rank": 0, "points": points})
        sent = dashboard.thinned(sent + points)
        assert sent == board.views()[0]["points"]
    assert len(sent) < MAX_POINTS < start


def steps(reporter, first: int, last: int) -> None:
    from pynode.run.trainer import StepResult

    for step in range(first, last + 1):
        reporter(StepResult(step=step, loss=4.0 - step / 8, hash=f"{step:016x}", probe="",
                            heldout=3.5 if step % 4 == 0 else None))


def wait_for_run(url: str, seen, timeout: float = 20.0) -> dict:
    """The first run /api/runs at `url` shows for which `seen(run)` holds."""
    until = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"{url}/api/runs", timeout=5) as reply:
            runs = json.loads(reply.read())["runs"]
        if runs and seen(runs[0]):
            return runs[0]
        assert time.monotonic() < until, f"timed out; the server shows {runs}"
        time.sleep(0.1)


def expected_points(last: int) -> list[list]:
    return [[s, 4.0 - s / 8, 3.5 if s % 4 == 0 else None] for s in range(1, last + 1)]


@pytest.mark.slow
def test_a_run_comes_back_whole_on_its_server_restarted(tmp_path, caplog):
    """`python -m server` restarted on its port and data folder (so, its secret): the run
    that reported to it shows again under the same id and name, with every loss point of
    before the restart and of while it was down, and says so once at INFO."""
    from attack_kit import ServerProcess

    from pynode.cli.dashboard import StatusReporter, register

    caplog.set_level(logging.INFO, logger="pynode.dashboard")
    servers = [ServerProcess(tmp_path / "server")]
    try:
        target = register(servers[0].url, "train", 2, name="train on a")
        reporters = [StatusReporter(target, 0), StatusReporter(target, 1)]
        steps(reporters[0], 1, 6)
        wait_for_run(servers[0].url, lambda run: len(run["points"]) == 6)
        servers[0].stop()
        steps(reporters[0], 7, 9)  # reported to no server: sent again with the rest
        time.sleep(2)  # a report or two of each rank fails while the server is down
        with reporters[0].wake:  # rank 0 is slow to come back: rank 1 brings the run back
            servers.append(ServerProcess(tmp_path / "server", port=servers[0].port))
            wait_for_run(servers[1].url, lambda run: len(run["ranks"]) == 1)
        steps(reporters[0], 10, 12)
        back = wait_for_run(servers[1].url, lambda run: len(run["points"]) == 12
                            and len(run["ranks"]) == 2)
        for reporter in reporters:
            reporter.finish("finished")
        final = wait_for_run(servers[1].url, lambda run: all(
            rank["state"] == "finished" for rank in run["ranks"]))
    finally:
        for server in servers:
            server.stop()
    assert (back["run"], back["name"], back["command"], back["world"]) == \
        (target.run, "train on a", "train", 2)
    assert back["points"] == expected_points(12) == final["points"]
    assert final["ranks"][0]["step"] == 12
    said = [r for r in caplog.records if r.name == "pynode.dashboard"]
    again = [r.getMessage() for r in said if "registered again" in r.getMessage()]
    # the rank that met the restart first brought the run back; the other may have found
    # it there, or met the restart too; each says it at most once
    ranks = [line.split(":")[0] for line in again]
    assert again and len(set(ranks)) == len(ranks) and all(target.run in m for m in again)
    back_again = [r.getMessage() for r in said if "takes status reports again" in r.getMessage()]
    assert all(r.levelno == logging.WARNING for r in said
               if r.getMessage() not in again + back_again)


def test_a_server_with_another_secret_refuses_the_run_in_one_warning(make_config, tmp_path,
                                                                     caplog):
    """A server restarted with another secret cannot tell the run's token from a forged
    one: the reporter says so once (the server's own words) and the run stays off it."""
    from server_testkit import LiveServer

    from pynode.cli.dashboard import StatusReporter, register
    from server import create_app

    caplog.set_level(logging.INFO, logger="pynode.dashboard")
    first = LiveServer(create_app(make_config(static_dir=None)))
    try:
        target = register(first.url, "train", 1, name="train on a")
    finally:
        first.stop()
    # first no server at all (the outage's one warning), then one with another secret
    reporter = StatusReporter(target, 0)
    steps(reporter, 1, 2)
    time.sleep(1.5)
    renewed = LiveServer(create_app(make_config(static_dir=None, data_dir=tmp_path / "new")),
                         port=first.port)
    try:
        steps(reporter, 3, 3)
        time.sleep(1.5)  # a report after the refusal: refused again, said no more
        steps(reporter, 4, 5)
        reporter.finish("finished")
        with urllib.request.urlopen(f"{renewed.url}/api/runs", timeout=5) as reply:
            assert json.loads(reply.read())["runs"] == []
    finally:
        renewed.stop()
    said = [r for r in caplog.records if r.name == "pynode.dashboard"]
    assert [r.levelno for r in said] == [logging.WARNING] * 2, [r.getMessage() for r in said]
    assert "Connection refused" in said[0].getMessage()
    # the refusal is said although the outage's warning came first (it was swallowed)
    assert "refused it again: HTTP 403: run '" in said[1].getMessage()
    assert said[1].getMessage().endswith("training goes on, and this run sends it no more")


def test_a_dashboard_that_is_not_a_server_is_refused_before_training(tmp_path):
    run = Launched(tmp_path, "bad", ["train", "--steps", "1", "--width", "8", "--layers", "1",
                                     "--heads", "1", "--seq", "8", "--dashboard",
                                     f"http://127.0.0.1:{free_port()}"], {})
    done = run.wait()
    assert done.rc == 2 and "DashboardError" in done.err and "no DaisyChain server" in done.err
    # in words, with the next step (not "<urlopen error [Errno 111] Connection refused>")
    assert "(Connection refused): is `python -m server` running there?" in done.err, done.err
    assert "urlopen" not in done.err and "Errno" not in done.err, done.err
    assert not os.path.exists(tmp_path / "bad.jsonl") or done.log == []


def test_uplot_is_served_from_the_fetched_copy_or_named_missing(make_config, monkeypatch,
                                                                tmp_path):
    from server import create_app
    from server.chartlib import MANIFEST_NAME, UPLOT_VERSION, uplot_path

    client = create_app(make_config()).test_client()
    if (uplot_path() / MANIFEST_NAME).is_file():  # fetched here (make test fetches it)
        script = client.get("/vendor/uplot/uPlot.iife.min.js")
        assert script.status_code == 200 and script.mimetype == "text/javascript"
        assert b"uPlot" in script.data
        assert client.get("/vendor/uplot/package.json").status_code == 404
    monkeypatch.setenv("DAISYCHAIN_CACHE", str(tmp_path / "empty-cache"))
    missing = client.get("/vendor/uplot/uPlot.iife.min.js")
    assert missing.status_code == 503
    assert "python -m server.chartlib fetch" in missing.json["message"]
    assert f"uPlot {UPLOT_VERSION} is not fetched" in missing.json["message"]


def test_an_http_refusal_is_one_line_and_the_dashboard_address_means_its_server(monkeypatch):
    """The address the browser shows (…/dashboard) is taken for the server's; another
    server's error page is never printed, a DaisyChain refusal is given in its own words."""
    import io
    import urllib.error

    from pynode.cli import dashboard

    def error(code: int, body: bytes) -> urllib.error.HTTPError:
        return urllib.error.HTTPError("http://x/api/runs", code, "x", {}, io.BytesIO(body))

    page = error(404, b"<!doctype html>\n<title>404 Not Found</title>\n<h1>Not Found</h1>")
    said = dashboard.refusal(page)
    assert "\n" not in said and "doctype" not in said and "http(s)://HOST:PORT" in said
    ours = error(400, b'{"error": "bad_world", "message": "world must be 1 to 4096"}')
    assert dashboard.refusal(ours) == "HTTP 400: world must be 1 to 4096"

    posted = []
    monkeypatch.setattr(dashboard, "post_json",
                        lambda url, body, token=None: posted.append((url, body)) or
                        b'{"run": "r", "token": "t"}')
    run = dashboard.register("http://127.0.0.1:8000/dashboard/", "train", 1)
    assert posted == [("http://127.0.0.1:8000/api/runs", {
        "name": f"train on {socket.gethostname()}", "command": "train", "world": 1})]
    assert run.url == "http://127.0.0.1:8000"
    # the card's address every run prints (…/dashboard#run-ID), given to the next run: its
    # fragment went into the POST's path (HTTP 405, "not a DaisyChain server's answer")
    for given in ("http://127.0.0.1:8000/dashboard#run-4e4de57f9c1d8b1e",
                  "http://127.0.0.1:8000/dashboard?x=1#run-4e4de57f9c1d8b1e",
                  "http://127.0.0.1:8000/#run-1", "http://127.0.0.1:8000"):
        posted.clear()
        assert dashboard.register(given, "train", 1).url == "http://127.0.0.1:8000", given
        assert posted[0][0] == "http://127.0.0.1:8000/api/runs", (given, posted)
    # a server under a path prefix keeps it
    assert dashboard.server_of("https://h.example/dc/dashboard#run-1") == "https://h.example/dc"


def test_a_curve_sent_again_merges_in_by_step():
    """Rank 0's whole curve, sent again after another rank brought the run back, lands
    before the points already there (they were appended only after the last step)."""
    board = RunBoard(8, 3600, secret=b"s" * 32)
    run, token = board.register({"name": "n", "command": "train", "world": 2})
    assert board.report(run, token, {"rank": 1, "step": 9}) is None
    assert board.report(run, token, {"rank": 0, "points": [[9, 3.0, None], [10, 2.9, None]]}) == 9
    history = [[s, 4.0 - s / 10, None] for s in range(1, 11)]
    assert board.report(run, token, {"rank": 0, "points": history}) == 1
    (view,) = board.views()
    assert [p[0] for p in view["points"]] == list(range(1, 11))
    assert view["points"][8] == [9, 3.1, None]  # the same step: the newer report's point


def test_a_reporter_closing_with_no_server_tries_its_last_report_once(monkeypatch):
    """Points a failed report put back kept a closing reporter posting without a pause
    (over 512 of them: ~3,000 requests a second, for good) and finish() waited 10 s."""
    from pynode.cli import dashboard as client
    from pynode.cli.dashboard import DashboardRun, StatusReporter

    posted = []

    def refused(url, body, token=None):
        posted.append(len(body.get("points", [])))
        raise OSError("Connection refused")

    monkeypatch.setattr(client, "post_json", refused)
    reporter = StatusReporter(DashboardRun("http://127.0.0.1:9", "r", "t", "n", "train", 1), 0)
    steps(reporter, 1, 600)  # a server down for 600 steps
    started = time.monotonic()
    reporter.finish("finished")
    assert time.monotonic() - started < 5 and not reporter.sender.is_alive()
    time.sleep(0.3)
    count = len(posted)
    time.sleep(0.3)
    assert len(posted) == count <= 3, posted


def test_the_command_line_shows_the_dashboards_notices_without_v(capsys):
    """The outage's warning promises that the next report taken says so; that line (and
    "registered again") is INFO, which the command line's WARNING level hid."""
    from pynode.cli.main import main

    assert main(["train", "--steps", "0"]) == 2  # refused after the logging is set up
    assert logging.getLogger("pynode.dashboard").isEnabledFor(logging.INFO)
    assert not logging.getLogger("pynode.run").isEnabledFor(logging.INFO)
