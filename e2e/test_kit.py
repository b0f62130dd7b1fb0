"""The inference kit (`python -m pynode kit`): one HTML file, opened from file:// with every
network request aborted, gives the bytes of `python -m pynode generate` for the same
checkpoint, prompt, seed, temperature and top-k. Its size stays within 1.4 x the weights'
bytes + 300 KB.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from browser_helpers import CHROMIUM_FLAGS, missing_browser_parts

from pynode.cli.main import main
from pynode.config import RunConfig
from pynode.core.gpt import gpt_init_params
from pynode.run.generate import GenerateError, Sampling, load_generator, read_model
from pynode.run.trainer import Trainer, TrainState
from pynode.tasks import load_task
from pynode.tasks.gpt import gpt_config

pytestmark = [pytest.mark.slow]

CFG = RunConfig(steps=4, seed=1, width=32, layers=2, heads=2, seq=16)
CASES = [  # (prompt, sampling): greedy, sampled, top-k, multi-byte UTF-8, past the context
    ("The ", dict(tokens=40, temperature=0.0, top_k=0, seed=0)),
    ("The ", dict(tokens=40, temperature=1.0, top_k=0, seed=3)),
    ("h\u00e9llo \u20ac \U0001f33c", dict(tokens=40, temperature=0.7, top_k=5, seed=11)),
    ("0123456789abcdefghijklmnop", dict(tokens=50, temperature=1.3, top_k=20, seed=2)),
    ("a", dict(tokens=25, temperature=0.5, top_k=1, seed=9)),
    ("\u00e9" * 12, dict(tokens=60, temperature=0.9, top_k=0, seed=2**40 + 5)),
]


def sharp_checkpoint() -> bytes:
    """Init weights scaled up: attention and logits far from uniform, every rounding counts."""
    trainer = Trainer(CFG, load_task("gpt"), None)
    params = {k: v if k.endswith(".g") else v * np.float32(25)
              for k, v in gpt_init_params(gpt_config(CFG), 5).items()}
    trainer.state = TrainState(step=3, params=params, opt=trainer.state.opt)
    return trainer.state_bytes()


def test_the_kit_gives_the_cli_bytes_offline(tmp_path: Path):
    reason = missing_browser_parts()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    saved = tmp_path / "run.pt"
    saved.write_bytes(sharp_checkpoint())
    kit = tmp_path / "kit.html"
    assert main(["kit", str(saved), "-o", str(kit)]) == 0
    weight_bytes = 4 * sum(p.size for p in read_model(saved.read_bytes())[1].params.values())
    assert kit.stat().st_size <= 1.4 * weight_bytes + 300_000

    generator = load_generator(saved.read_bytes(), backend="numpy_int", kernels="numpy")
    want = [bytes(generator.generate(p.encode(), Sampling(**s))).hex() for p, s in CASES]
    # Whole windows of those bytes, fed in two ways: the logits' bits, not only the bytes.
    windows = [(list((p.encode() + bytes.fromhex(w))[:CFG.seq]), n)
               for (p, _), w, n in zip(CASES, want, (1, 5, 16, 9, 3, 12), strict=True)]
    noise = np.random.default_rng(7)  # and random windows, for the rarer roundings
    windows += [([int(t) for t in noise.integers(0, 256, CFG.seq)], int(noise.integers(1, 17)))
                for _ in range(40)]
    want_logits = []
    for tokens, n in windows:
        rows = [generator.decoder.restart(tokens[:n])[-1]]
        rows += [generator.decoder.feed([t])[-1] for t in tokens[n:]]
        want_logits.append(b"".join(r.astype("<f4").tobytes() for r in rows).hex())
    requests, errors = [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"),
                                     args=CHROMIUM_FLAGS)
        context = browser.new_context()
        context.route("**/*", lambda route: route.abort()
                      if not route.request.url.startswith("file:") else route.continue_())
        page = context.new_page()
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(kit.as_uri())
        got = [page.evaluate("([p, s]) => kit.generate(p, s)", [p, s]) for p, s in CASES]
        logits = [page.evaluate("([t, n]) => kit.logits(t, n)", [t, n]) for t, n in windows]
        # A long generation: Generate is off until it ends or Stop is pressed (a second
        # one interleaved with it on the shared window, giving neither's bytes).
        page.fill("#form [name=prompt]", "The ")
        page.fill("#form [name=tokens]", "1e6")  # the number the field shows, not 1
        page.fill("#form [name=temperature]", "0")
        page.click("#generate")
        page.wait_for_function("() => document.querySelector('#output').textContent.length "
                               "> 60", timeout=30_000)
        buttons = page.evaluate("() => ['generate', 'stop'].map(id => "
                                "document.getElementById(id).disabled)")
        page.evaluate("() => document.getElementById('form').requestSubmit()")  # Enter
        busy = page.evaluate("""() => { try { kit.generate("a", {tokens: 5, temperature: 0,
            top_k: 0, seed: 0}); } catch (e) { return e.message; } }""")
        page.click("#stop")
        page.wait_for_function("() => !document.querySelector('#generate').disabled",
                               timeout=30_000)
        stopped = page.inner_text("#output")
        page.wait_for_timeout(300)
        stopped_stays = page.inner_text("#output") == stopped
        page.fill("#form [name=prompt]", CASES[2][0])
        for name, value in CASES[2][1].items():
            page.fill(f"#form [name={name}]", str(value))
        page.click("#generate")
        shown = CASES[2][0] + bytes.fromhex(want[2]).decode("utf-8", "replace")
        page.wait_for_function("(t) => document.querySelector('#output').textContent === t",
                               arg=shown, timeout=30_000)
        # an emptied field, an empty prompt: in the page's Generate panel's words (it said
        # "tokens must be an integer ..., got NaN" for its "bytes" field)
        empties = []
        for name, value in (("temperature", ""), ("tokens", ""), ("prompt", "")):
            page.fill(f"#form [name={name}]", value)
            page.evaluate("() => { document.querySelector('#output').textContent = ''; }")
            page.click("#generate")
            page.wait_for_function("() => document.querySelector('#output').textContent"
                                   ".startsWith('error: ')", timeout=30_000)
            empties.append(page.inner_text("#output"))
            page.fill(f"#form [name={name}]", {"temperature": "0", "tokens": "5"}.get(
                name, CASES[2][0]))
        form_refusals = []
        # (what the browser's own checks let through: "2.5" bytes never submits)
        for name, value in (("temperature", "1e-40"), ("tokens", "1e20")):
            page.fill("#form [name=temperature]", "0.7")
            page.fill(f"#form [name={name}]", value)
            page.evaluate("() => { document.querySelector('#output').textContent = ''; }")
            page.click("#generate")
            page.wait_for_function("() => document.querySelector('#output').textContent"
                                   ".startsWith('error: ')", timeout=30_000)
            form_refusals.append(page.inner_text("#output").removeprefix("error: "))
            page.fill("#form [name=tokens]", "5")
        overflow = page.evaluate("""() => { try { kit.generate("The ", {tokens: 5,
            temperature: 1.2e-38, top_k: 0, seed: 0}); } catch (e) { return e.message; } }""")
        refused = page.evaluate("""() => { try { kit.generate("a", {tokens: 5,
            temperature: 1, top_k: NaN, seed: 0}); } catch (e) { return e.message; } }""")
        browser.close()
    assert refused == "top_k must be an integer from 0 to 9007199254740991, got NaN"
    assert buttons == [True, False], buttons
    assert busy == "the form's generation is under way: Stop it first", busy
    assert stopped_stays, "Stop ends the generation"
    greedy = bytes(generator.generate(b"The ", Sampling(tokens=len(stopped.encode()),
                                                        temperature=0.0)))
    shown_greedy = stopped.removeprefix("The ").rstrip("\ufffd")
    assert len(shown_greedy) > 40 and greedy.decode("utf-8", "replace").startswith(
        shown_greedy), (stopped, greedy)
    python_refusals = []  # the same words as pynode's
    for sampling in (dict(temperature=1e-40), dict(tokens=10**20)):
        with pytest.raises(GenerateError) as caught:
            Sampling(**{"tokens": 5, "temperature": 0.7, **sampling})
        python_refusals.append(str(caught.value))
    assert empties == ['error: temperature must be a number, got ""',
                       'error: bytes must be a whole number, got ""',
                       "error: the prompt is empty: write at least one character for the "
                       "model to continue"], empties
    # pynode's words, the form's field named as the form names it
    assert form_refusals == [r.replace("tokens", "bytes") for r in python_refusals]
    with pytest.raises(GenerateError) as caught:
        bytes(generator.generate(b"The ", Sampling(tokens=5, temperature=1.2e-38)))
    assert overflow == str(caught.value), overflow
    assert not errors, errors
    assert requests == [kit.as_uri()], requests  # the file itself, nothing else
    for case, g, w in zip(CASES, got, want, strict=True):
        assert g == w, f"{case}: kit {g} != generate {w}"
    assert len(set(want)) == len(CASES)
    for window, g, w in zip(windows, logits, want_logits, strict=True):
        assert g == w, f"logits of {window} differ"
