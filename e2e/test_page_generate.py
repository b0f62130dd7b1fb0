"""The page's prompt box: generating from this page's state during a run changes no hash of
the run, and gives the bytes native generation gives from the same step's state; after the
run, from the prompt box and from an uploaded .pt alike; its inference kit is the one
`python -m pynode kit` writes. One tab, a server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from browser_helpers import status, wait, wait_booted
from local_page import LocalServer, open_page

from pynode.config import RunConfig
from pynode.run.assemble import build_trainer
from pynode.run.generate import Generator, Sampling
from pynode.run.kit import build_kit
from pynode.run.trainer import Trainer, TrainState
from pynode.tasks import load_task

pytestmark = [pytest.mark.slow]

RUN = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
       "microbatches": 2, "steps": 300, "seed": 5}
DURING = {"prompt": "Th\u00e9 ", "tokens": 24, "temperature": 0.9, "top_k": 0, "seed": 3}
AFTER = {"prompt": "an ", "tokens": 30, "temperature": 0.6, "top_k": 8, "seed": 1}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LocalServer]:
    """`python -m server` on 127.0.0.1 for one test, its state in tmp_path/data."""
    (tmp_path / "data").mkdir()
    running = LocalServer(tmp_path / "data")
    yield running
    running.close()


# daisychain.start(config) in a page: null once started, else the reason it was refused
START_OR_REASON = """async (config) => {
    try { await daisychain.start(config); return null; } catch (e) { return e.message; }
}"""


def native_run(steps: int) -> tuple[list[str], dict[int, Generator]]:
    """The run natively: its per-step hashes, and a Generator of the state after each step.
    In a thread of its own: Playwright's sync API keeps an event loop running in this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_native_run, steps).result()


def _native_run(steps: int) -> tuple[list[str], dict[int, Generator]]:
    trainer = build_trainer(RunConfig(**RUN))
    hashes, generators = [], {}

    async def run() -> None:
        for _ in range(steps):
            result = await trainer.step()
            hashes.append(result.hash)
            params = {k: v.copy() for k, v in trainer.state.params.items()}
            generators[result.step] = Generator(trainer.cfg, params, trainer.gemm, result.step)

    asyncio.run(run())
    return hashes, generators


def native_text(generator: Generator, request: dict) -> str:
    sampling = Sampling(tokens=request["tokens"], temperature=request["temperature"],
                        top_k=request["top_k"], seed=request["seed"])
    return bytes(generator.generate(request["prompt"].encode(), sampling)).decode(
        "utf-8", "replace")


def test_generating_during_a_run_changes_no_hash(local_browser, server: LocalServer,
                                                 tmp_path: Path):
    console: list[str] = []
    try:
        page = open_page(local_browser, f"{server.url}/?create=1", console)
        wait_booted(page)
        assert status(page)["state"] == "ready", status(page)["error"]
        page.evaluate("() => daisychain.bootGenerator()")  # its own Pyodide: seconds
        page.evaluate("(config) => daisychain.start(config)", RUN)
        wait(page, "s => s.state === 'training' && s.step >= 2", 120_000)
        during = page.evaluate("""async (request) => {
            const done = await daisychain.generate(request);
            return {done, state: daisychain.status().state};
        }""", DURING)
        wait(page, "s => ['done', 'failed'].includes(s.state)", 300_000)
        final = status(page)

        page.fill("#generate-form [name=prompt]", AFTER["prompt"])
        for name in ("tokens", "temperature", "top_k", "seed"):  # 30 bytes as "3e1": the
            shown = "3e1" if name == "tokens" else str(AFTER[name])  # field's number (not 3)
            page.fill(f"#generate-form [name={name}]", shown)
        page.click("#generate")
        page.wait_for_function("() => /bytes from the model at step/.test("
                               "document.querySelector('#generate-line').textContent)",
                               timeout=60_000)
        after_live = page.inner_text("#generate-output")
        # A long one ended by Stop: its bytes so far stay, and Generate is on again
        page.fill("#generate-form [name=tokens]", "1e5")
        page.click("#generate")
        page.wait_for_function("(n) => document.querySelector('#generate-output')"
                               ".textContent.length > n", arg=len(AFTER["prompt"]) + 40,
                               timeout=60_000)
        page.click("#generate-stop")
        page.wait_for_function("() => /, stopped\\.$/.test("
                               "document.querySelector('#generate-line').textContent)",
                               timeout=60_000)
        stopped = page.inner_text("#generate-output")
        stop_buttons = page.evaluate("() => ['generate', 'generate-stop'].map(id => "
                                     "document.getElementById(id).disabled)")
        # Stopped before it reached the generator (the panel's Stop while the state is
        # copied out), or by a script later, as the panel's Stop does
        long_request = {**AFTER, "tokens": 20_000}  # far more than any stop lets through
        stopped_at_once = page.evaluate("""(r) => daisychain.generate(r, null,
            {stopped: true})""", long_request)
        stopped_later = page.evaluate("""async (r) => {
            const control = {stopped: false};
            setTimeout(() => { control.stopped = true; }, 300);
            return daisychain.generate(r, null, control);
        }""", long_request)
        page.fill("#generate-form [name=tokens]", str(AFTER["tokens"]))
        with page.expect_download() as state:
            page.click("#download")
        with page.expect_download() as kit:
            page.click("#download-kit")
        page_state = Path(state.value.path()).read_bytes()
        page_kit = Path(kit.value.path()).read_text(encoding="utf-8")

        hashes, generators = native_run(RUN["steps"])
        saved = tmp_path / "final.pt"
        saved.write_bytes(final_state(generators))
        page.select_option("#generate-form [name=source]", "file")
        page.set_input_files("#generate-file", str(saved))
        page.evaluate("() => { document.querySelector('#generate-output').textContent = ''; }")
        page.click("#generate")
        page.wait_for_function(f"() => /at step {RUN['steps']} in/.test("
                               "document.querySelector('#generate-line').textContent)",
                               timeout=60_000)
        after_file = page.inner_text("#generate-output")
        line = page.inner_text("#generate-line")
    finally:
        print("\n".join(console[-100:]))
    assert final["state"] == "done", final["error"]
    assert [h["hash"] for h in final["history"]] == hashes  # every step, generation or not
    done = during["done"]
    assert during["state"] == "training" and 2 <= done["step"] < RUN["steps"], during
    assert not {"type", "id"} & set(done), done  # the answer, not the worker's envelope
    assert done["text"] == native_text(generators[done["step"]], DURING)
    want_after = AFTER["prompt"] + native_text(generators[RUN["steps"]], AFTER)
    assert after_live == want_after
    long_text = native_text(generators[RUN["steps"]], {**AFTER, "tokens": len(stopped) * 4})
    assert stopped.startswith(AFTER["prompt"]) and len(stopped) < 5_000, len(stopped)
    assert long_text.startswith(stopped.removeprefix(AFTER["prompt"]).rstrip("\ufffd"))
    assert stop_buttons == [False, True]
    early = [bytes.fromhex(g["bytes"]) for g in (stopped_at_once, stopped_later)]
    assert stopped_at_once["stopped"] and stopped_later["stopped"]
    assert all(0 < len(e) < 2_000 for e in early), [len(e) for e in early]
    sampling = Sampling(tokens=max(map(len, early)), temperature=AFTER["temperature"],
                        top_k=AFTER["top_k"], seed=AFTER["seed"])
    native = bytes(generators[RUN["steps"]].generate(AFTER["prompt"].encode(), sampling))
    assert all(native.startswith(e) for e in early)  # the first bytes of the whole one
    assert after_file == want_after, line
    assert page_kit == build_kit(page_state)  # the page's kit is the command's, byte for byte


def final_state(generators: dict[int, Generator]) -> bytes:
    """The native run's final weights as a .pt (what the test uploads)."""
    trainer = Trainer(RunConfig(**RUN), load_task("gpt"), None)
    trainer.state = TrainState(step=RUN["steps"], params=generators[RUN["steps"]].decoder.params,
                               opt=trainer.state.opt)
    return trainer.state_bytes()


def test_a_text_source_the_page_cannot_read_fails_the_run_with_the_reason(local_browser,
                                                                          server: LocalServer):
    """A data server the page cannot reach (here a host its policy refuses; a server gone
    mid-run alike) raised a JavaScript NetworkError that escaped every handler: the run
    stayed 'training' at its step forever, nothing said why. An upload the server no longer
    holds was read as text (its 404's body) and called a digest mismatch."""
    console: list[str] = []
    gone = "0" * 64
    page = open_page(local_browser, f"{server.url}/?create=1", console)
    wait_booted(page)
    refused = page.evaluate(START_OR_REASON, {**RUN, "steps": 3, "data": "http://127.0.0.1:1"})
    assert refused is None  # started: the leader reads nothing before its first step
    wait(page, "s => ['done', 'failed'].includes(s.state)", 120_000)
    final = status(page)
    assert final["state"] == "failed", final
    assert "DataSourceError: data server http://127.0.0.1:1 cannot be reached" in \
        final["error"], final["error"]
    page.context.close()
    page = open_page(local_browser, f"{server.url}/?create=1", console)
    wait_booted(page)
    refused = page.evaluate(START_OR_REASON, {**RUN, "steps": 3,
                                    "data": f"{server.url}/uploads/{gone}#sha256={gone}"})
    assert "answered 404: no uploaded text" in refused, refused  # not "has sha256 ..."


def test_a_page_the_host_has_not_approved_cannot_lead_a_run(local_browser, server: LocalServer):
    """Its Start button is off, but daisychain.start() trained a run anyway."""
    console: list[str] = []
    host = open_page(local_browser, f"{server.url}/?create=1", console)
    room = status(host)["room"]
    pending = open_page(local_browser, f"{server.url}/?room={room}", console)
    wait_booted(pending)
    assert status(pending)["approved"] is False
    refused = pending.evaluate(START_OR_REASON, {**RUN, "steps": 2})
    assert refused and "waits for the host of this room to approve it" in refused, refused
    assert status(pending)["state"] == "ready" and status(pending)["step"] == 0
    # a code that is no room: the banner said "waiting for the host to approve" beside
    # the room panel's "not a room code"
    nowhere = local_browser.new_context().new_page()  # no peer id ever: not open_page
    nowhere.goto(f"{server.url}/?room=BADCODE")
    nowhere.wait_for_function("() => window.daisychain", timeout=30_000)
    wait(nowhere, "s => s.verified && s.roomProblem", 120_000)
    banner = nowhere.inner_text("#readiness")
    assert banner.startswith("Checks passed; not in a room: ") and "BADCODE" in banner, banner


def finished_and_continued(path: Path) -> str:
    """A 2-step run's checkpoint written to `path`; the hash `train --resume path --steps 4`
    ends on. In a thread of its own (Playwright's sync API runs a loop in this one)."""
    from pynode.run.assemble import read_resume

    def run() -> str:
        trainer = build_trainer(RunConfig(**{**RUN, "steps": 2}))
        for _ in range(2):
            asyncio.run(trainer.step())
        path.write_bytes(trainer.state_bytes())
        cfg, ckpt = read_resume(path.read_bytes(), {"steps": 4})
        resumed = build_trainer(cfg, resume=ckpt)
        return [asyncio.run(resumed.step()) for _ in range(2)][-1].hash

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def test_the_page_continues_a_finished_runs_checkpoint_to_the_forms_steps(
        local_browser, server: LocalServer, tmp_path: Path):
    """Uploading the checkpoint of a run that ended was refused with "give --steps above
    2", a flag the page has not got. It now continues to the form's steps, as `train
    --resume --steps` does, on the same bits; with steps not above the file's, the page says
    how to ask for more in its own terms."""
    saved = tmp_path / "finished.pt"
    want = finished_and_continued(saved)
    page = open_page(local_browser, f"{server.url}/?create=1", [])
    wait_booted(page)
    page.fill("#config-form [name=steps]", "2")
    page.set_input_files("#upload", str(saved))
    page.wait_for_selector("#resume-preview", state="visible", timeout=60_000)
    said = page.inner_text("#resume-preview tr[data-field=resume] td")
    assert "nothing to train (set steps in the form above 2 to continue it)" in said, said
    assert page.is_disabled("#resume-confirm")
    page.fill("#config-form [name=steps]", "4")  # the preview reads the file again
    page.wait_for_selector("#resume-confirm:enabled", timeout=60_000)
    page.click("#resume-confirm")
    wait(page, "s => s.state === 'done' || s.state === 'failed'", 120_000)
    assert (status(page)["step"], status(page)["hash"]) == (4, want), status(page)["error"]


def test_an_empty_prompt_or_byte_count_is_named_in_the_pages_words(local_browser,
                                                                    server: LocalServer):
    """Generate with the bytes field empty said "GenerateError: tokens must be an integer
    from 0 to ..., got None" (the page sent JSON's null for it); an empty prompt came back
    from the generation worker. The page names the field, or says the prompt is empty,
    before it asks the worker."""
    page = open_page(local_browser, f"{server.url}/?create=1", [])
    wait_booted(page)
    assert page.evaluate(START_OR_REASON, {**RUN, "steps": 2}) is None
    wait(page, "s => s.state === 'done'", 120_000)
    said = {}
    for name, prompt, tokens in (("bytes", "The ", ""), ("prompt", "", "5")):
        page.fill("#generate-form [name=prompt]", prompt)
        page.fill("#generate-form [name=tokens]", tokens)
        page.evaluate("() => { document.querySelector('#generate-error').hidden = true; }")
        page.click("#generate")
        page.wait_for_selector("#generate-error", state="visible", timeout=120_000)
        said[name] = page.inner_text("#generate-error")
    assert said == {
        "bytes": 'could not generate: bytes must be a whole number, got ""',
        "prompt": "could not generate: the prompt is empty: write at least one character "
                  "for the model to continue"}, said
