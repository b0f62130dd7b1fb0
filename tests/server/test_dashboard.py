"""/dashboard and /api/runs: what a run may report (status, never weights), who may report
it (the token the server issued), what anyone sees, and a real `cluster` run reporting to a
real server over HTTP while it trains."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from server.runs import MAX_POINTS, RunBoard, RunReportError, UnknownRunError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pynode_runs import Launched, free_port  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ------------------------------------------------------------------ the board, no I/O
def test_a_registered_run_shows_its_ranks_and_loss_points_but_never_its_token():
    board = RunBoard(max_runs=4, idle_s=60)
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
    board = RunBoard(max_runs=4, idle_s=60)
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
    board = RunBoard(max_runs=4, idle_s=60)
    run, token = board.register({"world": 2})
    before = board.views()
    with pytest.raises(RunReportError, match=match):
        board.report(run, token, record)
    assert board.views() == before


def test_another_token_or_run_is_unknown():
    board = RunBoard(max_runs=4, idle_s=60)
    run, token = board.register({"world": 1})
    other, other_token = board.register({"world": 1})
    with pytest.raises(UnknownRunError):
        board.report(run, other_token, {"rank": 0, "step": 1})
    with pytest.raises(UnknownRunError):
        board.report("feedbeef", token, {"rank": 0, "step": 1})
    assert all(view["ranks"] == [] for view in board.views())


def test_idle_runs_are_forgotten_and_a_full_board_drops_the_stalest():
    clock = Clock()
    board = RunBoard(max_runs=2, idle_s=60, clock=clock)
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
    board = RunBoard(max_runs=1, idle_s=60)
    run, token = board.register({"world": 1})
    for start in range(1, MAX_POINTS + 600, 500):
        board.report(run, token, {"rank": 0, "points": [[s, 1.0 / s, None] for s in
                                                        range(start, start + 500)]})
    points = board.views()[0]["points"]
    assert len(points) <= MAX_POINTS and points[-1][0] == start + 499
    assert [p[0] for p in points] == sorted({p[0] for p in points})


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
    assert client.post(url, json={"rank": 0, "step": 1, "loss": 5.5},
                       headers={"Authorization": f"Bearer {token}"}).status_code == 204
    listed = client.get("/api/runs")
    assert listed.headers["Cache-Control"] == "no-store"
    assert listed.json["runs"][0]["ranks"][0]["loss"] == 5.5
    assert token not in listed.get_data(as_text=True)
    page = client.get("/dashboard")
    assert page.status_code == 200 and b"/static/dashboard.js" in page.data
    assert client.get("/static/dashboard.js").status_code == 200
    assert client.post("/api/runs", json={"world": 0}).status_code == 400


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
    for rank, d in enumerate(done):
        (line,) = [ln for ln in d.err.splitlines() if ln.startswith(f"rank {rank}: finished (")]
        assert f"step {steps}/{steps}, state hash {done[0].final_hash[:16]}" in line


def test_a_dashboard_that_is_not_a_server_is_refused_before_training(tmp_path):
    run = Launched(tmp_path, "bad", ["train", "--steps", "1", "--width", "8", "--layers", "1",
                                     "--heads", "1", "--seq", "8", "--dashboard",
                                     f"http://127.0.0.1:{free_port()}"], {})
    done = run.wait()
    assert done.rc == 2 and "DashboardError" in done.err and "no DaisyChain server" in done.err
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
