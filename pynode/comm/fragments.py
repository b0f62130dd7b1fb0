"""The data channel's framing, the same as the page's (server/pyodide_app/fragments.js).

A message of the Python peers travels as fragments of at most FRAGMENT_BYTES, each with a
16-byte header (message id, fragment index, fragment count, message bytes), over an
ordered, reliable channel; `Reassembler` gives the message back once its last fragment
came, and refuses (FragmentError) any stream such a channel cannot produce.
"""

from __future__ import annotations

import struct

from pynode.comm.base import CommError

FRAGMENT_BYTES = 48 * 1024
HEADER = struct.Struct("<IIII")  # message id, fragment index, fragment count, message bytes
MAX_MESSAGE_BYTES = 1 << 30


class FragmentError(CommError):
    """A fragment stream an ordered, reliable channel cannot produce: the link is broken."""


def fragment_count(total: int) -> int:
    return max(1, -(-total // FRAGMENT_BYTES))


def fragment(message: bytes, msg_id: int, index: int) -> bytes:
    """Fragment `index` of `message`: header + its slice (fragments.js `fragment`)."""
    total = len(message)
    start = index * FRAGMENT_BYTES
    body = message[start : start + FRAGMENT_BYTES]
    return HEADER.pack(msg_id & 0xFFFFFFFF, index, fragment_count(total), total) + body


class Reassembler:
    """Collects the fragments of one message at a time (fragments.js `Reassembler`)."""

    def __init__(self, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._current: tuple[int, int, int] | None = None  # (id, count, total)
        self._next = 0
        self._bytes = bytearray()

    def push(self, data: bytes) -> bytes | None:
        """One fragment in; the whole message when complete, else None. FragmentError on
        anything out of order, oversized or inconsistent."""
        if len(data) < HEADER.size:
            raise FragmentError("fragment shorter than its header")
        msg_id, index, count, total = HEADER.unpack_from(data)
        body = memoryview(data)[HEADER.size :]
        if index == 0:
            if self._current is not None:
                raise FragmentError(f"message {msg_id} began inside message {self._current[0]}")
            if total > self.max_bytes:
                raise FragmentError(f"message of {total} bytes exceeds {self.max_bytes}")
            if count != fragment_count(total):
                raise FragmentError(f"message {msg_id}: {count} fragments cannot hold {total} "
                                    "bytes")
            self._current, self._next, self._bytes = (msg_id, count, total), 0, bytearray()
        if self._current != (msg_id, count, total) or index != self._next:
            raise FragmentError(f"unexpected fragment {index}/{count} of message {msg_id}")
        if len(body) != min(FRAGMENT_BYTES, total - index * FRAGMENT_BYTES):
            raise FragmentError(f"fragment {index} of message {msg_id} has {len(body)} bytes")
        self._bytes += body
        self._next += 1
        if self._next < count:
            return None
        self._current = None
        whole, self._bytes = bytes(self._bytes), bytearray()
        return whole
