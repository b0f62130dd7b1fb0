"""The one Pyodide run the wasm tests share: what it runs, the native results it compares
with, and its start, in the background as soon as collection shows a test will read it
(conftest.py in this folder), so Node.js boots and runs on the second core while the
other tiers' tests run on the first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyodide_node import REPO, start_in_pyodide

from server.bundle import build_bundle

# Modules whose tests are plain functions (see harness.py) and must pass on wasm too.
PYODIDE_MODULES = [
    "tests/core/test_golden.py",
    "tests/core/test_detmath.py",
    "tests/core/test_rng.py",
    "tests/core/test_properties.py",
    "tests/comm/test_wire_codec.py",
]
PYODIDE_DATA = ["tests/golden/golden_v2.npz"]


# The wasm case modules (they need wasm SIMD) and how many cases each holds.
WASM_CASES = {
    "gemm": ("tests/pyodide/wasm_gemm_cases.py", 6),
    "kernels": ("tests/pyodide/wasm_kernels_cases.py", 11),
    "philox": ("tests/pyodide/wasm_philox_cases.py", 6),
}
TRAINER_CASES = "tests/pyodide/trainer_cases.py"
SELFCHECK = "tests/pyodide/selfcheck_cases.py"  # known outcomes: the runner checked itself
TRAINER_EXPECTED = "artifacts/pyodide_trainer_expected.json"
GENERATE_CASES = "tests/pyodide/generate_cases.py"
GENERATE_EXPECTED = "artifacts/pyodide_generate_expected.json"
GENERATE_CHECKPOINT = "artifacts/pyodide_generate.pt"


def native_trainer_hashes() -> None:
    """The per-step hashes and held-out losses of a 3-step run natively (numba kernels where
    installed), for trainer_cases.py to compare with wasm, where the wasm SIMD GEMM and
    kernels compute (what the page selects)."""
    import asyncio

    from pynode.config import RunConfig
    from pynode.run.assemble import build_trainer

    cfg = RunConfig(steps=3, seed=1, width=32, layers=1, heads=2, seq=16, microbatch_size=2,
                    microbatches=3, eval_every=2)
    trainer = build_trainer(cfg)

    async def three() -> list:
        return [await trainer.step() for _ in range(3)]

    results = asyncio.run(three())
    hashes = [r.hash for r in results]
    heldout = [r.heldout for r in results]  # None, step 2's, step 3's (the last)
    expected = REPO / TRAINER_EXPECTED
    expected.parent.mkdir(exist_ok=True)
    expected.write_text(json.dumps({"config": json.loads(cfg.to_json()), "hashes": hashes,
                                    "heldout": heldout,
                                    "wasm_backend": "wasm_simd", "wasm_kernels": "wasm"}))


def native_generated_bytes() -> None:
    """Bytes generated natively from a small checkpoint (weights scaled up so that every
    rounding matters): greedy, sampled, top-k, a multi-byte UTF-8 prompt and one longer
    than the context, for generate_cases.py to compare with wasm."""
    import numpy as np

    from pynode.config import RunConfig
    from pynode.core.gpt import gpt_init_params
    from pynode.run.generate import Sampling, load_generator
    from pynode.run.trainer import Trainer, TrainState
    from pynode.tasks import load_task
    from pynode.tasks.gpt import gpt_config

    cfg = RunConfig(steps=4, seed=1, width=32, layers=2, heads=2, seq=16)
    trainer = Trainer(cfg, load_task("gpt"), None)
    params = {k: v if k.endswith(".g") else v * np.float32(25)
              for k, v in gpt_init_params(gpt_config(cfg), 5).items()}
    trainer.state = TrainState(step=2, params=params, opt=trainer.state.opt)
    (REPO / "artifacts").mkdir(exist_ok=True)
    (REPO / GENERATE_CHECKPOINT).write_bytes(trainer.state_bytes())
    generator = load_generator(trainer.state_bytes())
    cases = []
    for prompt, sampling in [
        (b"The ", dict(tokens=40, temperature=0.0)),
        (b"The ", dict(tokens=40, temperature=1.0, seed=3)),
        ("h\u00e9llo \u20ac ".encode(), dict(tokens=40, temperature=0.7, top_k=5, seed=11)),
        (bytes(range(40, 70)), dict(tokens=30, temperature=1.3, top_k=20, seed=2)),
        (b"a", dict(tokens=25, temperature=0.5, top_k=1)),
    ]:
        got = bytes(generator.generate(prompt, Sampling(**sampling)))
        cases.append({"prompt": prompt.hex(), "sampling": sampling, "bytes": got.hex()})
    (REPO / GENERATE_EXPECTED).write_text(json.dumps({
        "checkpoint": GENERATE_CHECKPOINT, "cases": cases,
        "wasm_backend": "wasm_simd", "wasm_kernels": "wasm"}))


def start(runtime: Path) -> tuple:
    """Write the native expectations, build the bundle and start the shared run."""
    native_trainer_hashes()
    native_generated_bytes()
    folder = REPO / "artifacts" / "pyodide-run"  # git-ignored, overwritten each run
    folder.mkdir(parents=True, exist_ok=True)
    bundle = folder / "pynode.zip"
    bundle.write_bytes(build_bundle())
    modules = [*PYODIDE_MODULES, *(path for path, _ in WASM_CASES.values()), TRAINER_CASES,
               GENERATE_CASES, SELFCHECK]
    data = [*PYODIDE_DATA, TRAINER_EXPECTED, GENERATE_EXPECTED, GENERATE_CHECKPOINT]
    return start_in_pyodide(runtime, bundle, modules, data)


STARTED = pytest.StashKey[tuple]()  # the background run, once conftest.py started it
