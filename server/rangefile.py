"""A read-only file over HTTP range requests, for pyarrow to read parquet without downloading it.

Every ``readinto`` is one ``Range: bytes=a-b`` request for exactly what was asked, and a
server that ignores Range (answering 200 with the whole body) is refused rather than read.
The first size lookup fetches the last 8 bytes (``bytes=-8``: parquet's footer length and
magic), which are then served from memory.
"""

from __future__ import annotations

import io
import re
import urllib.request
from collections.abc import Callable
from typing import Any

from pynode.core.errors import DaisyError

CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
TAIL_BYTES = 8


class RangeRequestError(DaisyError, OSError):
    """The server does not answer range requests as HTTP/1.1 says it must."""


class RangeFile(io.RawIOBase):
    """Seekable, read-only view of ``url``; counts requests and body bytes received."""

    def __init__(
        self,
        url: str,
        timeout: float = 15.0,
        opener: Callable[..., Any] = urllib.request.urlopen,
        size: int | None = None,
    ) -> None:
        super().__init__()
        self.url = url
        self.timeout = timeout
        self.requests = 0
        self.bytes_fetched = 0
        self._open = opener
        self._pos = 0
        self._size = size  # known from a cached footer: no tail request needed
        self._tail = b""

    # io.RawIOBase protocol
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset
        else:
            raise ValueError(f"bad whence {whence}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        start, end = self._pos, min(self.size, self._pos + len(view))
        if start >= end:
            return 0
        tail_start = self.size - len(self._tail)
        if start >= tail_start:
            data = self._tail[start - tail_start : end - tail_start]
        else:
            data = self._get(f"bytes={start}-{end - 1}", start, end - start)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    @property
    def size(self) -> int:
        """Length of the remote file (one small tail request the first time)."""
        if self._size is None:
            self._tail = self._get(f"bytes=-{TAIL_BYTES}", None, None)
        assert self._size is not None
        return self._size

    def _get(self, spec: str, start: int | None, length: int | None) -> bytes:
        request = urllib.request.Request(self.url, headers={"Range": spec})
        self.requests += 1
        with self._open(request, timeout=self.timeout) as response:
            if response.status != 206:
                raise RangeRequestError(
                    f"{self.url} answered {response.status} to a range request (need 206)"
                )
            match = CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
            if match is None:
                raise RangeRequestError(f"{self.url} sent no usable Content-Range header")
            first, last, total = (int(g) for g in match.groups())
            if start is not None and (first != start or last - first + 1 != length):
                raise RangeRequestError(f"{self.url} sent bytes {first}-{last}, not {spec}")
            data = response.read(last - first + 1)
            self.bytes_fetched += len(data)
            if len(data) != last - first + 1:
                raise RangeRequestError(f"{self.url} ended after {len(data)} bytes of {spec}")
            # Redirects (the HF CDN) are resolved once; later ranges go straight there.
            self.url = response.geturl()
        self._size = total
        return data
