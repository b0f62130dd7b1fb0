"""The page's dashboard and control panel with two tabs and one native peer in one room: the
readiness banner, each peer's runtime, cores, RAM, speed and share, the pooled totals, the
loss chart (uPlot, served by our server) with the held-out loss, the native peer on
/dashboard, and the leader's pause, resume, learning-rate change and stop mid-run. The
hashes and held-out losses of every peer equal `python -m pynode train --schedule` of the
changes the page recorded. With DAISYCHAIN_SCREENSHOTS=1 the test writes the screenshots of
docs/images/."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest
from browser_helpers import approve_ids, param_count, status, wait, wait_booted, wait_trainable
from mixed_helpers import REPO, NativeJoin, reference_rows

from pynode.config import RunConfig
from pynode.run.assemble import memory_needed

pytestmark = [pytest.mark.slow]

CONFIG = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
          "microbatches": 6, "steps": 400, "lr": 0.003, "seed": 23, "eval_every": 5}
# 400 steps: the test pauses and stops the run itself, long before; fewer (20) could end
# on a loaded machine before the pause and the stop landed
ALL_SHOWN = """s => s.peers.length === 3 && s.peers.every(p => p.runtime && p.share !== null
    && p.microbatch_seconds !== null && p.bytes_sent > 0 && p.step >= 2)"""
SCREENSHOTS = REPO / "docs" / "images"


def test_two_tabs_and_a_native_peer_on_the_dashboard_steered_by_the_leader(
        tabs, net, server_url, tmp_path):
    host = tabs.open("?create=1")
    code = status(host)["room"]
    tab = tabs.open(f"?room={code}")
    native = NativeJoin(net, server_url, tmp_path, "native", "--room", code,
                        "--dashboard", server_url)
    try:
        ids = [status(tab)["peerId"], native.peer_id]
        approve_ids(host, *ids)
        wait_booted(host, tab)
        wait_trainable(host, ids)
        banner = host.inner_text("#readiness")
        assert banner.startswith("Checks passed; 3 peer(s) ready to train"), banner
        # the sliders: live parameter count and memory per peer, as pynode counts them
        assert f"{param_count(RunConfig()):,} parameters" in host.inner_text("#estimate")
        host.fill("[name=width-slider]", "128")
        assert host.input_value("[name=width]") == "128"
        wide = RunConfig(width=128)
        assert f"{param_count(wide):,} parameters, about " \
            f"{memory_needed(wide, param_count(wide)) / 2**20:.1f} MiB per peer" \
            in host.inner_text("#estimate")
        host.evaluate("(c) => daisychain.start(c)", CONFIG)
        wait(host, ALL_SHOWN, 120_000)  # mid-run: every peer has told its part of a step
        peers = {p["id"]: p for p in status(host)["peers"]}
        me = status(host)["peerId"]
        assert {pid: p["runtime"] for pid, p in peers.items()} == \
            {me: "browser", ids[0]: "browser", ids[1]: "native"}
        for p in peers.values():
            assert p["cores"] >= 1 and p["ram"] > 0 and p["gemm"], p
            assert p["tokens_per_s"] is not None, p
        rows = host.locator("#peers tbody tr")
        assert rows.count() == 3
        assert sorted(rows.locator("td.runtime").all_inner_texts()) == \
            ["browser", "browser", "native"]
        assert all(t.endswith("%") for t in rows.locator("td.share").all_inner_texts())
        assert all(t.endswith("ms") for t in rows.locator("td.microbatch").all_inner_texts())
        pooled = host.inner_text("#pooled")
        assert "pooled: 3 peer(s)" in pooled and "1 native, 2 browser" in pooled
        assert host.inner_text("#readiness").startswith("Training: step ")

        # the leader pauses: every peer waits between the same two steps
        host.click("#pause")
        for page in (host, tab):
            wait(page, "s => s.paused", 30_000)
        paused = status(host)["step"]
        native.wait_for(rf"paused after step {paused} by the leader", 30)
        assert host.inner_text("#readiness").startswith(f"Paused after step {paused}")
        if os.environ.get("DAISYCHAIN_SCREENSHOTS") == "1":
            SCREENSHOTS.mkdir(exist_ok=True)
            host.screenshot(path=str(SCREENSHOTS / "dashboard-training.png"), full_page=True)
        page_steps = [status(page)["step"] for page in (host, tab)]
        host.wait_for_timeout(1500)
        assert [status(page)["step"] for page in (host, tab)] == page_steps == [paused] * 2
        assert max(native.hashes()) == paused
        host.fill("#steer-lr", "0.001")
        host.click("#apply-change")  # while paused: it applies at the step reached
        wait(host, "s => s.schedule.length === 1", 30_000)
        # the member sees the change and may download it, without the leader's controls
        # (it was told "you lead it" beside disabled buttons)
        wait(tab, "s => s.schedule.length === 1", 30_000)
        assert tab.is_visible("#steer-record") and tab.is_visible("#download-schedule")
        assert not tab.is_visible("#steer-intro") and not tab.is_visible("#pause")
        assert host.is_visible("#steer-intro") and not host.is_visible("#steer-record")
        # a refused change shows at the top until a change that applies settles it
        host.fill("#steer-lr", "")
        host.fill("#steer-steps", "1")
        host.click("#apply-change")
        host.wait_for_selector("#alert", state="visible", timeout=30_000)
        assert host.inner_text("#alert-text").startswith("not applied: "), \
            host.inner_text("#alert-text")
        host.fill("#steer-steps", "")
        host.click("#resume-run")
        host.wait_for_selector("#alert", state="hidden", timeout=30_000)
        wait(host, "(s, at) => s.step >= at", 60_000, paused + 2)
        host.click("#stop")
        for page in (host, tab):
            wait(page, "s => ['done', 'failed'].includes(s.state)", 180_000)
        assert native.finish(60) == 0, native.messages()
        schedule = status(host)["schedule"]
        assert schedule == status(tab)["schedule"]
        assert [set(c) for c in schedule] == [{"step", "lr"}, {"step", "steps"}], schedule
        assert schedule[0] == {"step": paused, "lr": 0.001}
        stopped = schedule[1]["steps"]
        assert schedule[1]["step"] == stopped and paused + 2 <= stopped < CONFIG["steps"]
        replayed = tmp_path / "schedule.json"
        replayed.write_text(json.dumps(schedule))
        reference = reference_rows(CONFIG, tmp_path, "--schedule", str(replayed))
        assert [r["step"] for r in reference] == list(range(1, stopped + 1))
        for page in (host, tab):
            history = status(page)["history"]
            assert [(h["step"], h["hash"], h["heldout"]) for h in history] == \
                [(r["step"], r["hash"], r.get("heldout")) for r in reference]
        assert native.hashes() == {r["step"]: r["hash"] for r in reference}
        # a Stop is no finished run: the banner says so, and what Start does next
        said = host.inner_text("#readiness")
        assert said.startswith(f"Stopped at step {stopped} of {CONFIG['steps']}, state hash "
                               f"{reference[-1]['hash'][:16]}. Start begins a new run from "
                               "step 0"), said
        estimate = host.inner_text("#estimate")  # scaled from the speeds measured in the run
        assert re.search(r"about \d+ (ms|s) a step for these \d peer\(s\)", estimate), estimate

        # the chart: uPlot from this server, both series, axes, values under the cursor
        assert host.evaluate("() => typeof window.uPlot") == "function"
        assert host.locator("#loss-chart .uplot .u-axis").count() == 2
        legend = host.inner_text("#loss-chart .u-legend")
        assert "loss" in legend and "held-out" in legend
        over = host.locator("#loss-chart .u-over")
        box = over.bounding_box()
        over.hover(position={"x": box["width"] - 2, "y": box["height"] / 2})
        hovered = host.inner_text("#loss-chart .u-legend .u-series:nth-child(2) .u-value")
        assert any(c.isdigit() for c in hovered), hovered
        host.check("#log-scale")
        assert host.locator("#loss-chart .uplot").count() == 1

        runs = host.evaluate("async () => (await (await fetch('/api/runs')).json()).runs")
        (joined,) = [r for r in runs if r["command"] == "join"]
        (rank,) = joined["ranks"]
        assert rank["state"] == "finished" and rank["step"] == stopped
        assert [p[1] for p in joined["points"]] == [r["loss"] for r in reference]
        board = tab.context.new_page()
        board.goto(f"{server_url}/dashboard")
        board.wait_for_selector("section.run .uplot")
        assert board.locator("section.run tbody tr td").nth(1).inner_text() == "finished"
        if os.environ.get("DAISYCHAIN_SCREENSHOTS") == "1":
            board.screenshot(path=str(SCREENSHOTS / "runs-dashboard.png"), full_page=True)
    finally:
        native.kill()


def test_a_text_file_the_leader_uploads_trains_the_room_as_train_data_file(tabs, tmp_path):
    """The host picks "a file you upload" in the form and starts: the server keeps the
    text, both tabs fetch it and train on the hashes of `train --data FILE`."""
    text = tmp_path / "notes.txt"
    text.write_text("".join(f"note {i}: tabs read this upload, é 数. " for i in range(300)))
    host = tabs.open("?create=1")
    tab = tabs.open(f"?room={status(host)['room']}")
    approve_ids(host, status(tab)["peerId"])
    wait_booted(host, tab)
    wait_trainable(host, [status(tab)["peerId"]])
    form = {"width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
            "microbatches": 4, "steps": 3}
    for name, value in form.items():
        host.fill(f"#config-form [name={name}]", str(value))
    host.select_option("#config-form [name=data]", "upload")
    host.set_input_files("#data-file", str(text))
    host.click("#start")
    for page in (host, tab):
        wait(page, "s => ['done', 'failed'].includes(s.state)", 180_000)
    config = {"task": "gpt", **form, "lr": 0.003, "seed": 1}
    reference = reference_rows(config, tmp_path, "--data", str(text))
    for page in (host, tab):
        assert status(page)["config"]["data"].endswith(
            f"#sha256={hashlib.sha256(text.read_bytes()).hexdigest()}")
        assert [h["hash"] for h in status(page)["history"]] == [r["hash"] for r in reference]
    builtin = reference_rows(config, tmp_path)
    assert [r["hash"] for r in builtin] != [r["hash"] for r in reference]


REGISTER = """async (name) => (await (await fetch('/api/runs', {method: 'POST',
    headers: {'Content-Type': 'application/json'},
    body: JSON.stringify({name, command: 'train --peers 2', world: 2})})).json()).run"""


def test_the_dashboard_shows_the_newest_run_first(browser, server_url):
    """/api/runs lists runs newest first; the page put a run that registered while it was
    open below the older ones."""
    board = browser.new_page()
    try:
        board.goto(f"{server_url}/dashboard")
        older = board.evaluate(REGISTER, "older")
        board.wait_for_selector(f"section.run[data-run='{older}']")
        newer = board.evaluate(REGISTER, "newer")
        board.wait_for_selector(f"section.run[data-run='{newer}']")
        shown = board.evaluate(
            "() => [...document.querySelectorAll('section.run')].map(s => s.dataset.run)")
        assert shown[:2] == [newer, older]
        assert board.locator("#runs > section").first.get_attribute("id") == "runs-intro"
    finally:
        board.close()


def test_cards_of_one_command_say_when_each_started_and_where_a_resume_began(
        browser, server_url):
    """Two runs of `train --peers 2` on one machine had the same card line: it now says
    when each started (this computer's clock) and, for a run whose curve begins past
    step 1 (a resume), the step it begins at (a newcomer trial)."""
    points = REPORT.replace("points: []", "points: [[251, 2.5, null], [1200, 2.3456, null]]")
    board = browser.new_page()
    try:
        board.goto(f"{server_url}/dashboard")
        fresh = board.evaluate(REGISTER, "fresh")
        resumed = board.evaluate("""async (name) => (await (await fetch('/api/runs', {method:
            'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(
            {name, command: 'train --peers 2', world: 2})})).json())""", "resumed")
        assert board.evaluate(points, [resumed["run"], resumed["token"], 0]) == 200
        board.wait_for_function("(run) => document.querySelector(`section.run[data-run='${run}']"
                                " .run-line`)?.textContent.includes('at step 1200')",
                                arg=resumed["run"], timeout=10_000)
        lines = [board.inner_text(f"section.run[data-run='{run}'] .run-line")
                 for run in (fresh, resumed["run"])]
        now = board.evaluate("() => [new Date().getHours(), new Date().getMinutes()]")
    finally:
        board.close()
    started = re.compile(r"train --peers 2 · 2 ranks · started (\d\d):(\d\d):\d\d · ")
    for line in lines:
        match = started.match(line)
        assert match, line
        assert abs((int(match[1]) * 60 + int(match[2])) - (now[0] * 60 + now[1])) % 1439 <= 1
    assert lines[0].endswith(" · no step yet"), lines[0]
    assert lines[1].endswith(" · loss 2.3456 at step 1200 (from step 251)"), lines[1]


def test_the_address_a_run_prints_shows_its_card(browser, server_url):
    """`train --dashboard` says `dashboard: URL/dashboard#run-ID`: that card is scrolled to
    and marked once drawn (the runs are drawn after the page loads, so the browser's own
    look for the anchor found nothing)."""
    board = browser.new_page(viewport={"width": 1280, "height": 500})
    try:
        board.goto(f"{server_url}/dashboard")
        named = board.evaluate(REGISTER, "the one named")
        for i in range(4):  # newer runs above it, so that it is below the fold
            board.evaluate(REGISTER, f"newer {i}")
        board.goto(f"{server_url}/dashboard#run-{named}")
        board.wait_for_selector(f"section.run.named[data-run='{named}']")
        assert board.locator("section.run.named").count() == 1
        assert board.evaluate("() => window.scrollY") > 0
    finally:
        board.close()


REPORT = """async ([run, token, rank]) => (await fetch(`/api/runs/${run}/status`, {method: 'POST',
    headers: {'Content-Type': 'application/json', 'Authorization': `Bearer ${token}`},
    body: JSON.stringify({rank, state: 'training', step: 1200, steps: 5000, loss: 2.3456,
      heldout: 2.4567, runtime: 'native', device: 'Intel(R) Core(TM) i5-4590 CPU @ 3.30GHz',
      backend: 'blas_float (torch on 9 shapes: faster there, measured); kernels: numba',
      cores: 4, ram: 8 * 2 ** 30, microbatch_seconds: 0.0123, share: 0.5,
      tokens_per_s: 41234.5, bytes_sent: 123456789, bytes_received: 123456789,
      hash: '0123456789abcdef', points: []})})).status"""


@pytest.mark.parametrize("width", [1280, 1680])
def test_a_runs_table_is_whole_on_a_wide_screen(browser, server_url, width):
    """The ranks' table (16 columns) was cut at ~1100 px whatever the screen, its last
    columns (traffic, hash, last seen) behind a scroll bar; at 1280 px the hash was still
    cut and the last column (seen) behind the scroll bar."""
    board = browser.new_page(viewport={"width": width, "height": 1000})
    try:
        board.goto(f"{server_url}/dashboard")
        reply = board.evaluate("""async () => (await fetch('/api/runs', {method: 'POST',
            headers: {'Content-Type': 'application/json'}, body: JSON.stringify(
            {name: 'cluster on desktop-7', command: 'cluster', world: 2})})).json()""")
        for rank in (0, 1):
            assert board.evaluate(REPORT, [reply["run"], reply["token"], rank]) == 200
        board.wait_for_selector(f"section.run[data-run='{reply['run']}'] tbody tr:nth-child(2) "
                                "td:nth-child(16)")
        widths = board.evaluate("""(run) => {
            const s = document.querySelector(`section.run[data-run='${run}']`);
            return [s.scrollWidth, s.clientWidth]; }""", reply["run"])
        assert widths[0] <= widths[1], f"the table is {widths[0]} px in a {widths[1]} px card"
    finally:
        board.close()


def test_a_runs_table_names_its_backend_briefly_and_shows_held_out_only_when_measured(
        browser, server_url):
    """A native rank's backend report ("blas_float (torch on 9 shapes: faster there,
    measured); kernels: numba") wrapped to five lines of its cell, and a run without
    --eval-every had an empty held-out column (a newcomer trial)."""
    new_run = """async (name) => (await (await fetch('/api/runs', {method: 'POST',
        headers: {'Content-Type': 'application/json'}, body: JSON.stringify(
        {name, command: 'train', world: 1})})).json())"""
    board = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        board.goto(f"{server_url}/dashboard")
        plain, measured = board.evaluate(new_run, "plain"), board.evaluate(new_run, "measured")
        bare = board.evaluate(new_run, "bare")  # a backend said without "(...)" or ";"
        without = REPORT.replace("heldout: 2.4567, ", "")
        assert board.evaluate(without, [plain["run"], plain["token"], 0]) == 200
        assert board.evaluate(REPORT, [measured["run"], measured["token"], 0]) == 200
        said_bare = REPORT.replace(
            "'blas_float (torch on 9 shapes: faster there, measured); kernels: numba'",
            "'blas_float  kernels numba'")
        assert board.evaluate(said_bare, [bare["run"], bare["token"], 0]) == 200
        seen = {}
        for run in (plain["run"], measured["run"], bare["run"]):
            cell = f"section.run[data-run='{run}'] td[data-col=backend]"
            board.wait_for_selector(cell)
            seen[run] = (board.locator(f"section.run[data-run='{run}'] thead th").all_inner_texts(),
                         board.inner_text(cell), board.get_attribute(cell, "title"))
    finally:
        board.close()
    headers, backend, title = seen[plain["run"]]
    assert "held-out" not in headers and "loss" in headers, headers
    assert backend == "blas_float · numba", backend
    assert title == "blas_float (torch on 9 shapes: faster there, measured); kernels: numba"
    assert "held-out" in seen[measured["run"]][0], seen[measured["run"]]
    assert seen[bare["run"]][1] == "blas_float · numba", seen[bare["run"]]  # not "... · numba"
