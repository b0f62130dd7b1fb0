"""The page's per-call product check: a default-config training step inside Pyodide (wasm
numpy, the wasm SIMD GEMM and kernels, as a tab computes), with the check on and off, via
the Node runner:

    python -m server.runtime fetch
    python -m server.bundle /tmp/pynode.zip
    node tests/pyodide/run_tests.mjs --runtime "$(python -m server.runtime path)" \\
        --bundle /tmp/pynode.zip --root . --module benchmarks/check_pyodide.py

The trainer is built as the page builds it (the check on, inline: no threads here); after
a warm-up step, blocks of BLOCK steps alternate check off / on (the bench train rule), and
the overhead is the median over pairs of checked / unchecked seconds per step, so load
that drifts during the run falls on both of a pair. Also printed: the check's own clock
(ProductCheck.seconds) as a share of an unchecked step, and what numpy's product_holds (the
reference, what the page had before the wasm kernel) costs on the same steps.
"""

import statistics
import time

from pynode.config import RunConfig
from pynode.core.kernels import REFERENCE
from pynode.platform import IN_PYODIDE
from pynode.run.assemble import build_trainer

BLOCK = 3  # steps per block
PAIRS = 8  # (unchecked, checked) block pairs per checker


def step(trainer):
    """One single-peer step: its coroutine never waits on I/O (see trainer_cases.py)."""
    try:
        trainer.step().send(None)
    except StopIteration:
        return
    raise AssertionError("the single-peer step awaited something; it must not")


def seconds_per_step(trainer, check):
    trainer.gemm.check = check
    started = time.perf_counter()
    for _ in range(BLOCK):
        step(trainer)
    return (time.perf_counter() - started) / BLOCK


def test_page_step_with_and_without_the_product_check():
    assert IN_PYODIDE, "this benchmark is meant to run under Pyodide"
    trainer = build_trainer(RunConfig())
    check = trainer.gemm.check
    assert check is not None and check.kernels.name == "wasm", "the page's check is not wasm"
    step(trainer)  # warm-up
    wasm_kernels = check.kernels
    rows = {}
    for name, kernels in (("wasm", wasm_kernels), ("numpy", REFERENCE)):
        check.kernels, check.seconds, checked_steps = kernels, 0.0, 0
        pairs, off_times = [], []
        for _ in range(PAIRS):
            off = seconds_per_step(trainer, None)
            on = seconds_per_step(trainer, check)
            checked_steps += BLOCK
            pairs.append(on / off)
            off_times.append(off)
        unchecked = statistics.median(off_times)
        rows[name] = (statistics.median(pairs) - 1.0, check.seconds / checked_steps / unchecked,
                      unchecked)
    check.kernels, trainer.gemm.check = wasm_kernels, check
    calls = check.calls
    print(f"config: {RunConfig().to_json()}")
    print(f"GEMM {trainer.gemm.backend_name}, kernels {wasm_kernels.name}; {calls} checked calls")
    for name, (overhead, share, unchecked) in rows.items():
        print(f"product check by {name:<5}: {100 * overhead:+6.1f} % step time (median of "
              f"{PAIRS} block pairs of {BLOCK} steps); its own clock {100 * share:5.1f} % of an "
              f"unchecked step ({unchecked:.3f} s)")
    assert check.failures == 0, f"{check.failures} products failed their check"
