"""Runs inside Pyodide (see test_under_pyodide.py): a short training run must give, step by
step, the state hashes (and held-out losses) that the native run of the same config wrote
to the expectation file.
"""

import json
from pathlib import Path

from pynode.config import RunConfig
from pynode.run.assemble import build_trainer

EXPECTED = Path(__file__).resolve().parents[2] / "artifacts" / "pyodide_trainer_expected.json"


def run_to_completion(coroutine):
    """Drive a coroutine that never waits on I/O (one peer, no collective) to its result."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the single-peer step awaited something; it must not")


def test_three_steps_match_native_hashes():
    expected = json.loads(EXPECTED.read_text())
    trainer = build_trainer(RunConfig.from_dict(expected["config"]))
    results = [run_to_completion(trainer.step()) for _ in expected["hashes"]]
    got = [r.hash for r in results]
    assert got == expected["hashes"], f"wasm hashes {got} != native {expected['hashes']}"
    heldout = [r.heldout for r in results]  # floats from JSON: exact for float32 values
    assert heldout == expected["heldout"], f"wasm held-out {heldout} != {expected['heldout']}"
    assert trainer.gemm.backend_name == expected["wasm_backend"]
    assert trainer.gemm.kernels.name == expected["wasm_kernels"]


def test_a_config_too_big_for_a_tab_is_refused_before_anything_is_allocated():
    """The page plans a run against what is left of its heap budget (1.5 GiB): past 2 GiB
    Pyodide copies buffers out wrong, and a tab that had tried width 2048 x 12 layers
    (604 M parameters) grew there and downloaded corrupt checkpoints ever after."""
    from pynode import platform
    from pynode.run.assemble import MemoryRefusal, check_memory
    from pynode.tasks import load_task

    heap = platform.heap_bytes()
    assert 0 < heap < platform.PAGE_HEAP_BUDGET, heap
    assert platform.memory_bytes() == platform.PAGE_HEAP_BUDGET - heap
    cfg = RunConfig(width=2048, layers=12, heads=8)
    try:
        check_memory(cfg, load_task("gpt"))
    except MemoryRefusal as exc:
        assert "GiB a tab can hold" in str(exc) and "(width, layers" in str(exc), str(exc)
    else:
        raise AssertionError("a 15 GiB config was not refused in the page")
    assert platform.heap_bytes() == heap  # nothing of its size was allocated
    check_memory(RunConfig(), load_task("gpt"))  # the default fits
