"""Which text a /data request gets: pure functions of (seed, step, index) and shard counts.

Draws come from sha256 of a versioned label, never from ``random``, so every server and
every peer computes the same choice. The shard and row group depend on (seed, step) only:
all microbatches of one step read one row group, which the server fetches once. The row
and the byte offset depend on the microbatch index too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

LABEL = "daisychain/data/v1"
DOC_SEPARATOR = b"\n\n"  # between documents when one is shorter than the slice


@dataclass(frozen=True)
class Window:
    start: int  # byte offset of the slice in the (joined) source text
    text: str  # whole UTF-8 characters, at most the requested bytes


def draw(*parts: int | str) -> int:
    """A 64-bit draw keyed by ``parts``: the same on every machine."""
    label = ":".join([LABEL, *map(str, parts)]).encode("ascii")
    return int.from_bytes(hashlib.sha256(label).digest()[:8], "little")


def pick_shard(seed: int, step: int, n_shards: int) -> int:
    return draw("shard", seed, step) % n_shards


def pick_row_group(seed: int, step: int, shard: int, rows_per_group: Sequence[int]) -> int:
    """Row group of the step: a uniformly drawn row of the shard decides, so groups weigh by
    their row count and empty groups are never picked."""
    total = sum(rows_per_group)
    if total <= 0:
        raise ValueError("the shard has no rows")
    target = draw("row", seed, step, shard) % total
    for group, rows in enumerate(rows_per_group):
        if target < rows:
            return group
        target -= rows
    raise AssertionError("unreachable: target < total")


def pick_row(seed: int, step: int, index: int, num_rows: int) -> int:
    if num_rows <= 0:
        raise ValueError("the row group has no rows")
    return draw("doc", seed, step, index) % num_rows


def offset_draw(seed: int, step: int, index: int) -> int:
    return draw("offset", seed, step, index)


def cut_window(data: bytes, nbytes: int, draw_value: int) -> Window:
    """A slice of at most ``nbytes`` UTF-8 bytes of ``data`` at a drawn offset.

    Both ends move to character boundaries (the start forward, the end back), so the
    slice is whole characters and at most 3 bytes short of ``nbytes`` when ``data`` is
    long enough; shorter data gives all of it.
    """
    span = max(1, len(data) - nbytes + 1)
    start = draw_value % span
    while start < len(data) and _is_continuation(data[start]):
        start += 1
    end = min(len(data), start + nbytes)
    while end < len(data) and end > start and _is_continuation(data[end]):
        end -= 1
    return Window(start=start, text=data[start:end].decode("utf-8"))


def gather_documents(docs: Sequence[str], first: int, nbytes: int) -> bytes:
    """Document ``first`` and, while shorter than ``nbytes``, the ones after it (wrapping
    around the row group, each once), joined by DOC_SEPARATOR."""
    parts: list[bytes] = []
    size = 0
    for k in range(len(docs)):
        doc = (docs[(first + k) % len(docs)] or "").encode("utf-8")
        parts.append(doc)
        size += len(doc) + (len(DOC_SEPARATOR) if k else 0)
        if size >= nbytes:
            break
    return DOC_SEPARATOR.join(parts)


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80
