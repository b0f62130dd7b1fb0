"""Where a microbatch's text comes from: the built-in corpus, or a server's /data.

Either way a microbatch is a pure function of (seed, step, index): the built-in corpus is
the same bytes on every peer (it ships inside the package and the page's bundle), and the
server's /data slices its shards deterministically, so peers that ask get the same text.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

import numpy as np

from pynode.core.errors import DaisyError
from pynode.corpus import builtin_corpus, byte_windows
from pynode.platform import http_get_text

PAD_BYTE = 0x20  # /data may answer up to 3 bytes short (whole UTF-8 characters)


class DataSourceError(DaisyError):
    """The configured data server did not answer with usable text."""


def microbatch_bytes(
    data: str, seed: int, step: int, index: int, rows: int, length: int
) -> np.ndarray:
    """(rows, length) int32 bytes of microbatch `index` of `step`."""
    if data == "builtin":
        return byte_windows(builtin_corpus(), seed, step, index, rows, length)
    want = rows * length
    query = urlencode({"seed": seed, "step": step, "index": index, "bytes": want})
    url = f"{data.rstrip('/')}/data?{query}"
    try:
        reply = json.loads(http_get_text(url))
        raw = reply["text"].encode("utf-8")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataSourceError(f"data server {data} gave no usable text for {url}: {exc}") from exc
    if len(raw) > want or len(raw) < want - 3:
        raise DataSourceError(f"data server returned {len(raw)} bytes, asked for {want}")
    padded = np.full(want, PAD_BYTE, dtype=np.uint8)
    padded[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return padded.reshape(rows, length).astype(np.int32)
