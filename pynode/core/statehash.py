"""state_hash: one sha256 over a peer's weights, optimizer state and step, in a fixed byte order.

Peers publish it every step; equal hashes mean bit-identical state. The byte stream is
specified in docs/CHECKPOINTS.md ("State hash"); all integers are little-endian:

    b"DCSTATE\\0"  u32 version  i64 step
    section(params)
    u8 has_adam   [ section(adam m)  section(adam v)  i64 adam step ]
    u32 count of extra entries, then per key in sorted order: str key, u8 tag, value

section = u32 count, then per name in sorted (code point) order:
    str name  u8 dtype code  u32 ndim  i64 dims...  raw C-order little-endian bytes
str = u32 byte length + UTF-8 bytes.  -0.0 and 0.0 (and NaN payloads) hash differently.
"""

from __future__ import annotations

import hashlib
import math
import struct
from typing import Any

import numpy as np

from pynode.core.errors import DaisyError

MAGIC = b"DCSTATE\0"
VERSION = 1

# Codes are part of the format: never renumber, only append.
DTYPE_CODES = {
    "float32": 1, "float64": 2, "float16": 3, "int8": 4, "int16": 5, "int32": 6,
    "int64": 7, "uint8": 8, "uint16": 9, "uint32": 10, "uint64": 11, "bool": 12,
}


class StateHashError(DaisyError, TypeError):
    """Something in the state cannot be hashed canonically (unknown dtype or value type)."""


def state_hash(
    params: dict[str, np.ndarray],
    opt_state: Any = None,
    step: int = 0,
    extra: dict[str, Any] | None = None,
) -> str:
    """sha256 hex of (params, Adam state, step, extra) in the canonical byte order above.

    opt_state: anything with `.m`, `.v` (name -> array) and `.step` (optim.AdamState), or None.
    extra: name -> None | bool | int (int64 range) | float | str | bytes | np.ndarray.
    """
    h = hashlib.sha256()
    h.update(MAGIC)
    h.update(struct.pack("<I", VERSION))
    h.update(_i64(step, "step"))
    _section(h, params, "param")
    if opt_state is None:
        h.update(b"\0")
    else:
        h.update(b"\1")
        _section(h, opt_state.m, "adam m")
        _section(h, opt_state.v, "adam v")
        h.update(_i64(opt_state.step, "adam step"))
    extra = extra or {}
    h.update(struct.pack("<I", len(extra)))
    for key in _sorted_names(extra, "extra"):
        h.update(_str(key))
        _value(h, key, extra[key])
    return h.hexdigest()


def _section(h: Any, arrays: dict[str, np.ndarray], label: str) -> None:
    h.update(struct.pack("<I", len(arrays)))
    for name in _sorted_names(arrays, label):
        h.update(_str(name))
        _array(h, arrays[name], f"{label} {name!r}")


def _array(h: Any, value: Any, label: str) -> None:
    if not isinstance(value, np.ndarray):
        raise StateHashError(f"{label}: expected a numpy array, got {type(value).__name__}")
    code = DTYPE_CODES.get(value.dtype.name)
    if code is None:
        raise StateHashError(f"{label}: dtype {value.dtype} has no canonical hash code")
    h.update(struct.pack("<BI", code, value.ndim))
    h.update(struct.pack(f"<{value.ndim}q", *value.shape))
    little = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
    h.update(little.reshape(-1).view(np.uint8))


def _value(h: Any, key: str, value: Any) -> None:
    if value is None:
        h.update(b"N")
    elif isinstance(value, bool | np.bool_):
        h.update(b"T" if value else b"F")
    elif isinstance(value, int | np.integer):
        h.update(b"I" + _i64(int(value), f"extra {key!r}"))
    elif isinstance(value, float | np.floating):
        if not math.isfinite(value):
            raise StateHashError(f"extra {key!r}: non-finite float {value}")
        h.update(b"D" + struct.pack("<d", float(value)))
    elif isinstance(value, str):
        h.update(b"S" + _str(value))
    elif isinstance(value, bytes):
        h.update(b"B" + struct.pack("<Q", len(value)) + value)
    elif isinstance(value, np.ndarray):
        h.update(b"A")
        _array(h, value, f"extra {key!r}")
    else:
        raise StateHashError(f"extra {key!r}: cannot hash a {type(value).__name__}")


def _sorted_names(mapping: dict, label: str) -> list[str]:
    bad = [k for k in mapping if not isinstance(k, str)]
    if bad:
        raise StateHashError(f"{label} names must be strings, got {bad[0]!r}")
    return sorted(mapping)


def _str(text: str) -> bytes:
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise StateHashError(f"name {text!r} is not valid UTF-8 text") from exc
    return struct.pack("<I", len(raw)) + raw


def _i64(value: Any, label: str) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise StateHashError(f"{label} must be an integer, got {value!r}")
    if not -(2**63) <= int(value) < 2**63:
        raise StateHashError(f"{label} {value} does not fit in int64")
    return struct.pack("<q", int(value))
