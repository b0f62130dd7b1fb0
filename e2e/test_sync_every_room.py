"""--sync-every in a real room: a native peer and a Chromium tab train one run's outer steps.

The config of tests/run/test_sync_every.py (`--sync-every 3 --replicas 4`, 8 microbatches,
7 steps: a short last outer step). A native peer (`python -m pynode join --create`, as users
run it) hosts the room; one tab (Pyodide, Chromium with its default WebRTC privacy, inside
the private network of conftest.py) opens the room's link. Either the native peer leads
(`--start`) or the tab starts the run from its form. Both peers must publish, at every
outer boundary, the hashes of `python -m pynode train` alone with the same flags; the tab
must have computed replicas of its own: every inner step of each replica it owned (its
share of each outer step) is reported as it is taken, and its Training line shows them.
"""

from __future__ import annotations

import re

import pytest
from browser_helpers import history_hashes, status, wait, wait_booted, wait_trainable
from mixed_helpers import NativeJoin, config_flags

pytestmark = [pytest.mark.slow]

CONFIG = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
          "microbatches": 8, "steps": 7, "lr": 0.003, "seed": 5, "sync_every": 3,
          "replicas": 4}
OUTER_STEPS = [3, 6, 7]
RUN_END = "s => ['done', 'failed'].includes(s.state)"
# Every text the Training line (#readiness) and the progress line showed, from the moment
# the page loaded.
WATCH_READINESS = """() => {
    window.readinessSeen = new Set();
    window.progressSeen = new Set();
    for (const [id, seen] of [['#readiness', window.readinessSeen],
                              ['#progress-line', window.progressSeen]]) {
        const line = document.querySelector(id);
        new MutationObserver(() => seen.add(line.textContent))
            .observe(line, { childList: true, characterData: true, subtree: true });
    }
}"""
INNER_LINE = re.compile(r"Training: step [036] of 7 with 2 peer\(s\); syncs every 3 steps, "
                        r"4 replicas; this page: replica [1-4] of 4 at inner step [1-7]\.")
# The panel's step is the last synced one; it names the steps under way and this page's.
PROGRESS_LINE = re.compile(r"Step ([036]) of 7, .*; 2 peer\(s\) computing steps (\d)-(\d); "
                           r"this page at inner step [1-7]; leader .*", re.S)


def open_link(tabs, host: NativeJoin, server_url: str):
    """A tab on the native host's share link (the host approves who opens it)."""
    link = host.wait_for(r"share this link: (\S+)").group(1)
    tab = tabs.open(link[len(server_url) + 1 :])
    tab.evaluate(WATCH_READINESS)
    return tab


def check_the_run(tab, host: NativeJoin, native_reference) -> dict:
    """Both peers on the one-peer hashes at every outer step, the tab's own replicas
    computed and shown; the tab's status at the end."""
    expected = {row["step"]: row["hash"] for row in native_reference(CONFIG)}
    assert list(expected) == OUTER_STEPS
    assert host.finish(120) == 0, host.messages()
    wait(tab, RUN_END, 60_000)
    s = status(tab)
    assert s["state"] == "done", s["error"]
    assert host.hashes() == expected
    assert history_hashes(tab) == expected
    # The tab's replicas of each outer step (share = its microbatches / 8, 2 a replica) and
    # the inner steps it reported taking: each replica it owned, each inner step once.
    owned = {h["step"]: round(h["share"] * CONFIG["replicas"]) for h in s["history"]}
    inner = {h["step"]: h["inner"] for h in s["history"]}
    print(f"the tab's replicas at outer steps {OUTER_STEPS}: {list(owned.values())}")
    assert sum(owned.values()) > 0, f"the tab computed no replica: {s['history']}"
    assert inner == {3: 3, 6: 3, 7: 1}
    assert s["innerSteps"] == sum(owned[step] * inner[step] for step in OUTER_STEPS), s
    seen = tab.evaluate("() => [...window.readinessSeen]")
    assert any(INNER_LINE.fullmatch(text) for text in seen), seen
    under = [m.groups() for text in tab.evaluate("() => [...window.progressSeen]")
             if (m := PROGRESS_LINE.fullmatch(text))]
    assert under and all((int(a) + 1, min(int(a) + 3, 7)) == (int(b), int(c))
                         for a, b, c in under), under
    assert "syncs every 3 steps over 4 replicas" in host.messages()
    return s


def test_a_native_leader_and_a_tab_publish_the_one_peer_hashes_at_every_outer_step(
    tabs, natives, native_reference, server_url
):
    host = natives("host", "--create", "--start", "--min-peers", "2", *config_flags(CONFIG))
    tab = open_link(tabs, host, server_url)
    check_the_run(tab, host, native_reference)


def test_a_tab_starts_a_sync_every_run_from_its_form_with_a_native_peer(
    tabs, natives, native_reference, server_url
):
    host = natives("host", "--create")
    tab = open_link(tabs, host, server_url)
    wait_booted(tab)
    wait_trainable(tab, [host.peer_id])
    for name, value in CONFIG.items():
        if name != "task":
            tab.fill(f"#config-form [name={name}]", str(value))
    tab.click("#start")
    s = check_the_run(tab, host, native_reference)
    assert s["leader"] == s["peerId"]
    note = tab.inner_text("#run-note")
    tabs.shot(tab, "sync-every-run-led-by-the-tab")
    assert note.startswith("Last run") and note.endswith(
        "outer lr 0.7, outer momentum 0.9); syncs every 3 steps, 4 replicas."), note
    form = tab.evaluate("() => [...document.querySelectorAll('#config-form [name]')]"
                        ".map(f => [f.name, f.value])")
    assert ["sync_every", "3"] in form and ["replicas", "4"] in form
