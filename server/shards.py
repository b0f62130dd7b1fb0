"""Parquet shards read over HTTP ranges (or from disk): footers cached, row groups on demand.

Per shard the server reads the footer once (8 bytes, then exactly the footer) and keeps
its metadata; per slice it reads only the ``text`` column chunk of one row group, which
stays in a byte-bounded LRU so the other microbatches of the step cost no transfer.
"""

from __future__ import annotations

import io
import logging
import threading
import time
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from pynode.core.errors import DaisyError
from pynode.datafile import is_text_type
from server.rangefile import RangeFile

log = logging.getLogger(__name__)
MAGIC = b"PAR1"
TEXT_COLUMN = "text"


class ShardError(DaisyError, ValueError):
    """A shard that is not a parquet file with a text column and at least one row."""


@dataclass(frozen=True)
class ShardMeta:
    size: int  # file length in bytes
    footer_bytes: int  # footer + its 8-byte trailer: what reading the metadata costs
    metadata: pq.FileMetaData
    rows_per_group: tuple[int, ...]


class Shards:
    """The configured shards; thread-safe; each network read happens once per key."""

    def __init__(
        self,
        urls: tuple[str, ...],
        timeout: float,
        cache_bytes: int,
        opener: Callable[..., Any] = urllib.request.urlopen,
    ) -> None:
        self.urls = urls
        self._timeout = timeout
        self._cache_bytes = cache_bytes
        self._opener = opener
        self._lock = threading.Lock()
        self._key_locks: dict[Any, threading.Lock] = {}
        self._meta: dict[str, ShardMeta] = {}
        self._groups: OrderedDict[tuple[str, int], pa.ChunkedArray] = OrderedDict()
        self._group_bytes = 0
        self.bytes_fetched = 0  # body bytes received from remote shards, all time
        self.requests = 0  # range requests made, all time

    def metadata(self, url: str) -> ShardMeta:
        with self._key_lock(("meta", url)):
            with self._lock:
                if url in self._meta:
                    return self._meta[url]
            with self._open(url) as f:
                meta = read_footer(f)
            with self._lock:
                self._meta[url] = meta
            return meta

    def row_group_text(self, url: str, group: int) -> pa.ChunkedArray:
        """The text column of one row group, from the cache or one column-chunk read."""
        key = (url, group)
        with self._key_lock(key):
            with self._lock:
                if key in self._groups:
                    self._groups.move_to_end(key)
                    return self._groups[key]
            meta = self.metadata(url)
            if not 0 <= group < len(meta.rows_per_group):
                raise ShardError(f"{url} has no row group {group}")
            started = time.perf_counter()
            with self._open(url, meta.size) as f:
                reader = pq.ParquetFile(f, metadata=meta.metadata, pre_buffer=False)
                text = reader.read_row_group(group, columns=[TEXT_COLUMN]).column(0)
            log.debug("read %s row group %d in %.2fs", url, group, time.perf_counter() - started)
            with self._lock:
                self._remember(key, text)
            return text

    def _remember(self, key: tuple[str, int], text: pa.ChunkedArray) -> None:
        if text.nbytes > self._cache_bytes:
            return
        self._groups[key] = text
        self._group_bytes += text.nbytes
        while self._group_bytes > self._cache_bytes:
            _, old = self._groups.popitem(last=False)
            self._group_bytes -= old.nbytes

    def _key_lock(self, key: Any) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def _open(self, url: str, size: int | None = None) -> _Counted:
        if url.startswith(("http://", "https://")):
            return _Counted(self, RangeFile(url, self._timeout, self._opener, size))
        path = Path(url.removeprefix("file://"))
        return _Counted(self, open(path, "rb"))


class _Counted:
    """Context manager that closes a shard file and adds its transfer to the totals."""

    def __init__(self, shards: Shards, f: BinaryIO | RangeFile) -> None:
        self._shards = shards
        self._f = f

    def __enter__(self) -> Any:
        return self._f

    def __exit__(self, *exc: object) -> None:
        self._f.close()
        if isinstance(self._f, RangeFile):
            with self._shards._lock:
                self._shards.bytes_fetched += self._f.bytes_fetched
                self._shards.requests += self._f.requests


def read_footer(f: Any) -> ShardMeta:
    """Parquet metadata from the end of ``f``: the trailer, then exactly the footer."""
    size = f.seek(0, io.SEEK_END)
    if size < 8 + len(MAGIC):  # a file this short (empty, say) has no room for a trailer
        raise ShardError(f"not a parquet file ({size} bytes)")
    f.seek(size - 8)
    trailer = f.read(8)
    if len(trailer) != 8 or trailer[4:] != MAGIC:
        raise ShardError("not a parquet file (no PAR1 trailer)")
    footer_len = int.from_bytes(trailer[:4], "little")
    if footer_len + 8 + len(MAGIC) > size:
        raise ShardError(f"footer length {footer_len} exceeds the file ({size} bytes)")
    f.seek(size - 8 - footer_len)
    footer = f.read(footer_len)
    # The footer alone parses as a file once framed by magic bytes; offsets stay those of f.
    metadata = pq.read_metadata(io.BytesIO(MAGIC + footer + trailer))
    if TEXT_COLUMN not in metadata.schema.names:
        raise ShardError(f"no {TEXT_COLUMN!r} column (columns: {metadata.schema.names[:12]})")
    kind = metadata.schema.to_arrow_schema().field(TEXT_COLUMN).type
    if not is_text_type(kind):
        raise ShardError(f"its {TEXT_COLUMN!r} column holds {kind}, not text")
    if metadata.num_rows == 0:  # else accepted at start, and every slice asked of it failed
        raise ShardError(f"no rows (its {TEXT_COLUMN!r} column is empty)")
    rows = tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
    return ShardMeta(size=size, footer_bytes=footer_len + 8, metadata=metadata,
                     rows_per_group=rows)
