"""Shared memory between the two processes of a loopback pair: where their all-reduce
vectors change hands without the socket or the codec.

Both peers of `train --peers 2` run on one machine, so the member writes its (n,) int64
vector into memory the hub maps, and the hub writes its own where the member reads it;
only a few-byte frame crosses the socket to say "it is there". On a 2-core VM this took
a pair all-reduce of the default model's 119,121 values from ~1.8 ms (pack, send, forward,
unpack) to ~0.2-0.6 ms.

Layout: one file of 3 (n,) int64 rows, the hub's two (it alternates, so the member may still
read the last one while the hub writes the next) and the member's one. Every write is
followed by a frame the reader waits for, and the protocol never lets a writer reach a row
its reader may still be reading (pynode/comm/loopback.py says why). The hub creates the file
in /dev/shm where there is one (memory, not disk), its pages reserved at once, the member
maps it from the path the hub sends, and the hub removes the name once the member has used
it (or could not); the mappings live on until each side closes. A crash between creation
and that first use leaves the file behind (its name starts with `daisychain-pair-`).

Legend: n values of one all-reduce.
"""

from __future__ import annotations

import mmap
import os
import tempfile

import numpy as np

PREFIX = "daisychain-pair-"
ROWS = 3  # the hub's two, then the member's
MEMBER = 2
SHM = "/dev/shm"  # Linux's memory-backed folder; elsewhere the temp folder


class SharedVectors:
    """A mapped file of ROWS (n,) int64 rows; `rows[i]` is a view into it."""

    def __init__(self, path: str, n: int, fd: int) -> None:
        self.path, self.n = path, n
        self._map = mmap.mmap(fd, ROWS * n * 8)
        os.close(fd)
        self.rows = np.frombuffer(self._map, np.int64).reshape(ROWS, n)
        self.named = True  # the file still has its name (unlink removes it)

    @classmethod
    def create(cls, n: int) -> SharedVectors:
        """A new file for vectors of n values (the hub's side)."""
        folder = SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK) else None
        fd, path = tempfile.mkstemp(prefix=PREFIX, dir=folder)
        try:
            # the pages now, so that a full /dev/shm is an OSError here (ENOSPC), never a
            # SIGBUS at the first write to a page it cannot hold
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, ROWS * n * 8)
            else:
                os.ftruncate(fd, ROWS * n * 8)
            return cls(path, n, fd)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise

    @classmethod
    def attach(cls, path: str, n: int) -> SharedVectors:
        """The hub's file (the member's side); OSError if it cannot be mapped whole."""
        if not os.path.basename(path).startswith(PREFIX):
            raise OSError(f"{path!r} is not a pair's shared vectors")
        fd = os.open(path, os.O_RDWR)
        try:
            if os.fstat(fd).st_size != ROWS * n * 8:
                raise OSError(f"{path} holds {os.fstat(fd).st_size} bytes, not {ROWS * n * 8}")
            return cls(path, n, fd)
        except BaseException:
            os.close(fd)
            raise

    def unlink(self) -> None:
        """Remove the file's name (the mappings stay valid)."""
        if self.named:
            self.named = False
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        self.rows = np.empty((ROWS, 0), np.int64)  # the map closes once no view is left
        try:
            self._map.close()
        except BufferError:
            pass  # a caller still holds a view: the map goes with it
