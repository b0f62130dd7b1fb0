"""Frames of the star protocol: a fixed 32-byte header, then `length` payload bytes.

Header (little-endian): magic b"DCHN", version u8, kind u8, status u8, pad u8,
seq u32, rank i32, arg i64, length u64. `status` is 0 or a refusal code of base.py;
`arg` is the broadcast root where one is needed.

`pack_message` / `unpack_message` is the one codec of structured messages: a u32 length, a
JSON object, then a binary blob. Star results, the run protocol (pynode.run.protocol) and
the cluster bridge all use it.
"""

from __future__ import annotations

import json
import struct
from enum import IntEnum
from typing import Any, NamedTuple

from pynode.comm.base import CommError

MAGIC = b"DCHN"
VERSION = 1
HEADER = struct.Struct("<4sBBBxIiqQ")
_META_LEN = struct.Struct("<I")


class MessageError(CommError):
    """A structured message that does not decode (truncated, not JSON, not an object)."""


class Kind(IntEnum):
    HELLO = 1  # peer -> hub: JSON {rank, world_size, group, version}
    WELCOME = 2  # hub -> peer: meta {members}; the group is formed
    ALLREDUCE = 3
    BROADCAST = 4
    ALLGATHER = 5
    BARRIER = 6
    DROP = 7  # hub -> peer: you missed a deadline and are no longer a member
    BYE = 8  # either way: orderly close



class Frame(NamedTuple):
    kind: Kind
    status: int
    seq: int
    rank: int
    arg: int
    payload: bytes


def encode_header(frame: Frame) -> bytes:
    return HEADER.pack(
        MAGIC,
        VERSION,
        frame.kind,
        frame.status,
        frame.seq & 0xFFFFFFFF,
        frame.rank,
        frame.arg,
        len(frame.payload),
    )


def decode_header(raw: bytes, max_payload: int) -> tuple[Kind, int, int, int, int, int]:
    """(kind, status, seq, rank, arg, length) of a header; CommError on anything foreign."""
    magic, version, kind, status, seq, rank, arg, length = HEADER.unpack(raw)
    if magic != MAGIC:
        raise CommError(f"not a DaisyChain frame (magic {magic!r})")
    if version != VERSION:
        raise CommError(f"wire version {version}, this peer speaks {VERSION}")
    try:
        kind = Kind(kind)
    except ValueError:
        raise CommError(f"unknown frame kind {kind}") from None
    if length > max_payload:
        raise CommError(f"frame of {length} bytes exceeds the limit of {max_payload}")
    return kind, status, seq, rank, arg, length


def pack_message(head: dict[str, Any], blob: bytes = b"") -> bytes:
    """u32 length, the JSON object `head`, then `blob`."""
    text = json.dumps(head, separators=(",", ":")).encode()
    return _META_LEN.pack(len(text)) + text + blob


def unpack_message(data: bytes | memoryview) -> tuple[dict[str, Any], bytes]:
    """(head, blob) of a `pack_message`; MessageError for anything malformed."""
    try:
        (n,) = _META_LEN.unpack_from(data)
        if _META_LEN.size + n > len(data):
            raise ValueError(f"JSON of {n} bytes in a message of {len(data)}")
        head = json.loads(bytes(data[_META_LEN.size : _META_LEN.size + n]))
    except (struct.error, ValueError) as exc:
        raise MessageError(f"malformed message: {exc}") from None
    if not isinstance(head, dict):
        raise MessageError("malformed message: its head is not a JSON object")
    return head, bytes(data[_META_LEN.size + n :])
