"""What a person sees on the page: an introduction at the top, errors at the top and next to
the action that failed, the server's own fix when it has no Pyodide runtime, and "Download
checkpoint" only once there is a state. One tab each, on a server at 127.0.0.1 (no namespace).

A member's form showing the leader's run needs two tabs over WebRTC: test_page_member.py
(its own module: Playwright's sync API allows one running instance at a time, and the
private network's browser of conftest.py is a second one).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import (
    CHROMIUM_FLAGS,
    missing_browser_parts,
    status,
    unavailable,
    wait,
    wait_booted,
)
from local_page import LocalServer, open_page

pytestmark = [pytest.mark.slow]

TINY = {"width": "32", "layers": "1", "heads": "2", "seq": "16", "microbatch_size": "2",
        "microbatches": "2", "steps": "2", "seed": "5"}


@pytest.fixture(scope="module")
def local_browser() -> Iterator[Any]:
    reason = missing_browser_parts()
    if reason:
        unavailable(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"),
                                     args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def local_server(tmp_path: Path, **env: str) -> LocalServer:
    (tmp_path / "server-data").mkdir()
    return LocalServer(tmp_path / "server-data", env)


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

        page.fill("#config-form [name=width]", "30")  # 4 heads do not divide 30
        page.click("#start")
        page.wait_for_selector("#form-error", state="visible")
        refused = page.inner_text("#form-error")
        alert = page.inner_text("#alert-text")
        gap = top(page, "#form-error") - top(page, "#start")
        assert status(page)["state"] == "ready" and page.is_disabled("#download")

        for name, value in TINY.items():
            page.fill(f"#config-form [name={name}]", value)
        page.click("#start")
        wait(page, "s => ['done', 'failed'].includes(s.state)", 240_000)
        s = status(page)
        page.wait_for_function("() => !document.querySelector('#download').disabled")
        after_run = {"form_error": page.is_hidden("#form-error"),
                     "note": page.inner_text("#run-note")}
        with page.expect_download() as download:
            page.click("#download")
        saved = Path(download.value.path()).read_bytes()
        name = download.value.suggested_filename
    finally:
        server.close()
    assert refused == "could not start: ConfigError: heads (4) must divide width (30)"
    assert alert == refused
    assert 0 < gap < 120, f"the error is {gap} px below the Start button"
    assert s["state"] == "done" and s["step"] == 2, s["error"]
    assert after_run["form_error"], "a started run clears the last action's error"
    assert "led by this page" in after_run["note"], after_run
    assert name == "daisychain-step2.pt" and saved[:2] == b"PK"  # a torch zip archive
