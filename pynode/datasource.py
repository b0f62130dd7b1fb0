"""Where a microbatch's text comes from: the built-in corpus, a server's /data, or a local
file (pynode.datafile).

Either way a microbatch is a pure function of (seed, step, index): the built-in corpus is
the same bytes on every peer (it ships inside the package and the page's bundle), and the
server's /data slices its shards deterministically, so peers that ask get the same text.
"""

from __future__ import annotations

import json
import logging
from urllib.error import HTTPError
from urllib.parse import urlencode

import numpy as np

from pynode.core.errors import DaisyError
from pynode.corpus import builtin_corpus, byte_windows
from pynode.datafile import DataFileError, file_text, is_file_spec, split_spec
from pynode.platform import http_get_text

PAD_BYTE = 0x20  # /data may answer up to 3 bytes short (whole UTF-8 characters)

log = logging.getLogger(__name__)
_warned: set[str] = set()  # servers whose built-in fallback this process has warned of


class DataSourceError(DaisyError):
    """The configured data server did not answer with usable text."""


def microbatch_bytes(
    data: str, seed: int, step: int, index: int, rows: int, length: int,
    fallback: str = "none",
) -> np.ndarray:
    """(rows, length) int32 bytes of microbatch `index` of `step`. `fallback` (RunConfig's
    data_fallback): "builtin" lets a /data server that cannot read its shards answer with
    the built-in corpus (warned once per server); "none" stops the run instead."""
    if data == "builtin":
        return byte_windows(builtin_corpus(), seed, step, index, rows, length)
    if is_file_spec(data):
        text = file_text(data)
        if text.shape[0] <= length:
            raise DataFileError(f"the data file {split_spec(data)[0]} holds {text.shape[0]} "
                                f"bytes of text, not more than one sequence ({length})")
        return byte_windows(text, seed, step, index, rows, length)
    want = rows * length
    raw = server_text(data, {"seed": seed, "step": step, "index": index, "bytes": want},
                      fallback)
    if len(raw) > want or len(raw) < want - 3:
        raise DataSourceError(f"data server returned {len(raw)} bytes, asked for {want}")
    padded = np.full(want, PAD_BYTE, dtype=np.uint8)
    padded[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return padded.reshape(rows, length).astype(np.int32)


def server_text(data: str, query: dict, fallback: str) -> bytes:
    """The UTF-8 text the server `data` answers for `query`; DataSourceError if none."""
    if fallback != "builtin":
        query = {**query, "fallback": 0}
    url = f"{data.rstrip('/')}/data?{urlencode(query)}"
    try:
        reply = json.loads(http_get_text(url))
    except HTTPError as exc:  # natively; the page's open_url hands over a 503's body
        if exc.code != 503:
            raise DataSourceError(f"data server {data} answered {exc.code} for {url}") from exc
        reply = error_body(exc)
    except (OSError, ValueError) as exc:
        raise DataSourceError(f"data server {data} gave no usable text for {url}: {exc}") from exc
    if isinstance(reply, dict) and reply.get("error") == "source_unavailable":
        raise DataSourceError(
            f"data server {data} cannot read its shards ({reply.get('message')}); this run "
            "trains on no other text in their place: fix the server's --data-url, or give "
            "--data-fallback builtin to train on the built-in corpus meanwhile")
    try:
        raw = reply["text"].encode("utf-8")
    except (KeyError, TypeError, AttributeError) as exc:
        raise DataSourceError(f"data server {data} gave no usable text for {url}: {exc}") from exc
    if reply.get("source") == "builtin" and data not in _warned:
        _warned.add(data)
        log.warning("data server %s cannot read its shards (%s): it serves the built-in corpus "
                    "in their place while they fail (--data-fallback builtin)", data,
                    reply.get("reason", "no reason given"))
    return raw


def error_body(exc: HTTPError) -> dict:
    """The JSON body of a /data error answer ({error, message}), or one made of its reason."""
    try:
        return json.loads(exc.read().decode("utf-8"))
    except (OSError, ValueError):
        return {"error": "source_unavailable", "message": str(exc.reason)}
