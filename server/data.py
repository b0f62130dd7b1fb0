"""GET /data: deterministic training text from parquet shards, or the built-in corpus.

``/data?seed=S&step=N&index=I&bytes=B`` answers JSON ``{text, nbytes, source, ...}``: a
slice of at most B UTF-8 bytes (whole characters, at most 3 bytes short) that is a pure
function of (seed, step, index) and the configured shards. ``source`` is ``"parquet"``
(the configured parquet shards, FineWeb-Edu's or the operator's own; ``url`` names the
shard) or ``"builtin"`` with a ``reason``. ``fallback=0`` turns
the built-in answer into a 503, for peers that would rather wait than train on other text.
"""

from __future__ import annotations

import http.client
import logging
import math
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa
from flask import Blueprint, current_app, jsonify, request
from flask.typing import ResponseReturnValue

from pynode.core.errors import DaisyError
from pynode.platform import failure_words
from server import slicing
from server.config import ServerConfig
from server.shards import Shards

log = logging.getLogger(__name__)
bp = Blueprint("data", __name__)
EXTENSION = "daisychain.data"
MAX_ARG = 2**63 - 1
# Only when pynode/data/corpus.txt is missing (a broken install): the server still answers.
FALLBACK_TEXT = (
    "DaisyChain could not find its built-in corpus, so it trains on this paragraph. "
    "Spare machines and browser tabs train one shared model together; every peer ends "
    "every step with bit-identical weights because every number that crosses a peer "
    "boundary is summed as an integer.\n"
)


class DataUnavailableError(DaisyError):
    """The shards could not serve a slice and the caller refused the built-in corpus."""


class _Docs(Sequence[str]):
    """A row group's text column as a lazy sequence of str (no full conversion)."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        self._column = column

    def __len__(self) -> int:
        return len(self._column)

    def __getitem__(self, i: Any) -> Any:
        return self._column[i].as_py()


class DataService:
    def __init__(self, cfg: ServerConfig, opener: Callable[..., Any] = urllib.request.urlopen):
        self.shards = Shards(cfg.data_urls, cfg.data_timeout_s, cfg.data_cache_bytes, opener)
        self._retry_s = cfg.data_retry_s
        self._corpus_path = cfg.corpus_path
        self._lock = threading.Lock()
        self._down: dict[str, tuple[float, str]] = {}  # url -> (retry after, last error)
        self._corpus: tuple[bytes, str] | None = None

    def slice(self, seed: int, step: int, index: int, nbytes: int, fallback: bool = True
              ) -> dict[str, Any]:
        """The slice of (seed, step, index); built-in text (marked) if the shard fails."""
        common = {"seed": seed, "step": step, "index": index}
        shard = slicing.pick_shard(seed, step, len(self.shards.urls))
        url = self.shards.urls[shard]
        reason = self._still_down(url)
        if reason is None:
            try:
                return {**common, **self._from_shard(shard, url, seed, step, index, nbytes)}
            except (OSError, ValueError, KeyError, http.client.HTTPException,
                    pa.ArrowException, DaisyError) as exc:
                reason = self._mark_down(url, exc)
        if not fallback:
            raise DataUnavailableError(reason)
        return {**common, **self._from_builtin(seed, step, index, nbytes), "reason": reason}

    def _from_shard(self, shard: int, url: str, seed: int, step: int, index: int,
                    nbytes: int) -> dict[str, Any]:
        meta = self.shards.metadata(url)
        group = slicing.pick_row_group(seed, step, shard, meta.rows_per_group)
        docs = _Docs(self.shards.row_group_text(url, group))
        row = slicing.pick_row(seed, step, index, len(docs))
        joined = slicing.gather_documents(docs, row, nbytes)
        window = slicing.cut_window(joined, nbytes, slicing.offset_draw(seed, step, index))
        with self._lock:
            self._down.pop(url, None)
        return {"text": window.text, "nbytes": len(window.text.encode("utf-8")),
                "source": "parquet", "shard": shard, "url": public_name(url), "row_group": group,
                "row": row, "offset": window.start}

    def _from_builtin(self, seed: int, step: int, index: int, nbytes: int) -> dict[str, Any]:
        data, name = self.corpus()
        window = slicing.cut_window(data, nbytes, slicing.offset_draw(seed, step, index))
        return {"text": window.text, "nbytes": len(window.text.encode("utf-8")),
                "source": "builtin", "corpus": name, "offset": window.start}

    def _still_down(self, url: str) -> str | None:
        """Why `url` is not tried now, or None once its back-off is over."""
        with self._lock:
            until, cause = self._down.get(url, (0.0, ""))
        if time.monotonic() >= until:
            return None
        return down_reason(url, cause, until - time.monotonic())

    def _mark_down(self, url: str, exc: Exception) -> str:
        cause = failure_words(exc)
        for name in (url, url.removeprefix("file://")):  # as given, and as opened
            cause = cause.replace(name, public_name(url))
        cause = cause[:300]
        with self._lock:
            self._down[url] = (time.monotonic() + self._retry_s, cause)
        log.warning("data shard %s failed, serving the built-in corpus: %s", url, cause)
        return down_reason(url, cause, self._retry_s)

    def corpus(self) -> tuple[bytes, str]:
        """The built-in corpus bytes and a name saying which one it is."""
        with self._lock:
            if self._corpus is None:
                self._corpus = _load_corpus(self._corpus_path)
            return self._corpus


def public_name(url: str) -> str:
    """How an answer names a shard: its URL, or for a file on this server its name alone
    (where the operator keeps files is nobody else's business)."""
    return url if url.startswith(("http://", "https://")) else Path(url).name


def down_reason(url: str, cause: str, retry_in_s: float) -> str:
    """What /data says of a shard it cannot read (its `reason`, or its 503's `message`):
    the shard by name, not by index; the cause; and that the server, not the asker,
    tries it again."""
    return (f"shard {public_name(url)}: {cause}; the server tries it again in "
            f"{max(1, math.ceil(retry_in_s))} s")


def _load_corpus(path: Path | None) -> tuple[bytes, str]:
    try:
        if path is not None:
            return path.read_bytes(), path.name
        resource = resources.files("pynode").joinpath("data/corpus.txt")
        return resource.read_bytes(), "pynode/data/corpus.txt"
    except (OSError, ModuleNotFoundError) as exc:
        log.error("built-in corpus unavailable (%s); serving a one-paragraph stand-in", exc)
        return FALLBACK_TEXT.encode("utf-8"), "stand-in"


def _int_arg(name: str, lo: int, hi: int, default: int | None = None) -> int:
    raw = request.args.get(name)
    if raw is None:
        if default is None:
            raise ValueError(f"missing query parameter {name}")
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}]")
    value = int(raw)
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}]")
    return value


@bp.get("/data")
def data_slice() -> ResponseReturnValue:
    service: DataService = current_app.extensions[EXTENSION]
    cfg: ServerConfig = current_app.extensions["daisychain.config"]
    try:
        seed = _int_arg("seed", 0, MAX_ARG)
        step = _int_arg("step", 0, MAX_ARG)
        index = _int_arg("index", 0, MAX_ARG)
        nbytes = _int_arg("bytes", 1, cfg.data_max_bytes, default=min(4096, cfg.data_max_bytes))
        fallback = request.args.get("fallback", "1") not in ("0", "false", "no")
    except ValueError as exc:
        return jsonify(error="bad_request", message=str(exc)), 400
    try:
        body = service.slice(seed, step, index, nbytes, fallback=fallback)
    except DataUnavailableError as exc:
        response = jsonify(error="source_unavailable", message=str(exc))
        response.headers["Cache-Control"] = "no-store"
        response.headers["Retry-After"] = str(int(cfg.data_retry_s))
        return response, 503
    response = jsonify(body)
    # A shard slice never changes for a fixed config; a fallback may change once it recovers.
    response.headers["Cache-Control"] = (
        "public, max-age=86400" if body["source"] == "parquet" else "no-store"
    )
    return response
