"""Native peers (`python -m pynode join`, aiortc) and browser tabs train in one room.

Everything runs inside the private network namespace of conftest.py (WebRTC gathers no
loopback candidates): the server, Chromium and every native peer. Chromium keeps its default
WebRTC privacy (host candidates named NAME.local), so native peers resolve the tabs' names
by multicast DNS, as on a LAN. Each test opens its own private room. Every finished step's
state hash of every peer, native or tab, must equal `python -m pynode train` alone with the
same config, whoever leads, whoever dies.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from browser_helpers import (
    Tabs,
    approve_ids,
    history_hashes,
    host_candidates,
    status,
    wait,
    wait_booted,
    wait_trainable,
)
from mixed_helpers import REPO, config_flags, reference_rows

pytestmark = [pytest.mark.slow]

SMALL = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
         "microbatches": 4, "steps": 3, "lr": 0.003, "seed": 21}
RUN_END = "s => ['done', 'failed'].includes(s.state)"


def hashes(rows: list[dict]) -> dict[int, str]:
    return {row["step"]: row["hash"] for row in rows}


def test_two_native_peers_alone_train_the_reference_hashes(natives, native_reference):
    """No browser: the host (--create) approves the other peer, which it then leads."""
    config = {**SMALL, "seed": 20}
    host = natives("host", "--create", "--start", "--min-peers", "2", *config_flags(config))
    code = host.wait_for(r"\?room=(\S+)").group(1)
    member = natives("member", "--room", code)
    assert host.finish(120) == 0, host.messages()
    assert member.finish(60) == 0, member.messages()
    expected = hashes(native_reference(config))
    assert host.hashes() == expected == member.hashes()
    assert host.stdout().split() == member.stdout().split() == [expected[config["steps"]]]
    assert f"approved peer {member.peer_id}" in host.messages()
    assert "(member, pending)" in member.messages(), "it joined unapproved, then was approved"


def test_a_member_stopped_by_ctrl_c_left_the_room_it_was_not_lost(natives, native_reference):
    """A member's Ctrl-C: it says `bye` before its links close, so the leader says the
    peer left (not "lost peer"); the run goes on without it to the reference hashes."""
    config = {**SMALL, "seed": 22, "steps": 10}
    host = natives("host", "--create", "--start", "--min-peers", "3", *config_flags(config))
    code = host.wait_for(r"\?room=(\S+)").group(1)
    leaving, other = natives("leaving", "--room", code), natives("other", "--room", code)
    leaving_id = leaving.peer_id
    host.wait_step(3, 180)
    leaving.proc.send_signal(signal.SIGINT)
    assert leaving.finish(60) == 130, leaving.messages()
    host.wait_for(rf"peer {leaving_id} left at step \d+; its microbatches were re-planned", 60)
    assert host.finish(240) == 0, host.messages()
    assert other.finish(60) == 0, other.messages()
    expected = hashes(native_reference(config))
    assert host.hashes() == expected == other.hashes()
    assert "lost peer" not in host.messages() + other.messages()


def test_a_gloo_cluster_joins_through_one_rank_and_changes_no_bit(natives, native_reference):
    """Two processes form a gloo cluster (`join --cluster`); rank 0 joins the room for both
    and reduces the cluster's sum with a native leader over WebRTC."""
    pytest.importorskip("torch")
    config = {**SMALL, "microbatches": 6, "steps": 4, "seed": 25}
    leader = natives("leader", "--create", "--start", "--min-peers", "2",
                     *config_flags(config))
    code = leader.wait_for(r"\?room=(\S+)").group(1)
    port = str(free_port())
    ranks = [natives(f"rank{r}", "--room", code, "--cluster", env={
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2", "RANK": str(r)})
        for r in range(2)]
    assert leader.finish(180) == 0, "\n".join(
        [leader.messages(), *(f"{r.name}: {r.messages()}" for r in ranks)])
    for rank in ranks:
        assert rank.finish(60) == 0, rank.messages()
    expected = hashes(native_reference(config))
    assert leader.hashes() == expected
    assert ranks[0].hashes() == expected and ranks[1].hashes() == expected
    assert "leading the run with 2 peer" in leader.messages()
    assert "following rank 0" in ranks[1].messages()


def test_two_native_peers_and_two_tabs_then_a_resumed_run_and_refused_files(
    tabs, natives, native_reference, tmp_path
):
    """Run 1: a tab leads two native peers and another tab; one native saves a .pt at the
    end. Run 2: a new native peer leads from that file with more steps; the tabs receive it
    as the run's state, validate it and continue on the hashes of `pynode train --resume`.
    Files that fail validation are refused before the room hears of them. Chromium runs with
    its default WebRTC privacy: the tabs' host candidates are mDNS names, which the native
    peers resolve by multicast DNS on the namespace's network."""
    config = {**SMALL, "seed": 22}
    host = tabs.open("?create=1")
    code = status(host)["room"]
    tab = tabs.open(f"?room={code}")
    hidden = host_candidates(tab)
    assert hidden and all(name.endswith(".local") for name in hidden), hidden
    saved = tmp_path / "group.pt"
    follower = natives("follower", "--room", code)
    saver = natives("saver", "--room", code, "--save", str(saved))
    ids = [status(tab)["peerId"], follower.peer_id, saver.peer_id]
    approve_ids(host, *ids)
    wait_booted(host, tab)
    wait_trainable(host, ids)
    ranks = host.evaluate("(c) => daisychain.start(c)", config)["ranks"]
    assert sorted(ranks[1:]) == sorted(ids) and ranks[0] == status(host)["peerId"]
    assert follower.finish(120) == 0, follower.messages()
    assert saver.finish(60) == 0, saver.messages()
    for page in (host, tab):
        wait(page, RUN_END, 60_000)
    expected = hashes(native_reference(config))
    for got in (follower.hashes(), saver.hashes(), history_hashes(host), history_hashes(tab)):
        assert got == expected
    assert follower.stdout().split() == [expected[config["steps"]]]
    assert f"led by {ranks[0]}" in follower.messages()

    torch = pytest.importorskip("torch")
    state = torch.load(saved, weights_only=True)
    assert state["step"] == config["steps"] and state["state_hash"] == expected[3]
    bad_value = tmp_path / "nan.pt"
    state["params"][next(iter(state["params"]))].view(-1)[0] = float("nan")
    torch.save(state, bad_value)
    steps = config["steps"] + 3
    resumed = hashes(reference_rows({}, tmp_path, "--resume", str(saved), f"--steps={steps}"))

    resumer = natives("resumer", "--room", code, "--start", "--resume", str(saved),
                      f"--steps={steps}", "--min-peers", "3")
    approve_ids(host, resumer.peer_id)
    refused = {
        "nan": (["--resume", str(bad_value)], r"CheckpointError: .*(finite|NaN)"),
        "dims": (["--resume", str(saved), "--width=64"], r"CheckpointError: .*(shape|width)"),
    }
    for name, (flags, reason) in refused.items():
        bad = natives(f"bad-{name}", "--room", code, "--start", *flags)
        assert bad.finish(60) == 2
        assert re.search(reason, bad.messages()), bad.messages()
        assert "joined" not in bad.messages(), "a refused file must not reach the room"
    assert resumer.finish(240) == 0, resumer.messages()
    for page in (host, tab):
        wait(page, f"s => s.state === 'done' && s.step === {steps}", 60_000)
        assert history_hashes(page) == {**expected, **resumed}
    assert resumer.hashes() == resumed
    said = resumer.messages()  # the checkpoint read and checked, named as train names it
    assert (f"resuming {saved}: step {config['steps']} of {steps}, state hash "
            f"{expected[config['steps']][:16]}") in said, said
    assert "leading the run with 3 peer" in said


def test_faults_across_the_mesh_cost_time_not_bits(tabs, natives, native_reference):
    """In step 3 a native peer is SIGKILLed as it hands out its reduced chunk (after the
    leader's commit) and another one's training loop stalls (its links stay up, its messages
    stop); once it shows step 4 a tab is closed. The survivors, a native
    leader and a tab, end on the reference hashes of every step."""
    # 30 steps: the tab closes once it shows step 4, and the run must still be under way
    # then on a loaded machine (with 7 it could end first, and no tab was lost)
    config = {**SMALL, "steps": 30, "seed": 23}
    host = tabs.open("?create=1")
    code = status(host)["room"]
    tab = tabs.open(f"?room={code}")
    killed = natives("killed", "--room", code, env={"PYNODE_FAULT": "3:sum"})
    stalled = natives("stalled", "--room", code, env={"PYNODE_FAULT": "3:stall"})
    leader = natives("leader", "--room", code, "--start", "--min-peers", "5",
                     *config_flags(config))
    approve_ids(host, status(tab)["peerId"], killed.peer_id, stalled.peer_id, leader.peer_id)
    wait_booted(host, tab)
    leader.wait_for("leading the run with 5 peer", 120)
    assert killed.finish(120) == -9
    wait(tab, "s => s.step >= 4", 180_000)
    tab_id = status(tab)["peerId"]
    tab.close()
    assert leader.finish(240) == 0, leader.messages()
    wait(host, RUN_END, 60_000)
    expected = hashes(native_reference(config))
    assert leader.hashes() == expected
    assert history_hashes(host) == expected
    assert stalled.proc.poll() is None and max(stalled.hashes()) == 2
    # the killed and the stalled peer were lost; the closed tab left or, when its link was
    # still sending a step's large message as it closed, was lost too: its `bye`, on the ui
    # channel ahead of the data channel's queue, still did not get out before the page's
    # WebRTC was torn down in a CI run (BROWSER.md; test_failover.py's closed leader tab
    # too). Here it failed 3 CI runs in 5 on a fast machine.
    lost = {peer: int(step) for peer, step in
            re.findall(r"(?:lost )?peer (\S+) (?:left )?at step (\d+)", leader.messages())}
    assert set(lost) == {killed.peer_id, stalled.peer_id, tab_id}, leader.messages()
    assert lost[killed.peer_id] == lost[stalled.peer_id] == 3 and lost[tab_id] >= 5


def test_a_frozen_and_a_killed_peer_are_left_out_within_5_s(natives, native_reference):
    """Heartbeats: one native peer is frozen (SIGSTOP: its sockets stay open, nothing is
    sent, no goodbye), later another is SIGKILLed. From each fault to the leader's next step,
    re-planned without that peer, at most 5 s (the step deadline alone would take 30 s);
    the run ends on the reference hashes. The measured costs are printed."""
    config = {**SMALL, "steps": 30, "seed": 27}
    leader = natives("leader", "--create", "--start", "--min-peers", "4", *config_flags(config))
    code = leader.wait_for(r"\?room=(\S+)").group(1)
    frozen, killed, other = (natives(name, "--room", code) for name in ("frozen", "killed",
                                                                         "other"))
    costs = {}
    try:
        for step, peer, fault in ((4, frozen, signal.SIGSTOP), (12, killed, signal.SIGKILL)):
            peer_id = peer.peer_id
            leader.wait_step(step, 240)
            at = time.monotonic()
            peer.proc.send_signal(fault)
            leader.wait_for(rf"lost peer {peer_id} at step \d+", 60)
            costs[peer.name] = time.monotonic() - at
        assert leader.finish(240) == 0, leader.messages()
        assert other.finish(60) == 0, other.messages()
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    seconds = sorted(row["seconds"] for row in leader.rows())
    print(f"fault cost, death to the re-planned step: frozen {costs['frozen']:.2f} s, killed "
          f"{costs['killed']:.2f} s (a step takes {seconds[len(seconds) // 2]:.2f} s, median)")
    expected = hashes(native_reference(config))
    assert leader.hashes() == expected == other.hashes()
    assert costs["frozen"] <= 5.0 and costs["killed"] <= 5.0, costs


def test_the_signaling_server_restarts_mid_run_and_training_goes_on(
    net, browser, natives, native_reference, tmp_path, request
):
    """A native peer hosts the room (--create approves who opens its link) and leads; the
    server is killed at step 3 and started again on the same port and data folder: the run
    goes on over the data channels, both peers sign in again with their resume tokens, and
    the native host approves the tab again."""
    # Long enough to outlast the restart and both reconnect back-offs on a fast machine.
    config = {**SMALL, "steps": 600, "seed": 24}
    data_dir = tmp_path / "server-data"
    data_dir.mkdir()
    server, url = start_server(net, data_dir, 0)
    tabs = Tabs(browser, url, request.node.name)
    try:
        native = natives("host", "--create", "--start", "--min-peers", "2",
                         *config_flags(config), server=url)
        link = native.wait_for(r"share this link: (\S+)").group(1)
        tab = tabs.open(link[len(url) + 1 :])
        tab_id = status(tab)["peerId"]
        native.wait_step(3, 180)
        server.kill()
        server.wait()
        server, _ = start_server(net, data_dir, int(url.rsplit(":", 1)[1]))
        native.wait_for("signaling connection lost")
        native.wait_for(rf"approved peer {tab_id}[\s\S]*approved peer {tab_id}", 60)
        assert max(native.hashes()) < config["steps"], "the run must outlast the restart"
        wait(tab, "s => s.approved && s.peers.some(p => !p.self && p.approved)", 30_000)
        tabs.shot(tab, "native-host-in-the-peer-table")
        assert native.finish(240) == 0, native.messages()
        wait(tab, RUN_END, 60_000)
        expected = hashes(native_reference(config))
        assert native.hashes() == expected and history_hashes(tab) == expected
    finally:
        tabs.close()
        server.kill()


def free_port() -> int:
    """A port nothing listens on now (the namespace's loopback starts empty as well)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(net, data_dir, port: int) -> tuple[subprocess.Popen, str]:
    proc = net.popen([sys.executable, "-m", "server", "--host", net.address, "--port",
                      str(port), "--data-dir", str(data_dir), "--log-level", "WARNING"],
                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    found = re.search(r"http://[\d.]+:(\d+)/", line)
    assert found, f"the server did not start: {line}"
    return proc, f"http://{net.address}:{found.group(1)}"
