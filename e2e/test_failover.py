"""Leader failover in a room: the leader of a run vanishes and the survivors go on.

Real server, real Chromium with its default WebRTC settings and native `join` peers, all in
the private network namespace of conftest.py (as e2e/test_mixed.py). A run's leader dies
mid-run (its tab is closed, or its process SIGKILLed); the next member in rank order takes
over from the last step every survivor agreed on (pynode.run.failover), and every survivor
ends on the hashes of `python -m pynode train` alone with the same config. The time from
the death to the first step completed under the new leader is printed and held to 5 s.
"""

from __future__ import annotations

import re
import time

import pytest
from browser_helpers import approve_ids, history_hashes, status, wait, wait_booted, wait_trainable
from mixed_helpers import config_flags

pytestmark = [pytest.mark.slow]

SMALL = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
         "microbatches": 4, "steps": 10, "lr": 0.003, "seed": 31}
RUN_END = "s => ['done', 'failed'].includes(s.state)"
FAILOVER_BUDGET_S = 5.0  # issue #13: death to the re-planned step


def reference_hashes(native_reference, config) -> dict[int, str]:
    return {row["step"]: row["hash"] for row in native_reference(config)}


def seconds_to_new_leaders_step(page, lost: str, died_at: float) -> float:
    """From `died_at` until `page` has a step completed under the leader that replaced
    `lost` (the page drops the steps past the failover's from its history)."""
    page.wait_for_function(
        """(lost) => { const s = daisychain.status();
                       const f = s.failovers.find(f => f.lost === lost);
                       return f && s.history.some(h => h.step > f.step); }""",
        arg=lost, timeout=60_000, polling=20)
    return time.monotonic() - died_at


def test_a_closed_leader_tab_is_replaced_and_no_bit_changes(tabs, natives, native_reference):
    """A tab leads the room's host tab and a native peer; it is closed after step 3. The
    next member in rank order leads, and both survivors end on the reference hashes; the
    native peer names the leader's going (left, or lost when its goodbye came too late)."""
    config = {**SMALL, "seed": 31, "steps": 40}  # still under way when the close lands
    host = tabs.open("?create=1")
    leader = tabs.open(f"?room={status(host)['room']}")
    native = natives("native", "--room", status(host)["room"])
    host_id, leader_id = status(host)["peerId"], status(leader)["peerId"]
    approve_ids(host, leader_id, native.peer_id)
    wait_booted(host, leader)
    wait_trainable(leader, [host_id, native.peer_id])
    ranks = leader.evaluate("(c) => daisychain.start(c)", config)["ranks"]
    assert ranks[0] == leader_id and sorted(ranks[1:]) == sorted([host_id, native.peer_id])
    native.wait_step(3, 120)
    died_at = time.monotonic()
    leader.close()
    cost = seconds_to_new_leaders_step(host, leader_id, died_at)
    assert native.finish(120) == 0, native.messages()
    wait(host, RUN_END, 60_000)
    expected = reference_hashes(native_reference, config)
    assert native.hashes() == expected == history_hashes(host)
    assert native.stdout().split() == [expected[config["steps"]]]
    (failover,) = status(host)["failovers"]
    assert failover["leader"] == ranks[1] and status(host)["state"] == "done"
    assert f"led by {'this peer' if ranks[1] == native.peer_id else ranks[1]}" \
        in native.messages()
    # the tab says `bye` as it goes (it left), but a leader's link is busy with a step's
    # large message as it closes, and the page's WebRTC may go before even the ui
    # channel's `bye` is out (BROWSER.md): then it was lost. A CI run saw that once.
    assert re.search(rf"(the leader {leader_id} left|lost the leader {leader_id}) after step",
                     native.messages()), native.messages()
    print(f"leader tab closed: {cost:.2f} s from its death to the new leader's first step")
    assert cost <= FAILOVER_BUDGET_S


def test_a_killed_native_leader_is_replaced_and_no_bit_changes(tabs, natives, native_reference):
    """A native peer leads two tabs and is SIGKILLed after step 3 (no goodbye: the tabs
    notice by the heartbeats' silence). The tabs end on the reference hashes."""
    config = {**SMALL, "seed": 32}
    host = tabs.open("?create=1")
    tab = tabs.open(f"?room={status(host)['room']}")
    leader = natives("leader", "--room", status(host)["room"], "--start", "--min-peers", "3",
                     *config_flags(config))
    leader_id = leader.peer_id
    approve_ids(host, status(tab)["peerId"], leader_id)
    wait_booted(host, tab)
    leader.wait_for("leading the run with 3 peer", 120)
    leader.wait_step(3, 120)
    died_at = time.monotonic()
    leader.kill()
    cost = seconds_to_new_leaders_step(host, leader_id, died_at)
    expected = reference_hashes(native_reference, config)
    for page in (host, tab):
        wait(page, RUN_END, 120_000)
        assert status(page)["state"] == "done", status(page)["messages"][-5:]
        assert history_hashes(page) == expected
        (failover,) = status(page)["failovers"]
        assert failover["lost"] == leader_id and failover["leader"] != leader_id
    print(f"native leader killed: {cost:.2f} s from its death to the new leader's first step")
    assert cost <= FAILOVER_BUDGET_S
