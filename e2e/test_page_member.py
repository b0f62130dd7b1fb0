"""A member's form shows the config of the run it trains, the leader's, not its own defaults:
filled in when the run starts and at each change the leader steers, locked while it trains,
kept once it is done.
"""

from __future__ import annotations

import json

import pytest
from browser_helpers import approve, open_room, status, wait, wait_booted, wait_trainable

pytestmark = [pytest.mark.slow]

# Long enough that the member is still training when the test looks at its form.
LEADERS = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
           "microbatches": 4, "steps": 60, "lr": 0.002, "seed": 21}
SHOWN = ("task", "width", "layers", "heads", "seq", "microbatch_size", "microbatches", "steps",
         "lr", "seed")
FORM_VALUES = "() => Object.fromEntries([...document.querySelectorAll('#config-form [name]')]" \
              ".map(f => [f.name, {value: f.value, disabled: f.disabled}]))"


def test_a_members_form_shows_the_leaders_run(tabs):
    host, (member,) = open_room(tabs, "")
    approve(host, member)
    wait_booted(host, member)
    leader_id = status(host)["peerId"]
    wait_trainable(host, [status(member)["peerId"]])
    before = member.evaluate(FORM_VALUES)
    host.evaluate("(c) => daisychain.start(c)", LEADERS)
    member.wait_for_function(
        "w => document.querySelector('#config-form [name=width]').value === w", arg="32",
        timeout=120_000)
    during, state = member.evaluate(FORM_VALUES), status(member)["state"]
    note = member.inner_text("#run-note")
    tabs.shot(member, "member-form-during-run")
    # the leader's change reaches the member's form too, with where it was made
    host.evaluate("(request) => daisychain.steer(request)", {"lr": 0.001})
    member.wait_for_function("() => document.querySelector('#config-form [name=lr]').value"
                             " === '0.001'", timeout=60_000)
    changed_at = status(member)["schedule"][0]["step"]
    steered = member.inner_text("#config-form label:has([name=lr]) .steered")
    wait(member, "s => ['done', 'failed'].includes(s.state)", 240_000)
    member.wait_for_function("() => !document.querySelector('#config-form [name=width]').disabled")
    after = member.evaluate(FORM_VALUES)
    assert before["width"]["value"] == "64" and before["lr"]["value"] == "0.003"
    assert state == "training", "the run ended before the test looked at the form"
    assert {k: during[k]["value"] for k in SHOWN} == {k: str(LEADERS[k]) for k in SHOWN}
    assert all(during[k]["disabled"] for k in SHOWN), "locked while the leader's run trains"
    assert f"led by {leader_id}" in note and "warm-up 10" in note, note
    assert steered == f"changed after step {changed_at}", steered
    assert {k: after[k]["value"] for k in SHOWN} == {k: str(LEADERS[k]) for k in SHOWN} | {
        "lr": "0.001"}, "kept once done, as the run had them"
    assert status(member)["state"] == "done", status(member)["error"]


def test_a_host_tab_that_reloads_hosts_its_room_again(tabs):
    """Reloading the host's tab gave the room up: the page came back as a new pending member
    and nobody could approve anyone. It hosts again now, under a new peer id (its state is
    new), and approves the next tab."""
    host, (member,) = open_room(tabs, "")
    approve(host, member)
    first = status(host)
    host.reload()
    host.wait_for_function("() => window.daisychain && daisychain.status().peerId")
    again = status(host)
    assert (again["room"], again["role"], again["approved"]) == (first["room"], "host", True)
    assert again["peerId"] != first["peerId"]
    wait(member, "(s, ids) => s.peers.some(p => p.id === ids[0] && p.role === 'host')"
         " && !s.peers.some(p => p.id === ids[1])", 30_000, [again["peerId"], first["peerId"]])
    newcomer = tabs.open(f"?room={first['room']}")
    assert not status(newcomer)["approved"]
    approve(host, newcomer)

    # a duplicated host tab (its sessionStorage copied) takes the role; the first one stops
    room = first["room"]
    token = host.evaluate("(room) => sessionStorage.getItem('daisychain.host.' + room)", room)
    assert token
    twin_context = tabs.browser.new_context()
    try:
        twin_context.add_init_script(
            f"sessionStorage.setItem('daisychain.host.{room}', {json.dumps(token)})")
        twin = twin_context.new_page()
        twin.goto(f"{tabs.base}/?room={room}")
        twin.wait_for_function("() => window.daisychain && daisychain.status().role === 'host'")
        wait(host, "s => (s.roomProblem || '').includes('reloaded in another tab')", 30_000)
        wait(newcomer, "(s, id) => s.peers.some(p => p.id === id && p.role === 'host')",
             30_000, status(twin)["peerId"])
    finally:
        twin_context.close()
