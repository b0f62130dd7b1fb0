"""The signaling wire format: one schema table, one validator, one frame encoder. No I/O.

Every frame is a JSON object ``{"v": 1, "type": T, ...}``. A client frame is accepted only
if its type is in CLIENT_SCHEMAS and each field has the listed kind and bounds; anything
else raises ProtocolError, which the connection turns into an error frame (and drops).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from pynode.core.errors import DaisyError

PROTOCOL_VERSION = 1
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,32}")
# Room codes are 22 characters of this alphabet (server/rooms.py makes them from the
# look-alike-free part of it, 110 bits; token_urlsafe(16) made them before).
CODE_PATTERN = re.compile(r"[A-Za-z0-9_-]{22}")
MAX_SAFE_INT = 2**53  # what a JS number holds exactly


class ProtocolError(DaisyError, ValueError):
    """A client frame the server refuses; ``code`` is the error frame's machine-readable code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Field:
    kind: str  # "str", "id" (peer id), "code" (room code), "int", "num" or "bool"
    required: bool = False  # must be present
    max_len: int = 0  # longest string (characters), for kind "str"
    lo: float = 0  # smallest number, for "int" / "num"
    hi: float = MAX_SAFE_INT  # largest number
    nullable: bool = False  # JSON null allowed


_PEER = {"peer": Field("id", required=True)}
_TO = Field("id", required=True)
_SDP = Field("str", required=True, max_len=65536)

# type -> {field: Field}. "v" and "type" are implied on every frame.
CLIENT_SCHEMAS: dict[str, dict[str, Field]] = {
    # fresh: the page sending the token reloaded (its state is new): see Rooms.join
    "join": {"room": Field("code"), "token": Field("str", max_len=512), "fresh": Field("bool")},
    "create": {},  # a resume token goes with `join`: a new room has nothing to resume
    "approve": _PEER,
    "deny": _PEER,
    "remove": _PEER,
    "offer": {"to": _TO, "sdp": _SDP},
    "answer": {"to": _TO, "sdp": _SDP},
    "ice": {
        "to": _TO,
        "candidate": Field("str", required=True, max_len=2048),  # "" marks end of candidates
        "sdpMid": Field("str", max_len=64, nullable=True),
        "sdpMLineIndex": Field("int", hi=1023, nullable=True),
        "usernameFragment": Field("str", max_len=256, nullable=True),
    },
    "status": {
        "step": Field("int"),
        "loss": Field("num", lo=-1e9, hi=1e9, nullable=True),
        "hash": Field("str", max_len=128),
        "probe": Field("str", max_len=128),
        "capacity": Field("num", hi=1e9),
    },
    "leave": {},
    "ping": {"t": Field("num", lo=-MAX_SAFE_INT)},
}

# What a peer that is not (yet) an approved member may send.
PENDING_TYPES = frozenset({"leave", "ping"})
UNJOINED_TYPES = frozenset({"join", "create", "ping"})
RELAY_TYPES = frozenset({"offer", "answer", "ice"})
HOST_TYPES = frozenset({"approve", "deny", "remove"})


def _reject_constant(name: str) -> Any:
    raise ProtocolError("bad_json", f"{name} is not valid JSON")


def parse_frame(raw: str | bytes, max_bytes: int) -> dict[str, Any]:
    """Decode and validate one client frame; ProtocolError if it is not acceptable."""
    if isinstance(raw, (bytes, bytearray)):
        raise ProtocolError("binary", "binary frames are not part of the protocol")
    if len(raw) > max_bytes or len(raw.encode("utf-8", "surrogatepass")) > max_bytes:
        raise ProtocolError("too_large", f"frame exceeds {max_bytes} bytes")
    try:
        msg = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, ProtocolError):
            raise
        raise ProtocolError("bad_json", "frame is not valid JSON") from None
    if not isinstance(msg, dict):
        raise ProtocolError("bad_frame", "frame must be a JSON object")
    version = msg.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError("bad_version", f"field v must be {PROTOCOL_VERSION}")
    kind = msg.get("type")
    if not isinstance(kind, str) or kind not in CLIENT_SCHEMAS:
        raise ProtocolError("unknown_type", "unknown message type")
    schema = CLIENT_SCHEMAS[kind]
    for name in msg:
        if name not in schema and name not in ("v", "type"):
            raise ProtocolError("unknown_field", f"{kind} has no field {name[:40]!r}")
    for name, spec in schema.items():
        if name in msg:
            _check_field(kind, name, spec, msg[name])
        elif spec.required:
            raise ProtocolError("missing_field", f"{kind} needs field {name!r}")
    return msg


def _check_field(kind: str, name: str, spec: Field, value: Any) -> None:
    where = f"{kind}.{name}"
    if value is None:
        if not spec.nullable:
            raise ProtocolError("bad_field", f"{where} must not be null")
        return
    if spec.kind in ("str", "id", "code"):
        if not isinstance(value, str):
            raise ProtocolError("bad_field", f"{where} must be a string")
        if spec.kind == "str" and len(value) > spec.max_len:
            raise ProtocolError("too_large", f"{where} exceeds {spec.max_len} characters")
        if spec.kind == "id" and not ID_PATTERN.fullmatch(value):
            raise ProtocolError("bad_field", f"{where} is not a peer id")
        if spec.kind == "code" and not CODE_PATTERN.fullmatch(value):
            raise ProtocolError("bad_room", f"{where} is not a room code")
        return
    if spec.kind == "bool":
        if type(value) is not bool:
            raise ProtocolError("bad_field", f"{where} must be true or false")
        return
    # bool is an int subclass in Python but never a number on the wire.
    if spec.kind == "int" and (type(value) is not int):
        raise ProtocolError("bad_field", f"{where} must be an integer")
    if spec.kind == "num" and type(value) not in (int, float):
        raise ProtocolError("bad_field", f"{where} must be a finite number")
    # The bounds first: comparing a Python int with a float is exact at any size, while
    # float(value) overflows for integers of ~310 digits.
    if not spec.lo <= value <= spec.hi:
        raise ProtocolError("bad_field", f"{where} must be in [{spec.lo:g}, {spec.hi:g}]")
    if type(value) is float and not math.isfinite(value):  # nan passes the comparison
        raise ProtocolError("bad_field", f"{where} must be a finite number")


def encode(kind: str, **fields: Any) -> str:
    """A server frame as JSON text."""
    return json.dumps({"v": PROTOCOL_VERSION, "type": kind, **fields}, separators=(",", ":"))


def error_frame(code: str, message: str, ref: str | None = None) -> str:
    """The error frame a refused client frame gets; ``ref`` is the refused frame's type."""
    return encode("error", code=code, message=message, ref=ref)
