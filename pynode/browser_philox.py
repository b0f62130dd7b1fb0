"""numpy's Philox4x64-10 raw stream in WebAssembly SIMD, for the page: `rng.raw64`'s words.

Stochastic rounding draws its 16-bit lanes from `pynode.core.rng.raw64` (numpy's Philox),
about 2.1 M words a step in the default config. Pyodide's numpy makes each 64x64->128-bit
product through a software helper; `pynode/wasm/philox4x64.wat` computes the same stream
with SIMD, about 4x faster under Node (stream layout and exactness argument at its top).
Its build `philox4x64.wasm`, shipped in the pynode bundle, is linked into Pyodide's own
memory like the GEMM kernel (pynode/browser_gemm.py), so one JS call writes the words into
a fresh numpy array.

`raw64_wasm(key, n)` returns exactly `rng.raw64(key, n)`: through the kernel once it is
linked and has equalled the oracle `rng.raw64_reference` on a few blocks (`self_check`, at
the first call), through `rng.raw64` otherwise (natively, without wasm SIMD, or after a
failed check, which is logged). It lives outside pynode/core because it needs the JS runtime.

Legend: (n,) u64 uint64 words of the stream, in order.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pynode.core import rng
from pynode.core.errors import DaisyError

__all__ = ["PhiloxKernelError", "available", "checked_kernel", "kernel_raw64", "link_kernel",
           "load_kernel", "raw64_wasm", "self_check"]

log = logging.getLogger(__name__)

WASM_PATH = Path(__file__).resolve().parent / "wasm" / "philox4x64.wasm"
EXPORT = "daisychain_philox4x64"
# (key, n) the start-up check compares with the oracle: whole groups of four blocks (16
# words each), and 27 = 16 + 8 + 3 words, which ends inside a group's second pair (tails).
CHECK_CASES = (((0x5EED, 2**40 + 3, 7), 64), ((), 27))
SENTINEL = 0xA5A5_5A5A_DEAD_BEEF  # fills the check's buffer: a word left unwritten shows
GUARD_WORDS = 8  # words after the check's n that must stay SENTINEL


class PhiloxKernelError(DaisyError):
    """The wasm Philox kernel cannot run here, or its words differ from the oracle's."""


def link_kernel(wasm: bytes, so_name: str) -> Callable[..., Any]:
    """Link a build of philox4x64.wat into Pyodide's memory; returns its exported function.

    PhiloxKernelError when not under Pyodide, when this Pyodide cannot link a side module,
    or when the runtime cannot compile the module (no wasm SIMD)."""
    from pynode.browser_gemm import link_wasm_bytes
    from pynode.core.gemm import BackendUnavailableError

    try:
        return getattr(link_wasm_bytes(wasm, "the wasm Philox kernel", so_name), EXPORT)
    except BackendUnavailableError as exc:
        raise PhiloxKernelError(str(exc)) from exc


@functools.lru_cache(maxsize=1)
def load_kernel() -> Callable[..., Any]:
    """The shipped kernel, linked once per process; PhiloxKernelError where it cannot run."""
    try:
        wasm = WASM_PATH.read_bytes()
    except OSError as exc:
        raise PhiloxKernelError(f"kernel {WASM_PATH.name} missing from the bundle") from exc
    return link_kernel(wasm, "daisychain_philox4x64.so")


def kernel_raw64(kernel: Callable[..., Any], key: Sequence[int], n: int) -> np.ndarray:
    """The first n words of the key's stream computed by `kernel`, (n,) u64."""
    n = operator.index(n)
    if n < 0:
        raise rng.RngArgumentError(f"need n >= 0 words, got {n}")
    out = np.empty(n, np.uint64)  # (n,) u64, every word written by the kernel
    _fill(kernel, key, out)
    return out


def self_check(kernel: Callable[..., Any]) -> None:
    """PhiloxKernelError unless `kernel` writes `rng.raw64_reference`'s words on CHECK_CASES,
    every one of them (over a sentinel, not recycled memory) and nothing past them."""
    guard = np.full(GUARD_WORDS, SENTINEL, np.uint64)  # (GUARD_WORDS,) u64
    for key, n in CHECK_CASES:
        got = np.full(n + GUARD_WORDS, SENTINEL, np.uint64)  # (n + GUARD_WORDS,) u64
        _fill(kernel, key, got[:n])
        want = np.concatenate([rng.raw64_reference(key, n), guard])
        if not np.array_equal(got, want):
            first = int(np.flatnonzero(got != want)[0])
            raise PhiloxKernelError(
                f"the wasm Philox kernel differs from pynode's Philox4x64 at word {first} of "
                f"key {key}, n {n}: {int(got[first]):#x} != {int(want[first]):#x}")


def checked_kernel(load: Callable[[], Callable[..., Any]]) -> Callable[..., Any] | None:
    """The kernel `load` gives if it loads and passes `self_check`; None (logged) otherwise."""
    try:
        kernel = load()
    except PhiloxKernelError as exc:
        log.info("Philox words come from numpy's generator: %s", exc)
        return None
    try:
        self_check(kernel)
    except PhiloxKernelError as exc:
        log.warning("Philox words come from numpy's generator: %s", exc)
        return None
    return kernel


@functools.lru_cache(maxsize=1)
def _active_kernel() -> Callable[..., Any] | None:
    return checked_kernel(load_kernel)


def available() -> bool:
    """Whether `raw64_wasm` computes with the kernel here (linked, and its check passed)."""
    return _active_kernel() is not None


def raw64_wasm(key: Sequence[int], n: int) -> np.ndarray:
    """`rng.raw64(key, n)`, the same (n,) u64 words: with the wasm kernel when `available`."""
    kernel = _active_kernel()
    if kernel is None:
        return rng.raw64(key, n)
    return kernel_raw64(kernel, key, n)


def _fill(kernel: Callable[..., Any], key: Sequence[int], out: np.ndarray) -> None:
    """out (n,) u64, contiguous, = the first n words of the key's stream, by `kernel`."""
    k, c = rng.key_words64(key)
    words = np.array([k[0], k[1], c[2], c[3]], np.uint64)  # (4,) u64, the kernel's input
    if out.size:
        kernel(_address(out), out.size, _address(words))


def _address(x: np.ndarray) -> int:
    return x.__array_interface__["data"][0]
