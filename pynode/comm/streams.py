"""asyncio stream plumbing of the star: framed links, servers and connections.

Native only (Pyodide has no sockets); the browser transport brings its own links.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from pynode.comm.base import CommError
from pynode.comm.wire import HEADER, Frame, Kind, decode_header, encode_header

Address = tuple[str, int] | str | os.PathLike  # (host, port) for TCP, else a Unix socket path
# asyncio pauses reading whenever its buffer passes twice this; the 64 KiB default makes a
# large gradient cost thousands of pause/resume cycles.
_STREAM_LIMIT = 1 << 24


async def read_frame(reader: asyncio.StreamReader, max_payload: int) -> Frame:
    kind, status, seq, rank, arg, length = decode_header(
        await reader.readexactly(HEADER.size), max_payload
    )
    payload = await reader.readexactly(length) if length else b""
    return Frame(kind, status, seq, rank, arg, payload)


class LinkGone(Exception):
    """The other end of a link closed, left or broke the protocol."""


class Link:
    """One connection of the star; a background task queues the frames it reads."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_payload: int
    ) -> None:
        self._writer = writer
        self.received = 0  # bytes of the frames recv returned (headers included)
        self._queue: asyncio.Queue[Frame | str] = asyncio.Queue()
        self._pump = asyncio.create_task(self._read_all(reader, max_payload))

    async def _read_all(self, reader: asyncio.StreamReader, max_payload: int) -> None:
        try:
            while True:
                frame = await read_frame(reader, max_payload)
                self._queue.put_nowait(frame)
                if frame.kind == Kind.BYE:
                    return
        except (asyncio.IncompleteReadError, OSError, CommError) as exc:
            self._queue.put_nowait(f"connection closed ({type(exc).__name__}: {exc})")

    async def recv(self, timeout: float) -> Frame:
        item = await asyncio.wait_for(self._queue.get(), timeout)
        if isinstance(item, Frame) and item.kind != Kind.BYE:
            self.received += HEADER.size + len(item.payload)
            return item
        self._queue.put_nowait(item)  # every later recv sees the same end
        raise LinkGone("it left the group" if isinstance(item, Frame) else item)

    async def send(self, frame: Frame) -> int:
        try:
            self._writer.write(encode_header(frame))
            self._writer.write(frame.payload)
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            raise LinkGone(f"send failed ({exc})") from None
        return HEADER.size + len(frame.payload)

    async def close(self) -> None:
        self._pump.cancel()
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass


async def start_server(on_client: Callable[..., Any], address: Address) -> asyncio.AbstractServer:
    if isinstance(address, tuple):
        host, port = address
        return await asyncio.start_server(on_client, host, port, limit=_STREAM_LIMIT)
    return await asyncio.start_unix_server(on_client, os.fspath(address), limit=_STREAM_LIMIT)


async def open_connection(
    address: Address,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if isinstance(address, tuple):
        return await asyncio.open_connection(*address, limit=_STREAM_LIMIT)
    return await asyncio.open_unix_connection(os.fspath(address), limit=_STREAM_LIMIT)


def bound_address(server: asyncio.AbstractServer, address: Address) -> Address:
    if isinstance(address, tuple):
        host, port = server.sockets[0].getsockname()[:2]
        return (host, port)
    return os.fspath(address)
