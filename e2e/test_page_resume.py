"""Resume from a checkpoint, as a person does it: the page shows what the chosen .pt is
before anything starts, and only "Resume this run" starts it. One tab on a server at
127.0.0.1 (no namespace).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from browser_helpers import (
    status,
    wait,
    wait_booted,
)
from local_page import LocalServer, open_page, steered_checkpoint

from pynode.browser_resume import preview_checkpoint
from pynode.core.checkpoint import load_checkpoint

pytestmark = [pytest.mark.slow]

CHANGES = [{"step": 1, "lr": 0.002}]
# What the preview's rows say about the checkpoint steered_checkpoint() writes.
MODEL = "gpt: width 32, 1 layer, 2 heads, sequence 16"


def preview_rows(page: Any) -> dict[str, str]:
    return page.evaluate("() => Object.fromEntries([...document.querySelectorAll("
                         "'#resume-preview tr[data-field]')].map(r => [r.dataset.field, "
                         "r.cells[1].textContent.trim()]))")


def test_choosing_a_checkpoint_shows_it_and_only_the_button_resumes(local_browser, tmp_path,
                                                                    console):
    """Choosing a .pt started the resumed run at once: a person who picked the wrong file
    had already started a run. Now the page reads the file with the resume's own checks and
    shows what it is; a file that is no checkpoint is refused there, Cancel leaves the page
    as it was, and only "Resume this run" starts the run."""
    good = steered_checkpoint(tmp_path / "run.pt", 3, CHANGES)
    junk = tmp_path / "notes.pt"
    junk.write_bytes(b"not a checkpoint")
    (tmp_path / "server-data").mkdir()
    server = LocalServer(tmp_path / "server-data")
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        page.fill("#config-form [name=steps]", "5")  # the file's run ended at its step 3
        page.set_input_files("#upload", str(junk))
        page.wait_for_selector("#form-error", state="visible", timeout=60_000)
        refused = (page.inner_text("#form-error"), page.is_hidden("#resume-preview"))

        page.set_input_files("#upload", str(good))
        page.wait_for_selector("#resume-preview", state="visible", timeout=60_000)
        rows = preview_rows(page)
        page.wait_for_timeout(1500)  # time enough for a run that was started anyway
        after_choice = (status(page)["state"], status(page)["run"], page.is_hidden("#form-error"))

        page.click("#resume-cancel")
        page.wait_for_timeout(500)
        after_cancel = (status(page)["state"], page.is_hidden("#resume-preview"),
                        page.evaluate("() => document.querySelector('#upload').files.length"))

        page.set_input_files("#upload", str(good))
        page.wait_for_selector("#resume-confirm:enabled", timeout=60_000)
        button = page.inner_text("#resume-confirm")
        page.click("#resume-confirm")
        wait(page, "s => ['done', 'failed'].includes(s.state)", 120_000)
        s = status(page)
        page.wait_for_timeout(500)  # a render after the end
        preview_after_run = page.is_hidden("#resume-preview")
    finally:
        server.close()
    state_hash = load_checkpoint(good.read_bytes()).state_hash
    assert refused[0] == ("checkpoint refused: notes.pt is not a valid DaisyChain checkpoint "
                          "(not a checkpoint: a .pt checkpoint is a zip "
                          "archive, and this file is text)"), refused
    assert refused[1], "a file that is no checkpoint has no preview"
    assert rows["model"].startswith(MODEL), rows
    assert rows["step"] == "saved at step 3 of its run's 3 steps", rows
    assert rows["hash"] == state_hash[:16], (rows, state_hash)
    assert rows["changes"] == "learning rate 0.002 after step 1", rows
    assert rows["loss"].startswith("not in the file"), rows
    assert rows["resume"] == ("continues to step 5, the form's steps (its own run ended "
                              "at step 3)"), rows
    assert after_choice == ("ready", None, True), "choosing the file started nothing"
    assert after_cancel == ("ready", True, 0), after_cancel
    assert button == "Resume this run"
    assert s["state"] == "done" and s["step"] == 5, s["error"]
    assert s["schedule"] == CHANGES, s["schedule"]
    assert preview_after_run, "the preview of a file already resumed stayed"


# A script's preview: the bytes of a file (base64), then previewResume's answer or refusal.
SCRIPTED_PREVIEW = """([b64, steps]) => daisychain.previewResume(
  b64 === null ? null : Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)).buffer, steps)
  .then((answer) => ({answer}), (err) => ({refused: err.message}))"""


def test_a_script_previews_a_resume_as_the_page_does(local_browser, tmp_path, console):
    """daisychain.resume(data, steps) started a run with no look at the file first, while
    the page's own button shows what the file is. daisychain.previewResume(data, steps)
    answers what that resume would continue, read with the resume's checks (the worker's
    preview_checkpoint), and starts nothing; a file that is no checkpoint, or data that is
    no ArrayBuffer, is refused with its reason."""
    good = steered_checkpoint(tmp_path / "run.pt", 3, CHANGES)
    data = good.read_bytes()
    encoded = base64.b64encode(data).decode()
    (tmp_path / "server-data").mkdir()
    server = LocalServer(tmp_path / "server-data")
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        extended = page.evaluate(SCRIPTED_PREVIEW, [encoded, 5])
        finished = page.evaluate(SCRIPTED_PREVIEW, [encoded, None])
        junk = page.evaluate(SCRIPTED_PREVIEW, [base64.b64encode(b"not a checkpoint").decode(),
                                                5])
        text = page.evaluate("() => daisychain.previewResume('run.pt', 5)"
                             ".then(() => null, (err) => err.message)")
        nothing = page.evaluate(SCRIPTED_PREVIEW, [None, 5])
        page.wait_for_timeout(1500)  # time enough for a run that was started anyway
        after = status(page)
    finally:
        server.close()
    assert extended == {"answer": json.loads(preview_checkpoint(data, 5))}, extended
    assert (extended["answer"]["step"], extended["answer"]["steps"]) == (3, 5), extended
    assert extended["answer"]["schedule"] == CHANGES, extended
    assert finished["answer"]["steps"] is None, finished
    refused = finished["answer"]["refused"]
    assert refused.startswith("NothingToTrainError: the checkpoint is at step 3 and the run "
                              "ends at step 3"), refused
    assert junk == {"refused": "CheckpointError: not a checkpoint: a .pt checkpoint is a zip "
                               "archive, and this file is text"}, junk
    said = "TypeError: a checkpoint is the .pt file's bytes, an ArrayBuffer (await " \
           "file.arrayBuffer()), got {}"
    assert text == said.format("a string"), text
    assert nothing == {"refused": said.format("null")}, nothing
    assert (after["state"], after["run"]) == ("ready", None), "a preview starts nothing"
