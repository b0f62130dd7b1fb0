"""Runs inside Pyodide (see test_under_pyodide.py): the page's wasm Philox4x64 kernel.

Its words must equal the oracle `rng.raw64_reference` and numpy's `rng.raw64` bit for bit
for any key and length (tails of a block, of a SIMD pair and of a group of four blocks), it
must write nothing past the n words, and a wrong kernel must fail the start-up check and
leave `raw64_wasm` on numpy's generator. Skips (with the reason) where the runtime cannot
load it. Prints one `PHILOX_BENCH {json}` line: words/s of numpy's Philox and of the kernel.
"""

import json
import time
import unittest

import numpy as np

from pynode import browser_philox
from pynode.core import rng

KEYS = [(), (0,), (1, 2), (1, 2, 0), (0x5EED, 7, 3, 1, 0x51), (2**64 - 1, 2**200 + 7, 3),
        tuple(range(40))]
LENGTHS = [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 23, 31, 32, 33, 100, 1001]
STEP_WORDS = 2_100_000  # what the default training config draws a step
SENTINEL = np.uint64(0xA5A5_5A5A_DEAD_BEEF)
ROUNDS_AT = bytes([0x41, 0x0A, 0x21, 0x04])  # i32.const 10, local.set $round: 10 rounds


def kernel():
    try:
        return browser_philox.load_kernel()
    except browser_philox.PhiloxKernelError as exc:
        raise unittest.SkipTest(f"wasm Philox unavailable here: {exc}") from exc


def nine_round_kernel():
    """The shipped build with one round fewer: a plausible, wrong kernel."""
    wasm = browser_philox.WASM_PATH.read_bytes()
    assert wasm.count(ROUNDS_AT) == 1, "the round count's encoding moved; update ROUNDS_AT"
    wrong = wasm.replace(ROUNDS_AT, bytes([0x41, 0x09, 0x21, 0x04]))
    return browser_philox.link_kernel(wrong, "daisychain_philox4x64_9_rounds.so")


def test_kernel_equals_the_oracle_and_numpy():
    wasm = kernel()
    for key in KEYS:
        for n in LENGTHS:
            got = browser_philox.kernel_raw64(wasm, key, n)
            assert got.dtype == np.uint64 and got.shape == (n,), (key, n, got.dtype, got.shape)
            assert np.array_equal(got, rng.raw64_reference(key, n)), (key, n)
            assert np.array_equal(got, rng.raw64(key, n)), (key, n)


def test_kernel_equals_the_oracle_and_numpy_on_long_streams():
    wasm = kernel()
    n = 2**18 + 5
    got = browser_philox.kernel_raw64(wasm, (3, 1, 4), n)
    assert np.array_equal(got, rng.raw64_reference((3, 1, 4), n))
    assert np.array_equal(got, rng.raw64((3, 1, 4), n))
    for key in [(1, 2), (2**64 - 1, 2**200 + 7, 3)]:
        got = browser_philox.kernel_raw64(wasm, key, STEP_WORDS + 3)
        assert np.array_equal(got, rng.raw64(key, STEP_WORDS + 3)), key


def test_kernel_writes_only_its_words():
    wasm = kernel()
    k, c = rng.key_words64((9, 9))
    words = np.array([k[0], k[1], c[2], c[3]], np.uint64)
    for n in [0, 1, 5, 8, 13, 16, 17, 30, 33]:
        buffer = np.full(n + 24, SENTINEL, np.uint64)  # 8 guard words either side of n words
        out = buffer[8 : 8 + n]
        wasm(out.__array_interface__["data"][0], n, words.__array_interface__["data"][0])
        assert np.array_equal(out, rng.raw64((9, 9), n)), n
        assert np.all(buffer[:8] == SENTINEL) and np.all(buffer[8 + n :] == SENTINEL), n


def test_wrong_kernels_fail_the_self_check():
    wasm = kernel()
    browser_philox.self_check(wasm)  # the right one passes
    wrong = nine_round_kernel()
    assert not np.array_equal(browser_philox.kernel_raw64(wrong, (1,), 8), rng.raw64((1,), 8))
    # the right words, but the last group's tail left unwritten, or written past n
    no_tails = lambda out, n, words: wasm(out, n & ~15, words)  # noqa: E731
    overrun = lambda out, n, words: wasm(out, (n + 15) & ~15, words)  # noqa: E731
    for bad in (wrong, no_tails, overrun):
        try:
            browser_philox.self_check(bad)
        except browser_philox.PhiloxKernelError as exc:
            assert "differs from pynode's Philox4x64" in str(exc), exc
        else:
            raise AssertionError("a wrong kernel passed the self-check")
        assert browser_philox.checked_kernel(lambda bad=bad: bad) is None


def test_raw64_wasm_uses_the_kernel_and_falls_back():
    wasm = kernel()
    browser_philox._active_kernel.cache_clear()
    assert browser_philox.available() and browser_philox._active_kernel() is wasm
    assert np.array_equal(browser_philox.raw64_wasm((5, 6), 37), rng.raw64((5, 6), 37))
    original = browser_philox.load_kernel
    try:
        browser_philox.load_kernel = nine_round_kernel
        browser_philox._active_kernel.cache_clear()
        assert not browser_philox.available()
        assert np.array_equal(browser_philox.raw64_wasm((5, 6), 37), rng.raw64((5, 6), 37))
    finally:
        browser_philox.load_kernel = original
        browser_philox._active_kernel.cache_clear()
    assert browser_philox.available()


def best_words_per_second(draw, repeats=5):
    best = float("inf")
    for i in range(repeats):
        start = time.perf_counter()
        draw((0x5EED, i), STEP_WORDS)
        best = min(best, time.perf_counter() - start)
    return STEP_WORDS / best


def test_kernel_speed_is_recorded():
    """Words per second of the wasm kernel and of numpy's Philox, for the record (the
    PHILOX_BENCH line; test_under_pyodide.py stores it). Not asserted: a timed test fails
    on a loaded machine, and speed targets live in benchmarks/ (bench browser)."""
    kernel()
    assert browser_philox.available()
    numpy_rate = best_words_per_second(rng.raw64)
    wasm_rate = best_words_per_second(browser_philox.raw64_wasm)
    print("PHILOX_BENCH " + json.dumps({"words": STEP_WORDS, "numpy_words_per_s": numpy_rate,
                                        "wasm_words_per_s": wasm_rate}))
