"""`pynode generate`: the cached forward is the training forward's bits, the same bytes on
every backend, sampling by its stated rule, and the command's refusals.

The uncached oracle recomputes the whole window through `GPT.forward_logits` (the training
forward, padded to the context) for every byte; the decoder must give its bits exactly.
"""

from __future__ import annotations

import codecs
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pynode.cli.generate import stream_text
from pynode.cli.main import main
from pynode.config import RunConfig
from pynode.core import rng
from pynode.core.gpt import GPT
from pynode.core.kernels import REFERENCE
from pynode.run.assemble import load_units_and_gemm
from pynode.run.generate import (
    TEMPERATURE_MAX,
    TEMPERATURE_MIN,
    Decoder,
    GenerateError,
    Generator,
    Sampling,
    load_generator,
    read_model,
    sample_token,
)
from pynode.run.trainer import Trainer, TrainState
from pynode.tasks import load_task
from pynode.tasks.gpt import gpt_config

SMALL = RunConfig(steps=4, seed=1, width=32, layers=2, heads=2, seq=16)
SAMPLINGS = [Sampling(tokens=40, temperature=0.0), Sampling(tokens=40, temperature=1.0, seed=3),
             Sampling(tokens=40, temperature=0.7, top_k=5, seed=11),
             Sampling(tokens=25, temperature=1.5, top_k=1)]
PROMPTS = [b"The ", "h\u00e9llo \u20ac ".encode(), bytes(range(40, 70))]  # the last > context


def sharp_params(cfg: RunConfig, seed: int = 5) -> dict[str, np.ndarray]:
    """Init weights scaled up so that attention and logits are far from uniform: every
    kernel's rounding then matters to the bytes chosen."""
    params = GPT(gpt_config(cfg), None).init_params(seed)
    return {k: v if k.endswith(".g") else v * np.float32(25) for k, v in params.items()}


def checkpoint_bytes(cfg: RunConfig = SMALL, params: dict | None = None) -> bytes:
    trainer = Trainer(cfg, load_task(cfg.task), None)
    if params is not None:
        trainer.state = TrainState(step=2, params=params, opt=trainer.state.opt)
    return trainer.state_bytes()


@pytest.fixture(scope="module")
def checkpoint() -> bytes:
    return checkpoint_bytes(SMALL, sharp_params(SMALL))


@pytest.fixture(scope="module")
def reference_arithmetic():
    return load_units_and_gemm("numpy_int", "numpy")


def test_cached_logits_are_the_full_window_forward_bits(reference_arithmetic):
    _, gemm = reference_arithmetic
    model = GPT(gpt_config(SMALL), gemm)
    params = sharp_params(SMALL)
    tokens = np.random.default_rng(0).integers(0, 256, SMALL.seq)
    want = model.forward_logits(params, tokens[None])[0]  # (S, V) f32
    decoder = Decoder(model, params)
    for splits in ([16], [1] * 16, [5, 1, 1, 9], [3, 13]):
        rows, at = [], 0
        for n in splits:
            rows.append(decoder.feed(tokens[at : at + n]) if at else decoder.restart(tokens[:n]))
            at += n
        got = np.concatenate(rows)
        assert got.tobytes() == want.tobytes(), f"prefill splits {splits}"
    with pytest.raises(GenerateError, match="cannot append 1 tokens to a window of 16"):
        decoder.feed([1])


@pytest.mark.slow
def test_generation_equals_the_uncached_rule(checkpoint, reference_arithmetic):
    from pynode.bench.generate import uncached_bytes  # the rule `bench generate` times

    generator = load_generator(checkpoint, arithmetic=reference_arithmetic)
    for prompt in PROMPTS:
        for sampling in SAMPLINGS:
            got = bytes(generator.generate(prompt, sampling))
            assert got == uncached_bytes(generator, prompt, sampling), (prompt, sampling)


def backends_here() -> list[str]:
    from pynode.gemm_backends import NATIVE_ORDER, available_backends
    from pynode.unitfiles import load_default_units

    found, _ = available_backends(NATIVE_ORDER, load_default_units().mul_lut)
    return [b.name for b in found]


@pytest.mark.slow
def test_the_same_bytes_on_every_backend_and_kernels(checkpoint):
    runs = {}
    names = backends_here()
    assert {"reference", "numpy_int", "blas_float"} <= set(names)
    for backend in names:
        for kernels in ("numpy", None):  # None: numba where it passes its gate
            generator = load_generator(checkpoint, backend=backend, kernels=kernels)
            assert generator.decoder.model.gemm.backend_name == backend
            runs[backend, generator.decoder.model.ops.name] = [
                bytes(generator.generate(p, s)) for p in PROMPTS[:2] for s in SAMPLINGS]
    first = next(iter(runs.values()))
    assert all(r == first for r in runs.values()), {k: r[1][:8] for k, r in runs.items()}
    assert len(set(first)) > 3  # the samplings differ: the settings reach the bytes


def test_sampling_follows_the_weights_and_top_k():
    logits = np.array([2.0, 0.5, 2.0, -1.0, 1.0] + [-30.0] * 3, np.float32)
    sampling = Sampling(temperature=0.5, top_k=4, seed=9)
    draws = np.array([sample_token(logits, sampling, pos, REFERENCE) for pos in range(4000)])
    kept = [0, 1, 2, 4]  # the 4 largest: 2.0, 2.0, 1.0, 0.5
    assert set(draws) <= set(kept)
    e = np.exp((logits[kept] - 2.0) / 0.5)
    want = e / e.sum()
    got = np.array([(draws == k).mean() for k in kept])
    assert np.abs(got - want).max() < 0.03, (got, want)
    assert sample_token(logits, Sampling(temperature=0), 0, REFERENCE) == 0  # first largest
    assert {sample_token(logits, Sampling(top_k=1, seed=s), 7, REFERENCE)
            for s in range(50)} == {0}  # the tie goes to the lower byte


def test_a_temperature_float32_cannot_hold_or_divide_by_is_refused_by_name():
    """1e-40 is 0 or a subnormal as a float32, 1e39 past its largest: they failed inside
    the softmax (or warned on the cast). A tiny normal one that makes the logits overflow
    is named where it does."""
    for t in (1e-40, 1e-50, 1e39, float(np.nextafter(np.float32(TEMPERATURE_MIN), 0))):
        with pytest.raises(GenerateError, match=r"^temperature must be 0 \(greedy\) or a "
                           r"float32 from 1.2e-38 to 3.4e38, got "):
            Sampling(temperature=t)
    for t in (0, 0.0, TEMPERATURE_MIN, TEMPERATURE_MAX, 1e-30):
        Sampling(temperature=t)
    logits = np.array([1.0, 5.0, 2.0, 0.0], np.float32)  # 5 / 1.2e-38 > 3.4e38
    with pytest.raises(GenerateError, match=r"^temperature 1.2e-38 is too small for this "
                       r"model: the logits divided by it overflow float32"):
        sample_token(logits, Sampling(temperature=1.2e-38), 0, REFERENCE)
    assert sample_token(logits, Sampling(temperature=TEMPERATURE_MAX), 0, REFERENCE) in range(4)
    assert sample_token(logits / np.float32(1e9), Sampling(temperature=1e-30), 0,
                        REFERENCE) == 1  # a large but finite scale: all on the largest


def test_the_draw_is_the_keyed_randint(monkeypatch):
    """The rule, step by step: weights floor(p * 2**31), randint keyed (seed, position, 0x5A3D)."""
    logits = np.array([1.0, 3.0, 2.0, 0.0], np.float32)
    seen = []
    real = rng.randint

    def spy(key, shape, high):
        seen.append((key, high))
        return real(key, shape, high)

    monkeypatch.setattr(rng, "randint", spy)
    token = sample_token(logits, Sampling(temperature=1.0, top_k=3, seed=4), 12, REFERENCE)
    probs = REFERENCE.softmax_rows(np.array([[1.0, 3.0, 2.0]], np.float32))[0]
    weights = [int(p * 2**31) for p in probs.astype(np.float64)]
    assert seen == [((4, 12, 0x5A3D), sum(weights))]
    draw = int(real((4, 12, 0x5A3D), 1, sum(weights))[0])
    assert token == [0, 1, 2][int(np.searchsorted(np.cumsum(weights), draw, side="right"))]


def test_streamed_text_never_splits_a_character():
    text = "a\u00e9\u20ac\U0001f33c b"
    writes = []

    class Out(io.StringIO):
        def write(self, s):
            writes.append(s)
            return len(s)

    class Fixed(Generator):
        def __init__(self):
            pass

        context = 16

        def generate(self, prompt, sampling):
            yield from text.encode()

    produced = stream_text(Fixed(), b"x", Sampling(), Out())
    assert produced == text.encode()
    assert "".join(writes) == text + "\n"
    assert [w for w in writes if w] == ["a", "\u00e9", "\u20ac", "\U0001f33c", " ", "b", "\n"]
    assert codecs.decode(produced, "utf-8") == text

    class Interrupted(Fixed):  # Ctrl-C mid-text: "interrupted" was glued onto the text
        def generate(self, prompt, sampling):
            yield from b"asis"
            raise KeyboardInterrupt

    writes.clear()
    with pytest.raises(KeyboardInterrupt):
        stream_text(Interrupted(), b"x", Sampling(), Out())
    assert "".join(writes) == "asis\n"


def test_the_command_streams_a_continuation(tmp_path, capsys, checkpoint, reference_arithmetic):
    path = tmp_path / "run.pt"
    path.write_bytes(checkpoint)
    prompt = "x" * 20 + "\u00e9"  # 22 bytes, the context is 16
    argv = ["generate", "--checkpoint", str(path), "--prompt", prompt, "--tokens", "30",
            "--temperature", "0.9", "--top-k", "7", "--seed", "2", "--backend", "numpy_int"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    want = bytes(load_generator(checkpoint, arithmetic=reference_arithmetic).generate(
        prompt.encode(), Sampling(tokens=30, temperature=0.9, top_k=7, seed=2)))
    assert out == want.decode("utf-8", "replace") + "\n"
    assert "the prompt is 22 bytes and the model's context 16: it continues the last 16" in err


def test_the_prompt_comes_from_a_file_or_stdin_as_its_bytes(tmp_path, capsys, checkpoint,
                                                             monkeypatch):
    """--prompt-file FILE (- : stdin): bytes a shell would mangle (a NUL, a lone 0xff) or a
    prompt too long for a command line, continued as --prompt continues the same bytes."""
    import io

    path = tmp_path / "run.pt"
    path.write_bytes(checkpoint)
    prompt = b"ab\x00\xffcd"
    given = tmp_path / "prompt.bin"
    given.write_bytes(prompt)
    base = ["generate", "--checkpoint", str(path), "--tokens", "12", "--backend", "numpy_int"]
    want = bytes(load_generator(checkpoint, backend="numpy_int").generate(prompt, Sampling(
        tokens=12)))
    assert main([*base, "--prompt-file", str(given)]) == 0
    assert capsys.readouterr().out == want.decode("utf-8", "replace") + "\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(prompt)))
    assert main([*base, "--prompt-file", "-"]) == 0
    assert capsys.readouterr().out == want.decode("utf-8", "replace") + "\n"
    missing = tmp_path / "none.txt"
    err = refused([*base, "--prompt-file", str(missing)], capsys)
    assert f"ConfigError: --prompt-file {missing}: No such file or directory" in err
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert f"ConfigError: --prompt-file {empty} is empty: give at least one byte" in \
        refused([*base, "--prompt-file", str(empty)], capsys)


def refused(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, checkpoint):
    good = tmp_path / "run.pt"
    good.write_bytes(checkpoint)
    mlp = tmp_path / "mlp.pt"
    mlp.write_bytes(checkpoint_bytes(RunConfig(task="mlp", steps=2)))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    base = ["generate", "--prompt", "hi", "--checkpoint"]
    assert "No such file" in refused([*base, str(tmp_path / "none.pt")], capsys)
    assert "CheckpointError" in refused([*base, str(junk)], capsys)
    want = ("GenerateError: text generation needs a checkpoint of the gpt task; this one "
            "trains 'mlp'")
    assert want in refused([*base, str(mlp)], capsys)
    # named by their flags (they read `top_k must be ...`)
    for flag, value, what in (("--temperature", "-1", "--temperature must be"),
                              ("--top-k", "-2", "--top-k must be"),
                              ("--tokens", "-5", "--tokens must be"),
                              ("--temperature", "nan", "--temperature must be"),
                              # the kit (JavaScript numbers) could not take it: refused alike
                              ("--seed", str(2**53), "--seed must be an integer from 0 to "
                               "9007199254740991, got 9007199254740992")):
        assert f"ConfigError: {what}" in refused([*base, str(good), flag, value], capsys)
    assert main(["generate", "--checkpoint", str(good), "--prompt", ""]) == 2
    said = capsys.readouterr()
    assert "ConfigError: --prompt is empty: give at least one byte" in said.err
    assert said.out == ""  # no empty line of text before it


def test_read_model_gives_the_saved_weights(checkpoint):
    cfg, ckpt = read_model(checkpoint)
    assert cfg == RunConfig.from_dict({**SMALL.__dict__}) and ckpt.step == 2
    for name, value in sharp_params(SMALL).items():
        assert ckpt.params[name].tobytes() == value.tobytes()


def test_train_sample_prints_what_generate_writes_from_the_saved_state(tmp_path, capsys):
    saved = tmp_path / "run.pt"
    argv = ["train", "--steps", "2", "--width", "32", "--layers", "1", "--heads", "2", "--seq",
            "16", "--no-progress", "--kernels", "numpy", "--backend", "numpy_int",
            "--save", str(saved), "--sample", "24", "--prompt", "\u00e9t\u00e9 "]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    head = "sample (temperature 0.8, seed 0):\n\u00e9t\u00e9 "
    assert head in err
    want = bytes(load_generator(saved.read_bytes(), backend="numpy_int", kernels="numpy")
                 .generate("\u00e9t\u00e9 ".encode(), Sampling(tokens=24)))
    assert err[err.index(head) + len(head):].startswith(want.decode("utf-8", "replace") + "\n")
    assert len(out.splitlines()[-1]) == 64  # the state hash stays the last stdout line


def test_train_sample_shows_a_prompts_invalid_byte_as_the_continuation_does(capsys):
    """The bytes a shell passed (b"ab\\xff" arrives as "ab\\udcff") were written back as the
    six characters "\\udcff"; generate and the continuation show U+FFFD."""
    argv = ["train", "--steps", "1", "--width", "32", "--layers", "1", "--heads", "2", "--seq",
            "16", "--no-progress", "--kernels", "numpy", "--backend", "numpy_int",
            "--sample", "4", "--prompt", "ab\udcff"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "sample (temperature 0.8, seed 0):\nab\ufffd" in err and "\udcff" not in err


def test_train_sample_refusals(capsys):
    for flags, what in ((["--prompt", "x"], "--prompt is what --sample continues"),
                        (["--sample", "0"], "--sample needs a positive number"),
                        (["--sample", "5", "--task", "mlp"], "--sample needs the gpt task"),
                        (["--sample", "5", "--peers", "2"], "--sample needs one local peer"),
                        (["--sample", "5", "--prompt", ""], "--prompt is empty")):
        assert f"ConfigError: {what}" in refused(["train", "--steps", "1", *flags], capsys)


def test_the_page_streams_the_bytes_of_generate(checkpoint, reference_arithmetic):
    """pynode.browser.generate_text (what the page's generation worker runs), natively with
    a fake bridge: the pieces are whole characters and add up to `generate`'s bytes."""
    import asyncio
    import json

    from pynode.browser import Checks, generate_text

    class Bridge:
        def __init__(self):
            self.posts = []

        def post(self, kind, fields):
            self.posts.append((kind, json.loads(fields)))

        def stopped(self, request_id):  # the page's Stop: not pressed
            return False

    checks = Checks(units=reference_arithmetic[0], gemm=reference_arithmetic[1])
    request = {"id": 7, "prompt": "h\u00e9llo", "tokens": 30, "temperature": 1.2, "top_k": 0,
               "seed": 5}
    bridge = Bridge()
    answer = json.loads(asyncio.run(generate_text(checks, checkpoint, json.dumps(request),
                                                  bridge)))
    want = bytes(load_generator(checkpoint, arithmetic=reference_arithmetic).generate(
        "h\u00e9llo".encode(), Sampling(tokens=30, temperature=1.2, seed=5)))
    assert answer["ok"] and bytes.fromhex(answer["bytes"]) == want, answer
    assert answer["stopped"] is False
    assert answer["step"] == 2 and answer["context"] == 16 and answer["prompt_bytes"] == 6
    pieces = [f["text"] for kind, f in bridge.posts if kind == "generated" and f["id"] == 7]
    assert "".join(pieces) == answer["text"] == want.decode("utf-8", "replace")
    bad = json.loads(asyncio.run(generate_text(checks, b"junk", json.dumps(request), bridge)))
    assert not bad["ok"] and bad["error"].startswith("CheckpointError"), bad
    request["temperature"] = -1
    bad = json.loads(asyncio.run(generate_text(checks, checkpoint, json.dumps(request), bridge)))
    assert bad["error"].startswith("GenerateError: temperature"), bad
    # what a script leaves out takes generate's defaults; a stray key or no prompt is named
    # (they were "KeyError: 'tokens'" and silence)
    short = json.loads(asyncio.run(generate_text(checks, checkpoint, json.dumps(
        {"id": 8, "prompt": "h\u00e9llo", "tokens": 12}), bridge)))
    want = bytes(load_generator(checkpoint, arithmetic=reference_arithmetic).generate(
        "h\u00e9llo".encode(), Sampling(tokens=12)))
    assert short["ok"] and bytes.fromhex(short["bytes"]) == want, short
    for odd, reason in (({"id": 9, "prompt": "a", "tokenz": 5}, "unknown generate keys: tokenz"),
                        ({"id": 9, "tokens": 5}, "the prompt is missing")):
        bad = json.loads(asyncio.run(generate_text(checks, checkpoint, json.dumps(odd), bridge)))
        assert not bad["ok"] and reason in bad["error"], bad


def test_the_pages_stop_ends_a_generation_where_it_is(checkpoint, reference_arithmetic,
                                                      monkeypatch):
    """The page's Stop: asked at each hand-over of the worker's loop, the generation ends
    there with the bytes made so far (the same as generate's first ones), said stopped."""
    import asyncio
    import json

    import pynode.browser
    from pynode.browser import Checks, generate_text

    class Bridge:
        def __init__(self):
            self.asked = []

        def post(self, kind, fields):
            pass

        def stopped(self, request_id):
            self.asked.append(request_id)
            return len(self.asked) == 5  # pressed after a few bytes

    monkeypatch.setattr(pynode.browser, "GENERATE_YIELD_EVERY_S", 0)  # hand over every byte
    checks = Checks(units=reference_arithmetic[0], gemm=reference_arithmetic[1])
    request = {"id": 3, "prompt": "The ", "tokens": 40, "temperature": 0.9, "seed": 2}
    bridge = Bridge()
    answer = json.loads(asyncio.run(generate_text(checks, checkpoint, json.dumps(request),
                                                  bridge)))
    want = bytes(load_generator(checkpoint, arithmetic=reference_arithmetic).generate(
        b"The ", Sampling(tokens=40, temperature=0.9, seed=2)))
    made = bytes.fromhex(answer["bytes"])
    assert answer["ok"] and answer["stopped"] is True, answer
    assert bridge.asked == [3] * 5 and len(made) == 5 and want.startswith(made)


def test_bench_generate_times_both_forwards_on_the_same_bytes(capsys):
    import json

    from pynode.bench.generate import main as bench

    config = json.dumps({"width": 32, "layers": 1, "heads": 2, "seq": 16})
    assert bench(["--json", "--tokens", "24", "--repeats", "1", "--config", config,
                  "--backend", "numpy_int", "--kernels", "numpy"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["runtime"] == "native" and row["backend"] == "numpy_int" and row["tokens"] == 24
    assert row["tokens_per_s"] > 0 and row["uncached_tokens_per_s"] > 0
    assert row["config"]["seq"] == 16


def test_the_kit_refuses_what_generate_refuses(tmp_path, capsys):
    mlp = tmp_path / "mlp.pt"
    mlp.write_bytes(Trainer(RunConfig(task="mlp", steps=2), load_task("mlp"), None)
                    .state_bytes())
    assert main(["kit", str(mlp), "-o", str(tmp_path / "kit.html")]) == 2
    err = capsys.readouterr().err
    assert "GenerateError: text generation needs a checkpoint of the gpt task" in err
    assert not (tmp_path / "kit.html").exists()
    assert main(["kit", str(tmp_path / "none.pt"), "-o", str(tmp_path / "k.html")]) == 2


def test_the_kit_never_writes_over_its_checkpoint(tmp_path, capsys):
    """`kit run.pt -o run.pt` used to replace the trained model with the page."""
    saved = tmp_path / "run.pt"
    saved.write_bytes(Trainer(RunConfig(steps=2, width=32, layers=1, heads=2, seq=16),
                              load_task("gpt"), None).state_bytes())
    before = saved.read_bytes()
    for output in (str(saved), str(tmp_path / "." / "run.pt")):
        assert main(["kit", str(saved), "-o", output]) == 2
        assert "OutputError: -o " in capsys.readouterr().err
    assert saved.read_bytes() == before
    (tmp_path / "dir.html").mkdir()
    assert main(["kit", str(saved), "-o", str(tmp_path / "dir.html")]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.html", "run.pt"]



def test_a_reader_that_stops_early_ends_generate_quietly(tmp_path, checkpoint):
    """`generate ... | head -c 10`: the pipe closes while bytes still stream; the command
    ends with a shell's SIGPIPE status and no traceback (it printed BrokenPipeError's)."""
    saved = tmp_path / "run.pt"
    saved.write_bytes(checkpoint)
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pynode", "generate", "--checkpoint", str(saved), "--prompt",
         "The ", "--tokens", "100000", "--kernels", "numpy"],
        cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()
    err = proc.communicate(timeout=300)[1].decode()
    assert proc.returncode == 141 and "Traceback" not in err and "Error" not in err, err
