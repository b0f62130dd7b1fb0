"""Browser peers in real Chromium tabs: approval, training over WebRTC, native-equal hashes.

Each test opens its own private room: the first tab creates it (`/?create=1`, the host),
the others open `/?room=CODE` and wait for the host's approval. Hashes of every finished
step are compared with `python -m pynode train` run natively with the same config.
"""

from __future__ import annotations

import json

import pytest
from browser_helpers import (
    REPO,
    approve,
    history_hashes,
    open_room,
    status,
    wait,
    wait_booted,
    wait_trainable,
)

pytestmark = [pytest.mark.slow]

SMALL = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
         "microbatches": 4, "steps": 3, "lr": 0.003, "seed": 11}
# A run long enough to click around while it computes: with the wasm kernels a step of this
# config takes ~0.1 s in a tab, so 60 of them outlast the ~1.5 s of clicks and lag probe.
SLOWER = {**SMALL, "width": 64, "layers": 2, "heads": 4, "seq": 48, "microbatch_size": 4,
          "steps": 60, "seed": 12}
# Worst delay (ms) of 25 timers of 20 ms in a row: how long the page's main thread is busy.
EVENT_LOOP_LAG = """() => new Promise(done => {
  let worst = 0, last = performance.now(), n = 0;
  const tick = () => {
    const now = performance.now();
    worst = Math.max(worst, now - last - 20);
    last = now;
    if (++n < 25) setTimeout(tick, 20); else done(worst);
  };
  setTimeout(tick, 20);
})"""


def native_hashes(native_reference, config: dict) -> dict[int, str]:
    return {row["step"]: row["hash"] for row in native_reference(config)}


def train(host, pages: list, config: dict) -> list[str]:
    wait_trainable(host, [status(p)["peerId"] for p in pages])
    ranks = host.evaluate("(c) => daisychain.start(c)", config)["ranks"]
    for page in [host, *pages]:
        wait(page, "s => ['done', 'failed'].includes(s.state)", 240_000)
    return ranks


def test_two_tabs_train_the_native_hashes_and_the_page_stays_responsive(tabs, native_reference):
    host, (tab,) = open_room(tabs, "")
    wait(host, "s => s.peers.some(p => !p.approved)", 30_000)
    tabs.shot(host, "1-host-sees-join-request")
    assert not status(tab)["approved"] and status(tab)["peers"][0]["self"]
    approve(host, tab)
    wait_booted(host, tab)
    wait_trainable(host, [status(tab)["peerId"]])
    host.evaluate("(c) => daisychain.start(c)", SLOWER)
    # Click as soon as the first step is under way: the run must still be computing when the
    # clicks and the lag probe (~1.5 s together) are done, on a fast machine too.
    wait(host, "s => s.state === 'training'", 120_000)
    before = status(host)
    for _ in range(6):
        host.click("#toggle-checks")
        host.wait_for_timeout(150)
    lag_ms = host.evaluate(EVENT_LOOP_LAG)
    after = status(host)
    tabs.shot(host, "2-host-training")
    assert after["state"] == "training" and after["step"] < SLOWER["steps"], \
        "the clicks must land while the run is still computing"
    latencies = after["uiLatencyMs"][-6:]
    print(f"click handled after {[round(x, 1) for x in latencies]} ms; "
          f"worst event-loop stall {lag_ms:.1f} ms; step {after['step']} of {SLOWER['steps']}")
    assert len(latencies) == 6 and max(latencies) < 100, latencies
    assert lag_ms < 100, f"the page's event loop stalled {lag_ms:.0f} ms during a step"
    assert before["step"] < SLOWER["steps"]
    for page in (host, tab):
        wait(page, "s => ['done', 'failed'].includes(s.state)", 240_000)
    tabs.shot(host, "3-host-done")
    expected = native_hashes(native_reference, SLOWER)
    for page in (host, tab):
        s = status(page)
        assert s["state"] == "done", s["error"]
        assert s["gemm"] == "wasm_simd", s["checks"]  # the page's fast kernel computed
        assert s["kernels"] == "wasm", s["checks"]  # and its hot kernels
        assert history_hashes(page) == expected
    assert status(tab)["probe"] == native_reference(SLOWER)[-1]["probe"]


def test_three_tabs_train_the_native_hashes_and_an_unapproved_tab_gets_nothing(
    tabs, native_reference
):
    host, (second, third, outsider) = open_room(tabs, "", "", "")
    approve(host, second, third)
    wait_booted(host, second, third, outsider)
    ranks = train(host, [second, third], SMALL)
    tabs.shot(host, "host-done")
    tabs.shot(outsider, "unapproved-tab")
    expected = native_hashes(native_reference, SMALL)
    ids = [status(p)["peerId"] for p in (host, second, third)]
    assert sorted(ranks) == sorted(ids) and ranks[0] == ids[0]
    for page in (host, second, third):
        assert status(page)["state"] == "done", status(page)["error"]
        assert history_hashes(page) == expected
    seen = status(outsider)
    assert not seen["approved"] and seen["state"] == "ready"
    assert seen["history"] == [] and seen["hash"] is None and seen["step"] == 0
    assert [p["id"] for p in seen["peers"]] == [seen["peerId"]], "it must not learn the roster"
    host_view = {p["id"]: p for p in status(host)["peers"]}
    assert not host_view[seen["peerId"]]["approved"]
    assert seen["peerId"] not in ranks
    # A second run in the same room: each page's history (its table, its loss chart) is
    # that run's alone, not mixed with the steps of the first (a user trial found 1-3 of
    # the old run under 1-2 of the new, and their hashes).
    again = {**SMALL, "steps": 2, "seed": 15}
    first = status(host)["run"]
    wait_trainable(host, ids[1:])
    host.evaluate("(c) => daisychain.start(c)", again)
    for page in (host, second, third):
        wait(page, f"s => s.run !== {json.dumps(first)} && ['done', 'failed'].includes(s.state)",
             240_000)
        assert status(page)["state"] == "done", status(page)["error"]
        assert history_hashes(page) == native_hashes(native_reference, again)


def test_a_tab_joining_mid_run_is_synced_and_ends_on_the_same_hash(tabs, native_reference):
    # 150 steps: approval, the new link and the sync must land while the run is under way,
    # which 60 steps (a few seconds) left little room for on a loaded machine
    config = {**SMALL, "steps": 150, "seed": 13}
    host, (second, late) = open_room(tabs, "", "")
    approve(host, second)
    wait_booted(host, second, late)
    wait_trainable(host, [status(second)["peerId"]])
    host.evaluate("(c) => daisychain.start(c)", config)
    wait(host, "s => s.step >= 3", 120_000)
    approve(host, late)
    for page in (host, second, late):
        wait(page, "s => ['done', 'failed'].includes(s.state)", 240_000)
    tabs.shot(late, "late-joiner-done")
    expected = native_hashes(native_reference, config)
    joined = history_hashes(late)
    assert status(late)["state"] == "done", status(late)["error"]
    assert joined and 3 < min(joined) < config["steps"], sorted(joined)
    assert joined == {s: expected[s] for s in joined}
    assert status(late)["hash"] == expected[config["steps"]]
    assert history_hashes(host) == expected
    assert any("joined the run" in m["text"] for m in status(late)["messages"])
    # its table and chart hold the run from its first step: the loss before it joined as
    # the leader sent it (a reloaded host's chart started at the step it came back at)
    shown = status(late)["history"]
    assert [h["step"] for h in shown] == list(range(1, config["steps"] + 1))
    losses = {h["step"]: h["loss"] for h in status(host)["history"]}
    assert all(h["loss"] == losses[h["step"]] for h in shown)


def test_a_tab_that_fails_its_gate_stays_out_of_training(tabs, native_reference):
    host, (good, broken) = open_room(tabs, "", "&break_gate=1")
    approve(host, good, broken)
    wait_booted(host, good, broken)
    s = status(broken)
    assert s["state"] == "failed" and "gate failed" in s["error"]
    assert any(not row["passed"] and row["check"] == "exact gate" for row in s["checks"])
    assert "wasm_simd" in s["error"] and s["gemm"] is None
    broken.click("#toggle-checks")
    tabs.shot(broken, "gate-failed")
    assert "gate failed" in broken.inner_text("#messages")
    broken_id = s["peerId"]
    ranks = train(host, [good], {**SMALL, "seed": 14})
    assert broken_id not in ranks
    expected = native_hashes(native_reference, {**SMALL, "seed": 14})
    assert history_hashes(host) == expected == history_hashes(good)
    assert status(broken)["history"] == [] and status(broken)["state"] == "failed"
    host_row = next(p for p in status(host)["peers"] if p["id"] == broken_id)
    assert host_row["state"] == "failed" and not host_row["trainable"]


PAGE_CHECKPOINT_BASE64 = """async () => {
  const bytes = new Uint8Array(await daisychain.checkpoint());
  let text = "";
  for (let i = 0; i < bytes.length; i += 8192) {
    text += String.fromCharCode(...bytes.subarray(i, i + 8192));
  }
  return btoa(text);
}"""


def test_a_checkpoint_downloaded_from_a_tab_resumes_natively(tabs, native_reference, tmp_path):
    """The page's .pt loads with torch.load(weights_only=True); resuming it natively gives
    the hashes of an uninterrupted native run (steps inside the warm-up: same schedule)."""
    import base64
    import subprocess
    import sys

    import torch

    host, (tab,) = open_room(tabs, "")
    approve(host, tab)
    wait_booted(host, tab)
    train(host, [tab], SMALL)
    path = tmp_path / "from-tab.pt"
    path.write_bytes(base64.b64decode(tab.evaluate(PAGE_CHECKPOINT_BASE64)))
    loaded = torch.load(path, weights_only=True)
    assert loaded["step"] == SMALL["steps"] and loaded["state_hash"] == status(tab)["hash"]
    longer = {**SMALL, "steps": SMALL["steps"] + 2}
    log = tmp_path / "resumed.jsonl"
    done = subprocess.run([sys.executable, "-m", "pynode", "train", "--resume", str(path),
                           "--steps", str(longer["steps"]), "--log", str(log), "--no-progress"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    resumed = [json.loads(line)["hash"] for line in log.read_text().splitlines()]
    assert resumed == [row["hash"] for row in native_reference(longer)][SMALL["steps"]:]


PAGE_RESUME_BASE64 = """async (text) => {
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  try {
    return await daisychain.resume(bytes.buffer);
  } catch (err) {
    return { ok: false, error: err.message };
  }
}"""

MAKE_CHECKPOINT = """
import asyncio, json, sys
from pynode.config import RunConfig
from pynode.run.assemble import build_trainer
cfg, steps, path = RunConfig.from_dict(json.loads(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
trainer = build_trainer(cfg)
for _ in range(steps):
    asyncio.run(trainer.step())
open(path, "wb").write(trainer.state_bytes())
"""


def test_an_uploaded_checkpoint_is_validated_then_resumed_by_the_whole_group(
    tabs, native_reference, tmp_path
):
    import base64
    import subprocess
    import sys


    longer = {**SMALL, "steps": 5}
    path = tmp_path / "native-step2.pt"
    made = subprocess.run([sys.executable, "-c", MAKE_CHECKPOINT, json.dumps(longer), "2",
                           str(path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    good = path.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    host, (tab,) = open_room(tabs, "")
    approve(host, tab)
    wait_booted(host, tab)
    wait_trainable(host, [status(tab)["peerId"]])
    refused = host.evaluate(PAGE_RESUME_BASE64, base64.b64encode(bytes(bad)).decode())
    assert not refused["ok"] and "Checkpoint" in refused["error"], refused
    assert status(host)["state"] == "ready" and status(host)["history"] == []
    answer = host.evaluate(PAGE_RESUME_BASE64, base64.b64encode(good).decode())
    assert answer["ok"] and answer["step"] == 2, answer
    for page in (host, tab):
        wait(page, "s => ['done', 'failed'].includes(s.state)", 240_000)
    expected = {row["step"]: row["hash"] for row in native_reference(longer)[2:]}
    for page in (host, tab):
        assert status(page)["state"] == "done", status(page)["error"]
        got = history_hashes(page)
        assert {k: got[k] for k in expected} == expected, got
