"""The built-in corpus (pynode/data/corpus.txt) and deterministic byte windows out of it."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import numpy as np

from pynode.core import rng

# Purpose tag in RNG keys, so data sampling never shares a stream with init or rounding.
DATA_PURPOSE = 0xDA7A


@lru_cache(maxsize=1)
def builtin_corpus() -> np.ndarray:
    """The shipped corpus as a (N,) uint8 array of UTF-8 bytes."""
    raw = resources.files("pynode").joinpath("data/corpus.txt").read_bytes()
    return np.frombuffer(raw, dtype=np.uint8)


def byte_windows(
    text: np.ndarray, seed: int, step: int, index: int, count: int, length: int
) -> np.ndarray:
    """`count` windows of `length` bytes at positions drawn from (seed, step, index).

    Returns (count, length) int32: a pure function of its arguments.
    """
    if text.shape[0] <= length:
        raise ValueError(f"corpus of {text.shape[0]} bytes is shorter than a window of {length}")
    starts = rng.randint((seed, step, index, DATA_PURPOSE), (count,), text.shape[0] - length)
    offsets = starts[:, None] + np.arange(length, dtype=np.int64)[None, :]  # (count, length)
    return text[offsets].astype(np.int32)
