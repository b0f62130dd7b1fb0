"""The page's record of a run (server/pyodide_app/node.js `PageNode.onReport`), replayed
under Node: what `daisychain.status()` shows and what Download schedule saves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from node_check import node_check  # noqa: E402

# Calls the PageNode methods of stdin (a JSON list of [method, ...arguments]) on a bare
# PageNode (worker and signaling stand-ins that record what they are told) and prints
# its state.
REPLAY = """
import { readFileSync } from "node:fs";
const { PageNode } = await import(process.argv[1]);
const page = Object.create(PageNode.prototype);
page.state = { peerId: "me", state: "ready", history: [], messages: [], failovers: [],
               schedule: [], config: {}, paused: false, roomProblem: null, approved: false };
page.changed = () => {};
page.tellPeers = () => {};
page.mesh = null;
page.signaling = { close() { page.state.signalingClosed = true; } };
page.worker = { postMessage(msg) { (page.state.posted ??= []).push(msg); } };
page.roster = new Map();
page.dismissed = new Set();
page.info = new Map();
page.trainable = {};
page.links = () => [];
page.__setattr = (name, value) => { page.state[name] = value; };
for (const [method, ...args] of JSON.parse(readFileSync(0, "utf8"))) page[method](...args);
console.log(JSON.stringify({ ...page.state, status: page.status() }));
"""


def replay(calls: list) -> dict:
    module = (REPO / "server" / "pyodide_app" / "node.js").as_uri()
    return json.loads(node_check(REPLAY, module, stdin=json.dumps(calls)))


def step(n: int) -> list:
    return ["onReport", "step", {"step": n, "loss": 1.0, "hash": f"h{n}", "probe": "p",
                                 "seconds": 0.1, "heldout": None, "share": 0.5, "inner": 1,
                                 "members": ["me", "lead"]}]


def test_a_failover_at_a_changed_boundary_keeps_the_change_once():
    """The leader changed lr at boundary 4 and vanished before the group agreed on step 5:
    the run goes on from 4 and the new leader's word brings the change again. The
    schedule keeps it once (a duplicate made `train --schedule` refuse the download)."""
    change = {"step": 4, "lr": 0.002}
    run = ["onReport", "run", {"run": "r", "leader": "lead", "config": {"steps": 60, "lr": 0.003},
                   "ranks": ["lead", "me"], "joined_at": None}]
    control = ["onReport", "control", {"step": 4, "paused": False, "change": change}]
    earlier = ["onReport", "control",
               {"step": 2, "paused": False, "change": {"step": 2, "steps": 50}}]
    # the config and changes the group agreed on at boundary 4 (pynode/run/takeover.py):
    # the page takes them whole (a seed the page never saw changed: the report's wins)
    leader = ["onReport", "leader", {"leader": "me", "lost": "lead", "step": 4, "ranks": ["me"],
                                     "config": {"steps": 50, "lr": 0.003, "seed": 9},
                                     "schedule": [{"step": 2, "steps": 50}]}]
    state = replay([run, step(1), step(2), earlier, step(3), step(4), control, step(5),
                    leader, control, step(5)])
    assert state["schedule"] == [{"step": 2, "steps": 50}, change], state["schedule"]
    assert [h["step"] for h in state["history"]] == [1, 2, 3, 4, 5]
    status = state["status"]  # the run as steered: the change kept once, where it applies
    assert status["config"]["lr"] == 0.002 and status["steps"] == 50, status["config"]
    assert status["config"]["seed"] == 9, status["config"]


def test_a_resumed_checkpoints_changes_are_history_the_resume_goes_on_from():
    """A checkpoint stopped at step 249 (its schedule ends with that Stop), resumed for 300
    steps: the run report's config has 300, and the page applied the file's Stop to it
    again ("step 259 of 249", then "Stopped" at 300). A Stop made in this run counts."""
    run = ["onReport", "run", {"run": "r", "leader": "me", "ranks": ["me"], "joined_at": None,
                               "step": 249, "hash": "h249", "config": {"steps": 300, "lr": 0.002},
                               "schedule": [{"step": 100, "lr": 0.002},
                                            {"step": 249, "steps": 249}]}]
    resumed = replay([run, step(250)])["status"]
    stop = ["onReport", "control", {"step": 260, "paused": False,
                                    "change": {"step": 260, "steps": 260}}]
    stopped = replay([run, step(250), stop, ["onReport", "done", {"step": 260, "hash": "h"}]])
    assert (resumed["steps"], resumed["config"]["lr"], resumed["stoppedFrom"]) == (
        300, 0.002, None), resumed
    assert (stopped["status"]["steps"], stopped["status"]["stoppedFrom"]) == (260, 300)
    assert stopped["schedule"][-1] == {"step": 260, "steps": 260}


def test_a_page_the_host_declined_stays_out_once_its_checks_pass():
    """Declined while its checks still ran: the page leaves signaling, and the checks
    passing later do not make it 'ready' (the banner then said it waited for approval)."""
    checks = {"type": "checks", "ready": True, "rows": [], "backend": "wasm_simd",
              "kernels": "wasm", "webgpu": None}
    state = replay([["leave", "the host refused this page: ask the host, ..."],
                    ["onWorker", {"type": "state", "state": "booting"}],
                    ["onWorker", checks]])
    assert state["state"] == "failed" and state["signalingClosed"] is True, state
    assert state["roomProblem"] == "the host refused this page: ask the host, ..."
    assert state["error"] == state["roomProblem"]
    assert state["posted"] == [{"type": "leave", "reason": state["roomProblem"]}]
    # a duplicate of this tab took its place: its run stops too (it trained on alone)
    replaced = "this page left the room: signed in elsewhere"
    gave_up = replay([["giveUp", replaced]])
    assert gave_up["posted"] == [{"type": "leave", "reason": replaced}], gave_up
    assert gave_up["roomProblem"] == replaced and gave_up["signalingClosed"] is True
    fresh = replay([["onWorker", checks]])  # the same checks without a decline
    assert fresh["state"] == "ready" and fresh["roomProblem"] is None


def test_a_page_removed_mid_run_keeps_its_steps_and_never_says_finished():
    """Removed during a run: the worker is told to leave before anything else; a step
    already on its way still counts (the state downloads at it), the run's end or a
    failover do not change the page (it took over alone and said Finished, approved)."""
    run = ["onReport", "run", {"run": "r", "leader": "lead", "config": {"steps": 60},
                               "ranks": ["lead", "me"], "joined_at": None}]
    removed = ["leave", "the host removed this page from the room: ask the host, ..."]
    leader = ["onReport", "leader", {"leader": "me", "lost": "lead", "step": 2, "ranks": ["me"]}]
    stopped = ["onReport", "event", {"level": "warn", "text": "stopped training at step 3: "
                                     "the host removed this page from the room: ..."}]
    done = ["onReport", "done", {"step": 60, "hash": "h60"}]
    state = replay([["onRoster", {"peers": [{"id": "me", "role": "member",
                                             "state": "approved"}]}],
                    run, step(1), step(2), removed, step(3), leader, stopped, done])
    assert state["posted"] == [{"type": "leave", "reason": removed[1]}]
    assert (state["state"], state["approved"], state["step"]) == ("failed", False, 3), state
    assert state["leader"] == "lead" and not state["failovers"]
    assert [h["step"] for h in state["history"]] == [1, 2, 3]
    assert [m["text"] for m in state["messages"]][-2:] == [removed[1], stopped[2]["text"]]


def test_a_member_of_a_private_room_sees_when_the_hosts_page_is_away():
    member = {"id": "me", "role": "member", "state": "approved"}
    host = {"id": "h", "role": "host", "state": "approved"}
    joined = ["onRoster", {"host": "h", "peers": [host, member]}]
    away = ["onRoster", {"host": "h", "peers": [member]}]
    private = ["__setattr", "private", True]
    assert replay([private, joined])["hostAway"] is False
    assert replay([private, joined, away])["hostAway"] is True
    assert replay([private, joined, away, joined])["hostAway"] is False
    assert replay([away])["hostAway"] is False  # an automatic room has no host to wait for


def test_a_page_waiting_to_join_a_run_says_so_until_admitted():
    """Asked to join a (paused) run, the page is 'joining', not 'ready' (its Start would be
    refused); admitted, it trains; a run that went away leaves it ready again."""
    checks = {"type": "checks", "ready": True, "rows": [], "backend": "wasm_simd",
              "kernels": "wasm", "webgpu": None}
    asked = ["onReport", "joining", {"run": "r", "leader": "lead"}]
    waiting = replay([["onWorker", checks], asked])
    assert waiting["state"] == "joining" and waiting["joining"]["leader"] == "lead"
    assert "asked lead to join its run" in waiting["messages"][-1]["text"]
    run = ["onReport", "run", {"run": "r", "leader": "lead", "config": {"steps": 9},
                               "ranks": ["lead", "me"], "joined_at": 3}]
    admitted = replay([["onWorker", checks], asked, run])
    assert admitted["state"] == "training" and admitted["joining"] is None
    gone = replay([["onWorker", checks], asked, ["onReport", "joining", {"run": None}]])
    assert gone["state"] == "ready" and gone["joining"] is None


def test_other_pages_do_not_count_a_joining_page_as_ready():
    """Its Python's hello says 'joining': the peers list shows it, and no longer as
    trainable (the banner counted it among the peers ready to train)."""
    hello = ["onReport", "peers", {"a": "ready", "b": "joining"}]
    roster = ["onRoster", {"peers": [{"id": "a", "role": "member", "state": "approved"},
                                     {"id": "b", "role": "member", "state": "approved"}]}]
    peers = {p["id"]: p for p in replay([roster, hello])["status"]["peers"]}
    assert peers["a"]["trainable"] is True and peers["b"]["trainable"] is False


def test_the_leaders_stop_is_said_as_a_stop():
    """Stop sets the run's steps to the step reached: the page said "from step 283: steps
    283"."""
    run = ["onReport", "run", {"run": "r", "leader": "lead", "config": {"steps": 400},
                               "ranks": ["lead", "me"], "joined_at": None}]
    stop = ["onReport", "control", {"step": 283, "paused": False,
                                    "change": {"step": 283, "steps": 283}}]
    fewer = ["onReport", "control", {"step": 5, "paused": False,
                                     "change": {"step": 5, "steps": 300, "lr": 0.002}}]
    said = [m["text"] for m in replay([run, fewer, stop])["messages"]]
    assert said[-2:] == ["after step 5: steps 300, lr 0.002",
                         "the leader stopped the run at step 283"], said


def test_a_signal_to_a_peer_that_just_left_is_no_error_on_the_page():
    """The host's tab closed: its members' pages said "server: no approved peer with that id
    in this room (no_peer)" twice beside "peer X left the room" (a newcomer trial). A host's
    action on a peer gone meanwhile is still said."""
    relayed = {"code": "no_peer", "message": "no approved peer with that id in this room"}
    approved = {"code": "no_peer", "message": "no peer abc to approve"}
    state = replay([["onServerError", relayed], ["onServerError", approved]])
    assert [m["text"] for m in state["messages"]] == [
        "server: no peer abc to approve (no_peer)"], state["messages"]
