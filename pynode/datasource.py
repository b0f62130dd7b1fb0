"""Where a microbatch's text comes from: the built-in corpus, a server's /data, a local
file (pynode.datafile), or a whole text at a URL with its digest (`URL#sha256=HEX`: a text
a room's leader uploaded to the server, server/uploads.py), sliced as a file is.

Either way a microbatch is a pure function of (seed, step, index): the built-in corpus is
the same bytes on every peer (it ships inside the package and the page's bundle), and the
server's /data slices its shards deterministically, so peers that ask get the same text.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from functools import lru_cache
from urllib.error import HTTPError
from urllib.parse import urlencode

import numpy as np

from pynode import platform
from pynode.core.errors import DaisyError
from pynode.corpus import builtin_corpus, byte_windows
from pynode.datafile import DataFileError, file_text, is_file_spec, split_spec
from pynode.platform import failure_words, http_get_text

PAD_BYTE = 0x20  # /data may answer up to 3 bytes short (whole UTF-8 characters)
# Held-out loss on (RunConfig.eval_every): the last 1/HELDOUT_SHARE of a built-in or file
# text is held out; training windows come from the rest, held-out windows from it.
HELDOUT_SHARE = 32
# The step held-out windows are keyed by: no run reaches it, so a /data server's held-out
# slices are drawn apart from every training step's (its shards are not split).
HELDOUT_STEP = 2**62
PARTS = ("all", "train", "heldout")

log = logging.getLogger(__name__)
_warned: set[str] = set()  # servers whose built-in fallback this process has warned of


class DataSourceError(DaisyError):
    """The configured data server did not answer with usable text."""


# What to do about a data server, in the words of the command line and of the page (whose
# run form has a "text" field, built-in corpus or this server's /data, and no fallback).
UNREACHABLE_HINT = {
    "native": "`python -m server` serves /data; --data builtin trains on the built-in corpus",
    "page": "a run with text \"built-in corpus\" (the run form) needs no server",
}
UNREADABLE_HINT = {
    "native": "fix the server's --data-url, or give --data-fallback builtin to train on the "
              "built-in corpus meanwhile",
    "page": "its operator fixes its shards (--data-url); a run with text \"built-in "
            "corpus\" (the run form) needs none",
}


def here(hint: dict[str, str]) -> str:
    """The page's or the command line's words of `hint`, as this process is one or the other."""
    return hint["page" if platform.IN_PYODIDE else "native"]


def microbatch_bytes(
    data: str, seed: int, step: int, index: int, rows: int, length: int,
    fallback: str = "none", part: str = "all",
) -> np.ndarray:
    """(rows, length) int32 bytes of microbatch `index` of `step`. `fallback` (RunConfig's
    data_fallback): "builtin" lets a /data server that cannot read its shards answer with
    the built-in corpus (warned once per server); "none" stops the run instead. `part`:
    the whole text ("all"), or the training or held-out part of a built-in or file text
    ("train", "heldout"; a server's text is one part)."""
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    if data == "builtin":
        return byte_windows(text_part(builtin_corpus(), part), seed, step, index, rows, length)
    if is_file_spec(data) or is_text_url(data):
        text = whole_text_part(data, part, length)
        return byte_windows(text, seed, step, index, rows, length)
    want = rows * length
    raw, reply = server_slice(data, {"seed": seed, "step": step, "index": index, "bytes": want},
                              fallback)
    if len(raw) > want or len(raw) < want - 3:
        raise DataSourceError(short_slice(data, len(raw), rows, length, reply))
    padded = np.full(want, PAD_BYTE, dtype=np.uint8)
    padded[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return padded.reshape(rows, length).astype(np.int32)


def whole_text_part(data: str, part: str, length: int) -> np.ndarray:
    """The `part` of the whole text `data` names (a file spec, or a URL with its digest),
    if it holds more than one sequence of `length` bytes: DataFileError or DataSourceError
    otherwise (a leader asks before its run starts: GPTTask.check_data)."""
    if is_file_spec(data):
        text = text_part(file_text(data), part)
        if text.shape[0] <= length:
            what = "bytes of text" if part == "all" else f"bytes in its {part} part"
            raise DataFileError(f"the data file {split_spec(data)[0]} holds {text.shape[0]} "
                                f"{what}, not more than one sequence ({length})")
        return text
    text = text_part(url_text(data), part)
    if text.shape[0] <= length:
        raise DataSourceError(f"the text at {data.partition('#')[0]} holds {text.shape[0]} "
                              f"bytes, not more than one sequence ({length})")
    return text


def is_text_url(data: str) -> bool:
    """Whether `data` names a whole text at a URL with its digest (`URL#sha256=HEX`)."""
    return data.startswith(("http://", "https://")) and "#sha256=" in data


@lru_cache(maxsize=2)
def url_text(data: str) -> np.ndarray:
    """The (N,) uint8 text at `URL#sha256=HEX`, read once and checked against HEX."""
    url, _, digest = data.rpartition("#sha256=")
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise DataSourceError(f"data {data!r}: expected URL#sha256=<64 hex digits>")
    try:
        raw = http_get_text(url, slow_note(f"the run's text {url}")).encode("utf-8")
    except HTTPError as exc:
        reason = error_body(exc).get("message")
        raise DataSourceError(f"the run's text {url} answered {exc.code}: {reason}") from exc
    except (OSError, ValueError) as exc:
        raise DataSourceError(f"the run's text {url} could not be read: "
                              f"{failure_words(exc)}") from exc
    have = hashlib.sha256(raw).hexdigest()
    if have != digest:
        raise DataSourceError(f"the text at {url} has sha256 {have[:16]}..., the run's is "
                              f"{digest[:16]}...: it is not the run's text")
    return np.frombuffer(raw, dtype=np.uint8)


def text_part(text: np.ndarray, part: str) -> np.ndarray:
    """The `part` of a (N,) uint8 text: all of it, all but its last 1/HELDOUT_SHARE
    ("train"), or that last share ("heldout")."""
    if part == "all":
        return text
    cut = text.shape[0] - text.shape[0] // HELDOUT_SHARE
    return text[:cut] if part == "train" else text[cut:]


def short_slice(data: str, got: int, rows: int, length: int, reply: dict) -> str:
    """Why a /data slice of another size than asked for stops the run: a row group of
    shorter text than a microbatch (the server joins documents within one row group)."""
    want = rows * length
    said = f"data server {data} answered {got} bytes for a microbatch of {want}"
    if got > want or "row_group" not in reply:
        return f"{said}: not a DaisyChain server of this version?"
    return (f"{said} ({rows} rows of --seq {length}): row group {reply['row_group']} of "
            f"{reply.get('url', 'its shard')} holds less text than that; the shard needs row "
            "groups of more text (write it with a larger row_group_size), or the run a smaller "
            "--seq or --microbatch-size")


def server_slice(data: str, query: dict, fallback: str) -> tuple[bytes, dict]:
    """The UTF-8 text the server `data` answers for `query`, and its whole reply;
    DataSourceError if none."""
    if fallback != "builtin":
        query = {**query, "fallback": 0}
    url = f"{data.rstrip('/')}/data?{urlencode(query)}"
    try:
        reply = json.loads(http_get_text(url, slow_note(f"data server {data}")))
    except HTTPError as exc:  # natively; the page's open_url hands over a 503's body
        if exc.code != 503:
            root = data.rstrip("/").removesuffix("/data")
            hint = (f": --data takes the server's own address, {root}, not its /data"
                    if root != data.rstrip("/") else
                    ": is it a DaisyChain server (python -m server)? --data takes its address, "
                    "http://HOST:PORT" if exc.code == 404 else "")
            raise DataSourceError(f"data server {data} answered {exc.code} for {url}{hint}") \
                from exc
        reply = error_body(exc)
    except OSError as exc:  # urllib's URLError wraps what the connection met: say that
        what = failure_words(exc)
        if what == "connection refused":
            what = ("nothing listens there (connection refused): is the server running, on "
                    "that address and port?")
        raise DataSourceError(f"data server {data} cannot be reached: {what} "
                              f"({here(UNREACHABLE_HINT)})") from exc
    except ValueError as exc:
        raise DataSourceError(f"data server {data} gave no usable text for {url}: {exc}") from exc
    if isinstance(reply, dict) and reply.get("error") == "source_unavailable":
        raise DataSourceError(
            f"data server {data} cannot read its shards ({reply.get('message')}); this run "
            f"trains on no other text in their place: {here(UNREADABLE_HINT)}")
    try:
        raw = reply["text"].encode("utf-8")
    except (KeyError, TypeError, AttributeError) as exc:
        raise DataSourceError(f"data server {data} gave no usable text for {url}: {exc}") from exc
    if reply.get("source") == "builtin" and data not in _warned:
        _warned.add(data)
        log.warning("data server %s cannot read its shards (%s): it serves the built-in corpus "
                    "in their place while they fail (--data-fallback builtin)", data,
                    reply.get("reason", "no reason given"))
    return raw, reply


def slow_note(what: str) -> Callable[[float, float], None]:
    """http_get_text's on_slow: a warning that `what` has not answered yet."""
    return lambda after, limit: log.warning("%s has not answered in %g s; waiting up to %g s "
                                            "in all", what, after, limit)


def error_body(exc: HTTPError) -> dict:
    """The JSON body of a /data error answer ({error, message}), or one made of its reason."""
    try:
        return json.loads(exc.read().decode("utf-8"))
    except (OSError, ValueError):
        return {"error": "source_unavailable", "message": str(exc.reason)}
