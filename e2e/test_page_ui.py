"""What a person sees on the page: an introduction at the top, errors at the top and next to
the action that failed, the server's own fix when it has no Pyodide runtime, and "Download
checkpoint" only once there is a state. One tab each, on a server at 127.0.0.1 (no namespace).

A member's form showing the leader's run needs two tabs over WebRTC: test_page_member.py
(its own module: Playwright's sync API allows one running instance at a time, and the
private network's browser of conftest.py is a second one).
"""

from __future__ import annotations

import datetime
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import (
    REPO,
    approve,
    param_count,
    status,
    wait,
    wait_booted,
)
from local_page import LocalServer, open_page, steered_checkpoint

pytestmark = [pytest.mark.slow]

# Far more steps than a test waits for: it stops the run itself.
LONG_RUN = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16,
            "microbatch_size": 2, "microbatches": 2, "steps": 100_000, "seed": 7}
TINY = {"width": "32", "layers": "1", "heads": "2", "seq": "16", "microbatch_size": "2",
        "microbatches": "2", "steps": "2", "seed": "5"}


def local_server(tmp_path: Path, **env: str) -> LocalServer:
    (tmp_path / "server-data").mkdir()
    return LocalServer(tmp_path / "server-data", env)


def host_and_member(browser: Any, server: LocalServer, console: list[str]) -> tuple[Any, Any]:
    """A host's page that made a private room, and a page that asks to join it."""
    host = open_page(browser, f"{server.url}/?create=1", console)
    return host, open_page(browser, f"{server.url}/?room={status(host)['room']}", console)


def training_alone(browser: Any, server: LocalServer, console: list[str], steps: int) -> Any:
    """A host's page of a new private room training TINY alone for `steps`, past step 1."""
    page = open_page(browser, f"{server.url}/?create=1", console)
    wait_booted(page)
    for name, value in {**TINY, "steps": str(steps)}.items():
        page.fill(f"#config-form [name={name}]", value)
    page.click("#start")
    wait(page, "s => s.state === 'training' && s.step >= 1", 120_000)
    return page


def top(page: Any, selector: str) -> float:
    return page.locator(selector).bounding_box()["y"]


def test_without_the_runtime_the_page_shows_the_servers_fix_at_the_top(
        local_browser, tmp_path, console):
    server = local_server(tmp_path, DAISYCHAIN_CACHE=str(tmp_path / "empty-cache"))
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait(page, "s => s.state === 'failed'", 60_000)
        page.wait_for_selector("#alert", state="visible")
        s = status(page)
        alert = page.inner_text("#alert-text")
        intro = page.inner_text("#intro")
        positions = {name: top(page, f"#{name}") for name in ("intro", "alert", "room-panel")}
        viewport = page.viewport_size["height"]
        download_disabled = page.is_disabled("#download")
        page.click("#alert-close")
        page.wait_for_selector("#alert", state="hidden")
    finally:
        server.close()
    assert "python -m server.runtime fetch" in s["error"], s["error"]
    assert s["error"].startswith("could not start Python: Pyodide runtime not found")
    assert not any("crashed" in m["text"] for m in s["messages"]), s["messages"]
    assert alert == s["error"]
    assert positions["intro"] < positions["alert"] < positions["room-panel"] < viewport, positions
    assert "DaisyChain" in intro and "Start training" in intro and "private room" in intro
    assert download_disabled


def test_errors_show_next_to_the_action_and_download_waits_for_a_run(
        local_browser, tmp_path, console):
    server = local_server(tmp_path)
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        assert status(page)["state"] == "ready", status(page)["error"]
        assert page.is_disabled("#download")
        assert page.is_hidden("#alert") and page.is_hidden("#form-error")

        # What the top says at the moment the error shows beside the button: the same, at once
        # (read a moment later, it once said nothing while the page waited for a frame).
        page.evaluate("""() => {
            window.topWhenShown = null;
            const box = document.querySelector('#form-error');
            new MutationObserver(() => {
                if (box.textContent) {
                    window.topWhenShown ??= document.querySelector('#alert-text').textContent;
                }
            }).observe(box, { childList: true });
        }""")
        page.fill("#config-form [name=sync_every]", "")  # named by its label, not "None"
        page.click("#start")
        page.wait_for_selector("#form-error", state="visible")
        empty = page.inner_text("#form-error")
        page.fill("#config-form [name=sync_every]", "1")
        # A config too big for a tab: refused at once by its estimate. It grew the heap past
        # 2 GiB for 90 s, ended in a traceback, and every checkpoint the tab made after was
        # corrupt (Pyodide copies buffers out wrong past 2 GiB); the download below is read.
        page.fill("#config-form [name=width]", "2048")
        page.fill("#config-form [name=layers]", "12")
        asked = time.monotonic()
        page.click("#start")
        page.wait_for_function("() => document.querySelector('#form-error').textContent"
                               ".includes('a tab can hold')", timeout=30_000)
        too_big = (page.inner_text("#form-error"), time.monotonic() - asked)
        page.fill("#config-form [name=layers]", "2")
        page.evaluate("window.topWhenShown = null")
        page.fill("#config-form [name=width]", "30")  # 4 heads do not divide 30
        page.click("#start")
        page.wait_for_function("() => document.querySelector('#form-error').textContent"
                               ".includes('heads')")
        refused = page.inner_text("#form-error")
        alert = page.inner_text("#alert-text")
        top_when_shown = page.evaluate("window.topWhenShown")
        gap = top(page, "#form-error") - top(page, "#start")
        assert status(page)["state"] == "ready" and page.is_disabled("#download")

        for name, value in {**TINY, "steps": "0.2e1"}.items():  # 2, as Chromium reads it
            page.fill(f"#config-form [name={name}]", value)
        page.click("#start")
        wait(page, "s => ['done', 'failed'].includes(s.state)", 240_000)
        s = status(page)
        page.wait_for_function("() => !document.querySelector('#download').disabled")
        after_run = {"form_error": page.is_hidden("#form-error"), "top": page.is_hidden("#alert"),
                     "note": page.inner_text("#run-note")}
        with page.expect_download() as download:
            page.click("#download")
        saved = Path(download.value.path()).read_bytes()
        name = download.value.suggested_filename
    finally:
        server.close()
    assert re.fullmatch(r"could not start: this config needs about 1[45]\.\d "
                        r"GiB, only \d+\.\d [MG]iB left of the 1\.5 GiB a tab can hold; choose a "
                        r"smaller one \(width, "
                        r"layers, sequence, microbatch size\)", too_big[0]), too_big[0]
    assert too_big[1] < 15, f"refused after {too_big[1]:.0f} s"
    assert refused == "could not start: heads (4) must divide width (30)"
    assert alert == refused and top_when_shown == refused, (alert, top_when_shown)
    assert 0 < gap < 120, f"the error is {gap} px below the Start button"
    assert s["state"] == "done" and s["step"] == 2, s["error"]
    assert empty == 'could not start: sync every must be a whole number, got ""', empty
    assert after_run["form_error"], "a started run clears the last action's error"
    assert after_run["top"], "a started run settles the failed start before it, at the top too"
    assert "led by this page" in after_run["note"], after_run
    assert name == "daisychain-step2.pt" and saved[:2] == b"PK"  # a torch zip archive


def test_a_value_the_browser_blocks_clears_the_refusal_before_it(local_browser, tmp_path,
                                                                 console):
    """A refused start, then a value out of its field's range (layers 0): the browser's
    own bubble stopped the submit, and the page still showed the old refusal beside the
    button and at the top, about values no longer there. Likewise a refused generation,
    then bytes -1."""
    server = local_server(tmp_path)
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        page.fill("#config-form [name=width]", "30")  # 4 heads do not divide 30
        page.click("#start")
        page.wait_for_selector("#alert", state="visible")
        before = (page.inner_text("#form-error"), page.inner_text("#alert-text"))
        page.fill("#config-form [name=width]", "32")
        page.fill("#config-form [name=layers]", "0")
        page.click("#start")
        page.wait_for_timeout(300)
        blocked = page.evaluate("() => !document.querySelector('#config-form').checkValidity()")
        after = {"beside": page.is_hidden("#form-error"), "top": page.is_hidden("#alert")}

        page.select_option("#generate-form [name=source]", "file")  # and no file chosen
        page.click("#generate")
        page.wait_for_selector("#generate-error", state="visible")
        generate_before = page.inner_text("#generate-error")
        page.fill("#generate-form [name=tokens]", "-1")
        page.click("#generate")
        page.wait_for_timeout(300)
        generate_after = page.is_hidden("#generate-error")
        state = status(page)["state"]
    finally:
        server.close()
    assert before == ("could not start: heads (4) must divide width (30)",) * 2
    assert blocked, "layers 0 is out of the field's range: the browser stops the submit"
    assert after == {"beside": True, "top": True}, after
    assert generate_before == "could not generate: choose a .pt file to generate from"
    assert generate_after, "the refusal of the last try stayed beside Generate"
    assert state == "ready"


def test_absurd_run_lengths_are_refused_in_the_pages_words(local_browser, tmp_path, console):
    """steps 1e12 started a run of a trillion steps (and steering took it too); a seed of
    1e30 reached Python as a float, which its random keys refuse (RngArgumentError). The
    form and the steering refuse them before anything starts, naming the field and its
    bound."""
    server = local_server(tmp_path)
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        for name, value in {**TINY, "steps": "1e12"}.items():
            page.fill(f"#config-form [name={name}]", value)
        page.click("#start")
        page.wait_for_selector("#form-error", state="visible")
        steps_said = page.inner_text("#form-error")
        page.fill("#config-form [name=steps]", "5000")
        page.fill("#config-form [name=seed]", "1e30")
        page.click("#start")
        page.wait_for_function("() => document.querySelector('#form-error').textContent"
                               ".includes('seed')")
        seed_said = page.inner_text("#form-error")
        before_run = status(page)
        page.fill("#config-form [name=seed]", "5")
        page.click("#start")
        wait(page, "s => s.state === 'training' && s.step >= 1", 120_000)
        page.fill("#steer-steps", "1e12")
        page.click("#apply-change")
        page.wait_for_selector("#steer-error", state="visible")
        steer_said = page.inner_text("#steer-error")
        # beside the steer panel's controls, not under the run form (a newcomer trial)
        run_form_quiet = page.is_hidden("#form-error")
        page.fill("#steer-lr", "0.0005")  # a valid learning rate beside refused steps
        page.click("#apply-change")
        page.wait_for_function("() => document.querySelector('#steer-error').innerText"
                               ".includes('neither')", timeout=30_000)
        both_said = page.inner_text("#steer-error")
        page.fill("#steer-lr", "")
        steps_then = status(page)["steps"]
        page.evaluate("(request) => daisychain.steer(request)", {"stop": True})
        wait(page, "s => ['done', 'failed'].includes(s.state)", 60_000)
    finally:
        server.close()
    assert steps_said == 'could not start: steps must be at most 10,000,000, got "1e12"', \
        steps_said
    assert seed_said == ('could not start: seed must be at most 9,007,199,254,740,991, got '
                         '"1e30"'), seed_said
    assert (before_run["state"], before_run["run"]) == ("ready", None), before_run
    assert steer_said == 'not applied: steps must be at most 10,000,000, got "1e12"', steer_said
    assert both_said == ('not applied (neither field: the change is one): steps must be at most '
                         '10,000,000, got "1e12"'), both_said
    assert run_form_quiet, "the steering refusal shows under the run form too"
    assert steps_then == 5000


def open_bare(browser: Any, url: str, console: list[str]) -> Any:
    """A page in a fresh context that may never get a peer id (a bad room code)."""
    page = browser.new_context().new_page()
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.goto(url)
    page.wait_for_function("() => window.daisychain", timeout=30_000)
    return page


def test_bad_and_unknown_room_codes_end_next_to_the_room_controls(
        local_browser, tmp_path, console):
    """A malformed code is named at once; an unknown well-formed code and a real room whose
    host never decides end after the same approval wait, with one message (codes cannot be
    probed). Each message shows in the room panel, not only in the log."""
    server = local_server(tmp_path)
    wait_s = 3
    try:
        bad = open_bare(local_browser, f"{server.url}/?room=no!code", console)
        bad.wait_for_selector("#room-problem", state="visible", timeout=30_000)
        bad_text = bad.inner_text("#room-problem")
        bad_inside = bad.locator("#room-panel #room-problem").count()
        bad_status = status(bad)
        bad_alert_hidden = bad.is_hidden("#alert")
        wait_booted(bad)  # its state badge tells the checks until they pass
        bad.wait_for_timeout(300)  # a frame for the badges
        bad_badges = (bad.inner_text("#state-badge"), bad.is_hidden("#role-badge"))

        host = open_page(local_browser, f"{server.url}/?create=1", console)
        real_code = status(host)["room"]
        unknown_code = "a" * 22 if real_code != "a" * 22 else "b" * 22
        ended = {}
        for name, code in (("real", real_code), ("unknown", unknown_code)):
            joined_at = time.monotonic()  # before the page loads: its timer starts inside
            # pasted with a space after it (%20): the code, not '"CODE " is not a room code'
            page = open_page(local_browser, f"{server.url}/?room={code}%20&approval_wait="
                             f"{wait_s}", console)
            assert status(page)["room"] == code, (name, status(page)["room"])
            page.wait_for_selector("#room-problem", state="visible", timeout=30_000)
            gave_up = (time.monotonic() - joined_at, page.inner_text("#room-problem"),
                       status(page)["peerId"], page.is_hidden("#pending-line"))
            # said by the banner and the room panel, not a third time in the error notice
            wait_booted(page)  # the banner and the badge say the checks' state first
            page.wait_for_timeout(300)  # a frame for the notice, were it shown
            ended[name] = (*gave_up, page.inner_text("#state-badge"))
            banner = page.inner_text("#readiness")
            assert banner == f"Checks passed; not in a room: {ended[name][1]}", (name, banner)
            assert page.is_hidden("#alert"), (name, page.inner_text("#alert-text"))
            # not "Private room, you are X" beside the reason it is in none (a user trial)
            page.wait_for_function("() => document.querySelector('#room-line').textContent"
                                   ".startsWith('Not in a room')", timeout=5_000)
            assert page.inner_text("#room-line") == \
                f"Not in a room (this page was peer {ended[name][2]}).", name
            page.wait_for_timeout(500)  # the socket's close arrives after the give-up
            said = [m["text"] for m in status(page)["messages"]]
            assert not any("reconnecting" in text for text in said), (name, said)
        host_saw = [p["id"] for p in status(host)["peers"]]
    finally:
        server.close()
    assert bad_text.startswith('"no!code" is not a room code'), bad_text
    assert "check the link" in bad_text and bad_inside == 1
    assert bad_status["peerId"] is None and bad_status["roomProblem"] == bad_text
    assert bad_alert_hidden, "the reason shows in the room panel and the banner only"
    assert bad_badges == ("not in a room", True), bad_badges  # not "joining…" for good
    for name, (seconds, text, _peer_id, pending_hidden, badge) in ended.items():
        # it left the room: no host can approve that id any more (a newcomer trial)
        assert text == (f"nobody approved this page within {wait_s} s: check the room code, "
                        "or reload this page to ask again (the room's host approves the peer "
                        "id it then shows)"), (name, text)
        assert badge == "not in a room", (name, badge)  # not a green "ready"
        assert wait_s - 0.5 < seconds < wait_s + 5, (name, seconds)
        assert pending_hidden, "the waiting line gives way to the reason"
    assert ended["real"][2] not in host_saw, "a page that gave up left the room"


def test_an_uppercased_code_reaches_its_room_and_an_empty_one_is_a_bad_link(
        local_browser, tmp_path, console):
    """A newcomer trial: the link with its code in capitals waited 300 s for an approval the
    host was never asked for (codes are made lowercase); `?room=` with nothing after it
    opened the automatic room without a word (`join` refuses it)."""
    server = local_server(tmp_path)
    try:
        empty = open_bare(local_browser, f"{server.url}/?room=", console)
        empty.wait_for_selector("#room-problem", state="visible", timeout=30_000)
        empty_said, empty_room = empty.inner_text("#room-problem"), status(empty)["room"]
        host = open_page(local_browser, f"{server.url}/?create=1", console)
        code = status(host)["room"]
        member = open_page(local_browser, f"{server.url}/?room={code.upper()}", console)
        wait(host, "(s, id) => s.peers.some(p => p.id === id && !p.approved)", 30_000,
             status(member)["peerId"])
        joined = status(member)["room"]
    finally:
        server.close()
    assert empty_said == ("the link has no room code (a room link ends in ?room= and 22 "
                          "letters, digits, - or _): check the link, or make a new private "
                          "room"), empty_said
    assert empty_room is None, empty_room  # not the automatic room
    assert joined == code, (joined, code)


def test_refusals_use_the_forms_words_and_say_what_to_do(local_browser, tmp_path, console):
    """A newcomer trial: "could not start: ConfigError: lr must be in (0, 1), got 0" beside
    a field labelled "learning rate"; Generate before any run said "RoomError: no run has
    started on this peer yet: no state to save or to generate from" and left the prompt in
    the output box. The page now says the form's words, no Python class, and the ways on."""
    server = local_server(tmp_path)
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        page.fill("#config-form [name=lr]", "0")
        page.click("#start")
        page.wait_for_selector("#form-error", state="visible")
        lr = (page.inner_text("#form-error"), page.inner_text("#alert-text"))
        page.fill("#config-form [name=lr]", "0.003")
        page.fill("#config-form [name=sync_every]", "1")
        page.fill("#config-form [name=replicas]", "2")
        page.click("#start")
        page.wait_for_function("() => document.querySelector('#form-error').textContent"
                               ".includes('replicas')")
        replicas = page.inner_text("#form-error")
        page.click("#generate")
        page.wait_for_selector("#generate-error", state="visible")
        generate = (page.inner_text("#generate-error"), page.inner_text("#generate-output"))
        page.click("#download-kit")
        page.wait_for_function("() => document.querySelector('#generate-error').textContent"
                               ".startsWith('no inference kit')")
        kit = page.inner_text("#generate-error")
        shown = page.inner_text("#messages")
        # a file's name keeps its words ("seq" is the sequence field's name)
        named = tmp_path / "seq.pt"
        named.write_text("notes, not a checkpoint\n")
        page.set_input_files("#upload", str(named))
        page.wait_for_function("() => document.querySelector('#form-error').textContent"
                               ".startsWith('checkpoint refused')")
        file_said = page.inner_text("#form-error")
    finally:
        server.close()
    assert lr == ("could not start: learning rate must be in (0, 1), got 0",) * 2, lr
    assert replicas.startswith("could not start: replicas 2 needs sync every H > 1"), replicas
    no_model = ("this page has no model yet: start a run (or keep the page open until one "
                "starts in this room), or choose a .pt file under model")
    assert generate == (f"could not generate: {no_model}", ""), generate
    assert kit == f"no inference kit: {no_model}", kit
    assert "Error:" not in shown and "learning rate must be" in shown, shown
    assert file_said.startswith("checkpoint refused: seq.pt is not a valid DaisyChain "
                                "checkpoint (not a checkpoint: "), file_said


def test_the_estimate_follows_the_task_and_says_a_size_no_tab_holds(local_browser, tmp_path,
                                                                    console):
    """A newcomer trial: switched to mlp, the estimate went on with the gpt's figures until a
    number changed; a config of 11.5 TiB read "about 12017889.1 MiB per peer" with no
    word that Start would refuse it; width 0 read "0 parameters, about 0.0 MiB"."""
    from pynode.config import RunConfig
    from pynode.platform import PAGE_HEAP_BUDGET
    from pynode.run.assemble import memory_needed, size_text

    server = local_server(tmp_path)
    big = {"width": 4096, "layers": 48, "heads": 32, "seq": 2048, "microbatch_size": 64}
    cfg = RunConfig(**big)
    need = memory_needed(cfg, param_count(cfg))
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        gpt = page.inner_text("#estimate")
        page.select_option("#config-form [name=task]", "mlp")
        mlp = page.inner_text("#estimate")
        page.select_option("#config-form [name=task]", "gpt")
        back = page.inner_text("#estimate")
        for name, value in big.items():
            page.fill(f"#config-form [name={name}]", str(value))
        huge, marked = page.inner_text("#estimate"), page.get_attribute("#estimate", "class")
        page.fill("#config-form [name=width]", "0")
        zero = page.inner_text("#estimate")
    finally:
        server.close()
    assert gpt.startswith(f"{param_count(RunConfig()):,} parameters, about "), gpt
    assert mlp == "" and back == gpt, (mlp, back)
    assert huge == (f"{param_count(cfg):,} parameters, about {size_text(need)} per peer: more "
                    f"than a tab can hold ({size_text(PAGE_HEAP_BUDGET)}), so Start will "
                    "refuse it; choose a smaller width, layers, sequence or microbatch size."), huge
    assert "error" in (marked or ""), marked
    assert zero == "", zero


def test_a_waiting_page_says_who_it_is_and_when_it_gives_up(local_browser, tmp_path, console):
    """A page waiting for approval said only that it waited: a mistyped code waited 300 s
    in silence. It names its peer id (what the host approves), the time it gives up, and
    what to check; the same for any code (the server never says which codes exist)."""
    server = local_server(tmp_path)
    try:
        # a computer whose clock is not UTC (+05:30): every time the page shows is its own
        page = open_page(local_browser, f"{server.url}/?room={'C' * 22}&approval_wait=600",
                         console, timezone_id="Asia/Kolkata")
        page.wait_for_selector("#pending-line", state="visible", timeout=30_000)
        text = " ".join(page.inner_text("#pending-line").split())
        wait_booted(page)  # its checks passed: "ready" in its state, not in its header
        page.wait_for_function("() => ['ready', 'waiting', 'failed'].includes("
                               "document.querySelector('#state-badge').textContent)",
                               timeout=10_000)
        badge = page.inner_text("#state-badge")
        peer_id, until = status(page)["peerId"], status(page)["approvalUntil"]
        now_ms = page.evaluate("() => Date.now()")
        page.wait_for_function("() => document.querySelectorAll('#messages time').length === "
                               "Math.min(30, daisychain.status().messages.length)",
                               timeout=10_000)
        messages, message_times = page.evaluate(
            "() => [daisychain.status().messages, [...document.querySelectorAll("
            "'#messages time')].map(t => t.textContent)]")
        # a real room: its host's banner says the move is the host's ("waiting for 1 more"
        # read as if the other page had to act)
        host = open_page(local_browser, f"{server.url}/?create=1", console)
        asking = open_page(local_browser, f"{server.url}/?room={status(host)['room']}", console)
        wait(host, "s => s.peers.length === 2", 30_000)
        wait_booted(host)
        host.wait_for_function("() => document.querySelector('#readiness').textContent"
                               ".includes('approval')", timeout=10_000)
        banner = host.inner_text("#readiness")
        asking_id = status(asking)["peerId"]
        asking_text = " ".join(asking.inner_text("#pending-line").split())
    finally:
        server.close()
    kolkata = datetime.timezone(datetime.timedelta(hours=5, minutes=30))
    shown = datetime.datetime.fromtimestamp(until / 1000, kolkata).strftime("%H:%M:%S")
    assert f"(peer {peer_id}), until {shown}." in text, text
    # Messages, newest first, on the same clock (they showed UTC, from the ISO stamp)
    assert message_times == [
        datetime.datetime.fromisoformat(m["at"].replace("Z", "+00:00")).astimezone(kolkata)
        .strftime("%H:%M:%S") for m in reversed(messages[-30:])], (message_times, messages)
    assert message_times, messages
    assert badge == "waiting", badge
    assert "check the link with the room's host" in text, text
    # a host that closed its tab and opened the link again is one of these pages
    assert text.endswith("If you made this room and closed its tab, this page cannot host "
                         "it again (only the tab that made a room hosts it, and reloads of "
                         "that tab): make a new private room and send its link."), text
    assert 590_000 < until - now_ms <= 600_000, until - now_ms
    assert banner.endswith("1 of them waits for your approval (Approve or Refuse in the Peers "
                           "table)."), banner
    assert f"(peer {asking_id})" in asking_text, asking_text


def test_a_member_is_told_when_the_hosts_page_is_gone(local_browser, tmp_path, console):
    """A private room keeps its host while the host's page is away; its members saw no sign
    of it, and waited on approvals nobody could give."""
    server = local_server(tmp_path)
    try:
        host, member = host_and_member(local_browser, server, console)
        approve(host, member)
        wait(member, "s => s.peers.length === 2", 30_000)
        shown_with_host = member.is_visible("#host-away")
        # the host's page is at 127.0.0.1: its share link names each friend's own machine
        local_link_said = host.is_visible("#share-local")
        host.context.close()
        member.wait_for_selector("#host-away", state="visible", timeout=30_000)
        said = " ".join(member.inner_text("#host-away").split())
        away = status(member)
    finally:
        server.close()
    assert not shown_with_host
    assert local_link_said, "a loopback page's share link reaches no other machine"
    assert said == ("The room's host is not connected. If its page closed (or its join "
                    "--create ended), nobody can approve or remove peers in this room any more: "
                    "whoever else should join needs a new room. If it only lost its "
                    "connection, it can until it is back. A run goes on without it."), said
    assert away["hostAway"] and away["approved"], away


def test_a_refused_page_says_it_is_out_and_what_to_do(local_browser, tmp_path, console):
    """Refused by the host, a page said "Stopped: this page leaves the room: the host
    declined" under a "failed" badge, with no next step, and the host's Messages said
    nothing of it (a newcomer trial)."""
    server = local_server(tmp_path)
    try:
        host, member = host_and_member(local_browser, server, console)
        member_id = status(member)["peerId"]
        host.click(f'button[data-deny="{member_id}"]')
        member.wait_for_selector("#room-problem", state="visible", timeout=30_000)
        said, banner = member.inner_text("#room-problem"), member.inner_text("#readiness")
        wait_booted(member)
        badges = (member.inner_text("#state-badge"), member.inner_text("#role-badge"))
        host_said = [m["text"] for m in status(host)["messages"]]
    finally:
        server.close()
    why = ("the host refused this page: ask the host, then reload this page to ask again, or "
           "make a new private room")
    assert said == why and banner == f"Stopped: {why}", (said, banner)
    assert badges == ("not in a room", "member (refused)"), badges
    assert f"refused peer {member_id}: it is out of the room" in host_said, host_said


def test_the_host_removes_an_approved_peer_with_its_rows_button(local_browser, tmp_path,
                                                                 console):
    """The server always took `remove`; the page offered no way to send it. The host's row
    of an approved peer has a Remove button; the removed page is out for good and says why,
    and the host's own row has none. A page removed in the middle of a run stops it there
    (it trained on alone to its last step and said "Finished", still approved), and its
    state still downloads."""
    server = local_server(tmp_path)
    try:
        host, member = host_and_member(local_browser, server, console)
        member_id = status(member)["peerId"]
        approve(host, member)
        host_id = status(host)["peerId"]
        host.wait_for_selector(f'button[data-remove="{member_id}"]', timeout=30_000)
        assert host.locator(f'button[data-remove="{host_id}"]').count() == 0
        assert member.locator("button[data-remove]").count() == 0  # members cannot remove
        wait_booted(member)
        member.evaluate("(c) => daisychain.start(c)", LONG_RUN)  # alone: 127.0.0.1 has no
        wait(member, "s => s.step >= 2", 120_000)  # WebRTC candidates (see the docstring)
        host.click(f'button[data-remove="{member_id}"]')
        member.wait_for_selector("#room-problem", state="visible", timeout=30_000)
        said = member.inner_text("#room-problem")
        wait(member, "s => s.messages.some(m => m.text.startsWith('stopped training'))",
             60_000)
        stopped = status(member)
        time.sleep(3)  # a run that went on would take more steps meanwhile
        after = status(member)
        saved = member.evaluate("async () => (await daisychain.checkpoint()).byteLength")
        wait(host, "(s, id) => !s.peers.some(p => p.id === id)", 30_000, member_id)
        badge, links = member.inner_text("#state-badge"), status(member)["links"]
        host_said = [m["text"] for m in status(host)["messages"]]
    finally:
        server.close()
    why = ("the host removed this page from the room: ask the host, then reload this page to "
           "join again, or make a new private room; Download checkpoint (.pt) keeps the state "
           "this page reached")
    assert said == why, said
    stop_line = next(m["text"] for m in stopped["messages"]
                     if m["text"].startswith("stopped training"))
    assert stop_line == f"stopped training at step {after['step']}: {why}", stop_line
    assert badge == "not in a room" and links == [], (badge, links)  # not "failed"
    assert f"removed peer {member_id} from the room" in host_said, host_said
    assert (after["state"], after["approved"]) == ("failed", False), after
    assert after["step"] == stopped["step"] < LONG_RUN["steps"], (stopped["step"], after)
    assert not any(m["text"].startswith("run finished") for m in after["messages"])
    assert saved > 1000, saved


def test_a_removed_page_says_removed_everywhere_and_offers_nothing_of_a_member(
        local_browser, tmp_path, console):
    """A page the host removed said "removed by the host" in its room panel while its own
    row still said "approved", its badge "member (pending)", and its "Resume from a
    checkpoint" stayed open, answering that the page "may lead a run once approved"."""
    server = local_server(tmp_path)
    try:
        host, member = host_and_member(local_browser, server, console)
        member_id = status(member)["peerId"]
        approve(host, member)
        wait_booted(member)
        host.wait_for_selector(f'button[data-remove="{member_id}"]', timeout=30_000)
        host.click(f'button[data-remove="{member_id}"]')
        member.wait_for_selector("#room-problem", state="visible", timeout=30_000)
        member.wait_for_timeout(500)  # a render after the last message
        own = status(member)
        own_row = next(p for p in own["peers"] if p["self"])
        row_text = " ".join(member.inner_text(f'tr[data-peer="{member_id}"]').split())
        badge = member.inner_text("#role-badge")
        banner = member.inner_text("#readiness")
        closed = {name: member.is_disabled(name) for name in ("#start", "#upload")}
        others = [p["id"] for p in own["peers"] if not p["self"]]
        refused = member.evaluate(
            "async () => { try { await daisychain.resume(new ArrayBuffer(8)); return null; }"
            " catch (e) { return e.message; } }")
    finally:
        server.close()
    assert (own["approved"], own_row["approved"]) == (False, False), own_row
    assert "approved" not in row_text and "removed" in row_text, row_text
    assert badge == "member (removed)", badge
    assert "the host removed this page" in banner, banner
    assert closed == {"#start": True, "#upload": True}, closed
    assert others == [], "the roster it saw before it was removed is kept up to date no more"
    assert refused and "the host removed this page" in refused \
        and "once approved" not in refused, refused


def test_the_page_fits_a_phones_screen(local_browser, tmp_path, console):
    """At 390 px (a phone) the page was 608 px wide: every panel kept a 30rem minimum, the
    peers table ran out of its panel and the prompt box out of the Generate panel (a
    newcomer trial). The page is the screen's width; wide tables scroll in their panel."""
    server = local_server(tmp_path)
    context = local_browser.new_context(viewport={"width": 390, "height": 844})
    try:
        page = context.new_page()
        page.on("pageerror", lambda e: console.append(f"page error: {e}"))
        page.goto(f"{server.url}/?create=1")
        page.wait_for_function("() => window.daisychain && daisychain.status().room",
                               timeout=30_000)
        wait_booted(page)
        sizes = page.evaluate("""() => ({
            page: document.documentElement.scrollWidth, view: window.innerWidth,
            out: [...document.querySelectorAll('main > section')].filter(s =>
                s.getBoundingClientRect().right > window.innerWidth).map(s => s.id),
            prompt: document.querySelector('#generate-form textarea').getBoundingClientRect()
                .right <= document.getElementById('generate-panel').getBoundingClientRect()
                .right})""")
    finally:
        context.close()
        server.close()
    assert sizes["page"] <= sizes["view"], sizes
    assert sizes["out"] == [] and sizes["prompt"], sizes


def test_the_peers_table_is_whole_at_1280_px(local_browser, tmp_path, console):
    """At 1280 x 800 the peers table (17 columns) was wider than its panel: the last
    columns (state hash, probe) sat behind a scroll bar. Measured with every column filled
    (a finished run) and a pending peer's Approve / Refuse buttons; each peer id whole."""
    server = local_server(tmp_path)
    try:
        context = local_browser.new_context(viewport={"width": 1280, "height": 800})
        host = context.new_page()
        host.on("pageerror", lambda e: console.append(f"page error: {e}"))
        host.goto(f"{server.url}/?create=1")
        host.wait_for_function("() => window.daisychain && daisychain.status().room",
                               timeout=30_000)
        open_page(local_browser, f"{server.url}/?room={status(host)['room']}", console)
        wait(host, "s => s.peers.length === 2", 30_000)
        wait_booted(host)
        host.evaluate("(c) => daisychain.start(c)", {**LONG_RUN, "steps": 2})
        wait(host, "s => s.state === 'done'", 120_000)
        host.wait_for_function("() => document.querySelector('#peers tbody tr.self td:last-child"
                               " code')", timeout=10_000)  # the probe, the last column
        sizes = host.evaluate("""() => {
            const panel = document.getElementById('peers-panel');
            const table = document.getElementById('peers').getBoundingClientRect();
            const inner = panel.getBoundingClientRect().right
                - parseFloat(getComputedStyle(panel).paddingRight);
            const ids = [...document.querySelectorAll('#peers .peer-id')];
            return {table: table.right, panel: inner, scroll: panel.scrollWidth,
                    box: panel.clientWidth, page: document.documentElement.scrollWidth,
                    view: window.innerWidth, ids: ids.length,
                    broken: ids.filter(e => e.getClientRects().length > 1).length,
                    // a run field wrapped below its name, not beside it ("microbatches per
                    // step"): it starts at the label's left edge
                    below: [...document.querySelectorAll('#config-form label')].filter(l => {
                        const f = l.querySelector('input[type=number], select');
                        return f && f.getBoundingClientRect().left
                            - l.getBoundingClientRect().left < 20; })
                        .map(l => l.textContent.trim())}; }""")
        tabs_shot = host.screenshot(full_page=True)
        (REPO / "artifacts" / "e2e").mkdir(parents=True, exist_ok=True)
        (REPO / "artifacts" / "e2e" / "peers-table-1280.png").write_bytes(tabs_shot)
    finally:
        server.close()
    assert sizes["table"] <= sizes["panel"] + 0.5, sizes
    assert sizes["scroll"] <= sizes["box"], sizes
    assert sizes["page"] <= sizes["view"], sizes
    # each peer id on one line: people read it out to the host (it broke after 12 of 14)
    assert sizes["ids"] == 2 and sizes["broken"] == 0, sizes
    assert sizes["below"] == [], sizes


def test_copy_copies_the_share_link_where_the_page_has_no_clipboard_api(local_browser,
                                                                        tmp_path, console):
    """A host at http://LAN-ADDRESS (not a secure origin: no navigator.clipboard) clicked
    Copy and got nothing on the clipboard and no word of it. Such a page is made here by
    taking the API away before the page loads; the link is copied the old way (a copy
    event with the link selected) and the button says so."""
    server = local_server(tmp_path)
    try:
        context = local_browser.new_context()
        context.add_init_script("""
            Object.defineProperty(Navigator.prototype, "clipboard", {get: () => undefined});
            document.addEventListener("copy", () => {
              const field = document.activeElement;
              window.copiedText = field.value.slice(field.selectionStart, field.selectionEnd);
            });""")
        page = context.new_page()
        page.on("pageerror", lambda e: console.append(f"page error: {e}"))
        page.goto(f"{server.url}/?create=1")
        page.wait_for_function("() => window.daisychain && daisychain.status().room",
                               timeout=30_000)
        api = page.evaluate("() => typeof navigator.clipboard")
        link = page.input_value("#share-link")
        page.click("#copy-link")
        page.wait_for_function("() => window.copiedText !== undefined", timeout=10_000)
        copied = page.evaluate("() => window.copiedText")
        page.wait_for_function(
            "() => document.getElementById('copy-link').textContent === 'Copied'",
            timeout=10_000)
        page.wait_for_function(
            "() => document.getElementById('copy-link').textContent === 'Copy'",
            timeout=10_000)
    finally:
        server.close()
    assert api == "undefined"
    assert "?room=" in link and copied == link, (copied, link)
    assert not [line for line in console if "page error" in line], console


def test_the_host_hears_of_each_request_to_join(local_browser, tmp_path, console):
    """A member whose page reloaded came back as a new peer, waiting; the host's page said
    only "lost peer ..." of its old id, and the new row read "not connected", as a network
    fault would. Each new request is a message now, and its row says it waits."""
    server = local_server(tmp_path)
    try:
        host, member = host_and_member(local_browser, server, console)
        member_id = status(member)["peerId"]
        wait(host, "(s, id) => s.messages.some(m => m.text.includes(id))", 30_000, member_id)
        row = host.inner_text(f'tr[data-peer="{member_id}"]')
        asked = [m["text"] for m in status(host)["messages"] if member_id in m["text"]]
        approve(host, member)
        told_member = [m["text"] for m in status(member)["messages"]
                       if "asks to join" in m["text"]]
    finally:
        server.close()
    assert asked == [f"peer {member_id} asks to join: Approve or Refuse it in the peers "
                     "table"], asked
    assert "waits for approval" in row and "not connected" not in row, row
    assert told_member == [], told_member  # members approve nobody


def test_the_host_approves_with_a_click_while_its_run_renders(local_browser, tmp_path,
                                                              console):
    """A press and release on Approve, 150 ms apart, as a person clicks, while the host's
    page trains (its peers table re-rendered tens of times a second). The table was
    rewritten whole each time, so the button under the pointer was a new one by the
    release and no click landed (a trial: 0 of 5)."""
    server = local_server(tmp_path)
    try:
        host = training_alone(local_browser, server, console, steps=100_000)
        member = open_page(local_browser, f"{server.url}/?room={status(host)['room']}", console)
        member_id = status(member)["peerId"]
        button = host.locator(f'tr[data-peer="{member_id}"] button[data-approve]')
        button.wait_for(timeout=30_000)
        steps = status(host)["step"]
        button.scroll_into_view_if_needed()
        box = button.bounding_box()
        host.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        host.mouse.down()
        host.wait_for_timeout(150)
        host.mouse.up()
        wait(member, "s => s.approved", 15_000)
        rendered = status(host)["step"] - steps  # the run went on under the pointer
        host.evaluate("(request) => daisychain.steer(request)", {"stop": True})
        wait(host, "s => ['done', 'failed'].includes(s.state)", 60_000)
    finally:
        server.close()
    assert rendered >= 2, rendered


def test_the_room_hears_of_a_peer_that_left_between_runs(local_browser, tmp_path, console):
    """A member that left outside a run (a closed tab, a native peer's Ctrl-C) only lost its
    row: the host's page said nothing of it, where a peer leaving a run is a message."""
    server = local_server(tmp_path)
    try:
        host, member = host_and_member(local_browser, server, console)
        member_id = status(member)["peerId"]
        approve(host, member)
        asking = open_page(local_browser, f"{server.url}/?room={status(host)['room']}", console)
        asking_id = status(asking)["peerId"]
        wait(host, "(s, id) => s.peers.some(p => p.id === id)", 30_000, asking_id)
        member.context.close()
        asking.context.close()
        wait(host, "(s, ids) => ids.every(id => !s.peers.some(p => p.id === id))", 30_000,
             [member_id, asking_id])
        said = [m["text"] for m in status(host)["messages"] if "left" in m["text"]]
    finally:
        server.close()
    assert sorted(said) == sorted([f"peer {member_id} left the room",
                                   f"peer {asking_id} left the room before the host approved "
                                   "it"]), said


def test_a_server_restart_is_one_lost_line_and_one_restored_line(local_browser, tmp_path,
                                                                 console):
    """The page said "signaling connection lost; reconnecting" again at each failed retry of
    one server restart (four times), and never that it came back."""
    data = tmp_path / "server-data"
    server = local_server(tmp_path)
    again = None
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        server.close()
        wait(page, "s => s.messages.some(m => m.text.startsWith('signaling connection lost'))",
             30_000)
        time.sleep(4)  # retries after 0.5, 1 and 2 s meet no server
        again = LocalServer(data, port=server.port)
        wait(page, "s => s.messages.some(m => m.text === 'signaling connection restored')",
             30_000)
        texts = [m["text"] for m in status(page)["messages"]]
    finally:
        (again or server).close()
    assert [t for t in texts if t.startswith("signaling connection")] == [
        "signaling connection lost; reconnecting", "signaling connection restored"], texts


def test_a_page_training_alone_asks_before_it_is_closed_and_says_what_steering_needs(
        local_browser, tmp_path, console):
    """A tab that trains alone holds its run's only copy: a reload ended the run without a
    word (it came back "ready"); now the browser asks first. "Apply at the next step" with
    both fields empty did nothing and said nothing."""
    server = local_server(tmp_path)
    try:
        page = training_alone(local_browser, server, console, steps=5000)
        assert page.is_disabled("#upload")  # a resume is refused during a run
        page.click("#apply-change")  # both fields empty
        page.wait_for_selector("#steer-error", state="visible")
        said = page.inner_text("#steer-error")
        asked: list[str] = []

        def answer(dialog: Any) -> None:
            asked.append(dialog.type)
            dialog.dismiss()  # stay

        page.on("dialog", answer)
        page.close(run_before_unload=True)
        page.wait_for_timeout(1000)
        still = status(page)["state"]
        page.remove_listener("dialog", answer)
        page.evaluate("(request) => daisychain.steer(request)", {"stop": True})
        wait(page, "s => ['done', 'failed'].includes(s.state)", 60_000)
    finally:
        server.close()
    assert said == "not applied: give a learning rate or a number of steps to change", said
    assert asked == ["beforeunload"] and still == "training", (asked, still)


def test_a_resume_that_starts_settles_the_refusal_before_it(local_browser, tmp_path, console):
    """A wrong file, then the right one: the run resumed and trained, and the top of the
    page still said "checkpoint refused" (a start settles the failed start before it; a
    resume did not)."""
    import subprocess
    import sys

    good = tmp_path / "run.pt"
    made = subprocess.run(
        [sys.executable, "-m", "pynode", "train", "--steps", "2", "--width", "32", "--layers",
         "1", "--heads", "2", "--seq", "16", "--microbatch-size", "2", "--microbatches", "2",
         "--no-progress", "--save", str(good)], cwd=REPO, capture_output=True, text=True,
        timeout=300)
    assert made.returncode == 0, made.stderr
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    server = local_server(tmp_path)
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        page.fill("#config-form [name=steps]", "4")
        page.set_input_files("#upload", str(junk))
        page.wait_for_selector("#alert", state="visible")
        refused = page.inner_text("#alert-text")
        page.set_input_files("#upload", str(good))
        page.click("#resume-confirm")  # once its preview is read (e2e/test_page_resume.py)
        wait(page, "s => ['done', 'failed'].includes(s.state)", 120_000)
        s = status(page)
        page.wait_for_timeout(500)  # a render after the end
        top_after = page.is_hidden("#alert")
    finally:
        server.close()
    assert refused.startswith("checkpoint refused: "), refused
    assert s["state"] == "done" and s["step"] == 4, s["error"]
    assert top_after, "the refusal before the resume still showed at the top"


def test_a_resumed_run_shows_the_checkpoints_schedule(local_browser, tmp_path, console):
    """A checkpoint of a steered run holds its changes (config["schedule"]); resumed in the
    page, the run showed none: no record of them, and Download schedule saved []."""
    changes = [{"step": 1, "lr": 0.002}, {"step": 2, "steps": 6}]
    saved = steered_checkpoint(tmp_path / "steered.pt", 4, changes)
    server = local_server(tmp_path)
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        page.fill("#config-form [name=steps]", "8")  # the file's run ended at its step 6
        page.set_input_files("#upload", str(saved))
        page.click("#resume-confirm")
        wait(page, "s => ['done', 'failed'].includes(s.state)", 120_000)
        s = status(page)
        page.wait_for_selector("#download-schedule", state="visible")
        with page.expect_download() as download:
            page.click("#download-schedule")
        downloaded = json.loads(Path(download.value.path()).read_text())
    finally:
        server.close()
    assert s["state"] == "done" and s["step"] == 8, s["error"]
    assert s["schedule"] == changes, s["schedule"]
    assert downloaded == changes, downloaded


def test_a_checkpoint_saved_at_a_stop_resumed_for_more_steps_trains_on_to_them(
        local_browser, tmp_path, console):
    """A run stopped at step 3 and saved, resumed in the page with 40 steps: it trained to 40
    (the same hash as `train --resume`), but the page applied the file's Stop to the resumed
    run's config again: "step 4 of 3" while it trained, "Stopped at step 40 of ..." at the
    end, and a "changed after step 3" note beside its steps. The changes are listed in words.
    """
    changes = [{"step": 1, "lr": 0.002}, {"step": 3, "steps": 3}]
    saved = steered_checkpoint(tmp_path / "stopped.pt", 5, changes)
    server = local_server(tmp_path)
    notes = "() => ['lr', 'steps'].map(n => document.querySelector(`#config-form [name=${n}]`)" \
            ".closest('label').querySelector('.steered')).map(e => e.hidden ? '' : e.textContent)"
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        page.fill("#config-form [name=steps]", "40")
        page.set_input_files("#upload", str(saved))
        page.click("#resume-confirm")
        wait(page, "s => s.state === 'training' && s.step >= 4", 120_000)
        during = status(page)
        banner = page.inner_text("#readiness")
        wait(page, "s => ['done', 'failed'].includes(s.state)", 120_000)
        page.wait_for_timeout(500)  # a render after the end
        s, end, shown = status(page), page.inner_text("#readiness"), page.evaluate(notes)
        listed = page.inner_text("#steer") if page.is_visible("#steer-changes") else ""
    finally:
        server.close()
    assert (during["steps"], during["config"]["steps"], during["config"]["lr"]) == (40, 40, 0.002)
    assert re.match(r"Training: step \d+ of 40 with 1 peer", banner), banner
    assert s["state"] == "done" and s["step"] == 40, s["error"]
    assert s["stoppedFrom"] is None and s["schedule"] == changes, s
    assert end.startswith("Finished: step 40, state hash "), end
    # the file's lr change is still the run's lr; its Stop is not the run's steps
    assert shown == ["changed after step 1", ""], shown
    # the changes in words beside Download schedule (it showed the button alone)
    assert "learning rate 0.002 after step 1; stopped at step 3." in listed, listed


def test_the_servers_text_is_marked_unavailable_when_it_cannot_serve_it(local_browser,
                                                                      tmp_path, console):
    """A server whose shards are out of reach: "this server's /data" started a run that
    stopped at its first step, in words of flags the page has not (--data-fallback)."""
    (tmp_path / "server-data").mkdir()
    server = LocalServer(tmp_path / "server-data",
                         args=["--data-url", "http://127.0.0.1:9/none.parquet"])
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        option = page.locator("#config-form [name=data] option[value=server]")
        page.wait_for_function("() => document.querySelector("
                               "'#config-form [name=data] option[value=server]')"
                               ".textContent.includes('unavailable')", timeout=30_000)
        label, why = option.inner_text(), option.get_attribute("title")
        # the page's own question was a 503 in the console of every such server's page
        probed = [line for line in console if "503" in line]
        for name, value in TINY.items():
            page.fill(f"#config-form [name={name}]", value)
        page.select_option("#config-form [name=data]", "server")
        page.click("#start")
        page.wait_for_selector("#form-error", state="visible")
        said = page.inner_text("#form-error")
        state = status(page)["state"]
    finally:
        server.close()
    assert label == "this server's /data (unavailable now)", label
    assert probed == [], probed
    assert "127.0.0.1:9" in why or "none.parquet" in why or "shard" in why, why
    assert said.startswith("could not start: this server cannot serve its text now ("), said
    assert said.endswith("): choose the built-in corpus or a file you upload"), said
    assert state == "ready"


def test_the_form_shows_the_values_the_leader_steered_the_run_to(local_browser, tmp_path,
                                                                console):
    """The leader changed the learning rate and the steps of its run: the schedule said so,
    but the form went on showing the values the run started with, during the run and after
    it. It shows the run's values now, says where steering changed them, and keeps them
    once the run is over (a new start goes on from what was used last). status().config
    says the same (its steps stayed the run's first)."""
    server = local_server(tmp_path)
    form = "() => Object.fromEntries(['lr', 'steps'].map(n => { " \
           "const f = document.querySelector(`#config-form [name=${n}]`); " \
           "return [n, {value: f.value, note: f.closest('label').querySelector('.steered')" \
           "?.textContent ?? '', title: f.title}]; }))"
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        for name, value in {**TINY, "steps": "5000", "lr": "0.003"}.items():
            page.fill(f"#config-form [name={name}]", value)
        page.click("#start")
        wait(page, "s => s.state === 'training' && s.step >= 1", 120_000)
        page.fill("#steer-lr", "0.001")
        page.fill("#steer-steps", "4000")
        page.click("#apply-change")
        wait(page, "s => s.schedule.length === 1", 60_000)
        changed_at = status(page)["schedule"][0]["step"]
        page.wait_for_timeout(500)  # a render after the change
        during = page.evaluate(form)
        steered = status(page)
        page.evaluate("(request) => daisychain.steer(request)", {"stop": True})
        wait(page, "s => ['done', 'failed'].includes(s.state)", 60_000)
        s = status(page)
        page.wait_for_timeout(500)
        after = page.evaluate(form)
        page.fill("#config-form [name=steps]", "300")  # the next run's: no longer the leader's
        page.wait_for_timeout(500)
        edited = page.evaluate(form)["steps"]
    finally:
        server.close()
    stopped_at = s["schedule"][-1]["step"]
    assert during == {
        "lr": {"value": "0.001", "note": f"changed after step {changed_at}",
               "title": f"changed by the run's leader: 0.001 after step {changed_at}"},
        "steps": {"value": "4000", "note": f"changed after step {changed_at}",
                  "title": f"changed by the run's leader: 4000 after step {changed_at}"}}, during
    assert (steered["config"]["lr"], steered["config"]["steps"], steered["steps"]) == (
        0.001, 4000, 4000), steered["config"]
    assert (s["config"]["lr"], s["config"]["steps"], s["steps"]) == (
        0.001, stopped_at, stopped_at), s["config"]
    assert s["state"] == "done" and s["schedule"][-1] == {"step": stopped_at,
                                                         "steps": stopped_at}, s
    # A Stop is the change {step: S, steps: S}; the next Start begins from the steps chosen
    # before it (4000), not from the step it was stopped at (it trained only that far).
    assert s["stoppedFrom"] == 4000, s["stoppedFrom"]
    assert after == {"lr": during["lr"], "steps": {
        "value": "4000", "note": f"changed after step {changed_at}; stopped at step {stopped_at}",
        "title": f"changed by the run's leader: 4000 after step {changed_at}; the run was "
                 f"stopped at step {stopped_at}"}}, after
    assert edited == {"value": "300", "note": "", "title": ""}, edited


def test_a_run_that_starts_settles_a_start_refused_before_it(local_browser, tmp_path,
                                                               console):
    """A host's Start refused, then a run started by another peer: "could not start: ..."
    stayed beside the button and at the top through that run and after it (a newcomer
    trial). Here the run comes by the page's API, not its form, as a member's would."""
    server = local_server(tmp_path)
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        page.fill("#config-form [name=width]", "")
        page.click("#start")
        page.wait_for_selector("#form-error", state="visible", timeout=10_000)
        refused = (page.inner_text("#form-error"), page.is_visible("#alert"))
        page.evaluate("(c) => daisychain.start(c)", {**LONG_RUN, "steps": 3})
        wait(page, "s => s.state === 'done'", 120_000)
        page.wait_for_timeout(300)  # a frame
        after = (page.is_hidden("#form-error"), page.is_hidden("#alert"))
    finally:
        server.close()
    assert refused[0].startswith("could not start: width") and refused[1], refused
    assert after == (True, True), after
