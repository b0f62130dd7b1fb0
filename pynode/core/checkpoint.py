"""Checkpoints: .pt files that torch.load(weights_only=True) reads, written and read without torch.

Bytes in, bytes out. The file is torch's zip serialization (see docs/CHECKPOINTS.md): a
protocol-2 pickle `archive/data.pkl` whose tensors are REDUCEs of
torch._utils._rebuild_tensor_v2 over persistent storages `archive/data/<key>` (raw
little-endian bytes, 64-byte aligned; the zip container is pynode/core/ptzip.py). We
write the pickle opcodes ourselves because
pickle.Pickler cannot name torch's globals without importing torch; we read it with an
unpickler that maps the four kinds of global a checkpoint needs to our own functions and
refuses every other one. A file that fails any check is refused whole.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np

from pynode.core import ptzip
from pynode.core.errors import DaisyError
from pynode.core.optim import AdamState
from pynode.core.statehash import state_hash

MAGIC = "DAISYCHAIN-CKPT"
FORMAT_VERSION = 1
ARCHIVE = "archive"

# torch storage class (module `torch`) -> little-endian numpy dtype of its elements
_STORAGE_DTYPES = {
    "FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2", "LongStorage": "<i8",
    "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1", "ByteStorage": "u1",
    "BoolStorage": "?",
}
_STORAGE_OF = {np.dtype(v).name: k for k, v in _STORAGE_DTYPES.items()}
_KEYS = ("magic", "format_version", "task", "config", "step", "params", "adam_m", "adam_v",
         "adam_step", "data_cursor", "state_hash")
_EXPECT_KEYS = {"task", "config", "param_shapes", "vocab"}
_HEX64 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(DaisyError, ValueError):
    """A checkpoint that cannot be written or must not be loaded (the message says why)."""


@dataclass(frozen=True)
class CheckpointState:
    task: str                           # task name the run trains
    config: dict[str, Any]              # run config, JSON-compatible
    step: int                           # optimizer steps done
    params: dict[str, np.ndarray]       # name -> float32 weights, model's declared order
    adam_m: dict[str, np.ndarray]       # name -> float32 first moment
    adam_v: dict[str, np.ndarray]       # name -> float32 second moment
    adam_step: int                      # Adam's own step counter (bias correction)
    data_cursor: int                    # where the data stream resumes
    state_hash: str = ""                # state_hash(params, adam, step); "" = compute on save

    def adam_state(self) -> AdamState:
        return AdamState(m=dict(self.adam_m), v=dict(self.adam_v), step=self.adam_step)

    def computed_hash(self) -> str:
        """The state hash peers publish: statehash.state_hash(params, adam state, step)."""
        return state_hash(self.params, self.adam_state(), self.step)


def save_checkpoint(state: CheckpointState) -> bytes:
    """The .pt bytes of `state`. Same state -> same bytes, on every runtime.

    Raises CheckpointError (nothing produced) for anything load_checkpoint would refuse,
    including a `state_hash` that does not match the state.
    """
    _validate(state)
    if not isinstance(state.state_hash, str):
        raise CheckpointError(f"state_hash must be a hex string, got {state.state_hash!r}")
    computed = state.computed_hash()
    if state.state_hash and state.state_hash != computed:
        raise CheckpointError(
            f"state_hash {state.state_hash[:16]}... does not match the state ({computed[:16]}...)"
        )
    payload = {
        "magic": MAGIC, "format_version": FORMAT_VERSION, "task": state.task,
        "config": state.config, "step": state.step, "params": state.params,
        "adam_m": {name: state.adam_m[name] for name in state.params},
        "adam_v": {name: state.adam_v[name] for name in state.params},
        "adam_step": state.adam_step, "data_cursor": state.data_cursor, "state_hash": computed,
    }
    pickled, storages = _TorchPickler().dump(payload)
    records = [("data.pkl", pickled), (".format_version", b"1"),
               (".storage_alignment", str(ptzip.STORAGE_ALIGNMENT).encode()),
               ("byteorder", b"little")]
    records += [(f"data/{key}", data) for key, data in enumerate(storages)]
    records.append(("version", b"3\n"))
    try:
        return ptzip.write_stored([(f"{ARCHIVE}/{name}", data) for name, data in records])
    except ptzip.ArchiveError as exc:  # over its limits
        raise CheckpointError(str(exc)) from None


def load_checkpoint(b: bytes, expect: dict[str, Any] | None = None) -> CheckpointState:
    """Read and validate a checkpoint (ours or torch.save of the same dict), without torch.

    expect (all optional): "task": str; "config": {key: value} that must match the stored
    config; "param_shapes": {name: shape} or a function config -> {name: shape}; "vocab":
    int that must equal config["vocab"]. Checks magic, format version, types, finiteness of
    every tensor, the expectations and the stored state hash; any failure raises
    CheckpointError and nothing is returned.
    """
    if not isinstance(b, bytes | bytearray | memoryview):
        raise CheckpointError(f"load_checkpoint takes bytes, got {type(b).__name__}")
    try:
        records = ptzip.read_members(bytes(b))
    except ptzip.ArchiveError as exc:
        raise CheckpointError(str(exc)) from None
    order = records.get("byteorder", b"little")
    if order not in (b"little", b"big"):
        raise CheckpointError(f"unknown byteorder record {order!r}")
    obj = _unpickle(records)
    if not isinstance(obj, dict):
        raise CheckpointError(f"not a DaisyChain checkpoint: top level is {type(obj).__name__}")
    if obj.get("magic") != MAGIC:
        raise CheckpointError(f"not a DaisyChain checkpoint: magic is {obj.get('magic')!r}")
    version = obj.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint format version {version!r} is not supported (this reads {FORMAT_VERSION})"
        )
    missing = [k for k in _KEYS if k not in obj]
    unknown = sorted(str(k) for k in obj if k not in _KEYS)
    if missing or unknown:
        raise CheckpointError(f"checkpoint keys: missing {missing or 'none'}, "
                              f"unknown {unknown or 'none'}")
    state = CheckpointState(**{f.name: obj[f.name] for f in fields(CheckpointState)})
    _validate(state)
    if not isinstance(state.state_hash, str) or not _HEX64.fullmatch(state.state_hash):
        raise CheckpointError(f"stored state_hash is not a sha256 hex digest: {state.state_hash!r}")
    _check_expect(state, expect)
    computed = state.computed_hash()
    if computed != state.state_hash:
        raise CheckpointError(f"state hash mismatch: file says {state.state_hash[:16]}..., "
                              f"contents hash to {computed[:16]}... (corrupted or edited)")
    return state


# --- validation -----------------------------------------------------------------------------

def _validate(state: CheckpointState) -> None:
    if not isinstance(state, CheckpointState):
        raise CheckpointError(f"expected a CheckpointState, got {type(state).__name__}")
    if not isinstance(state.task, str) or not state.task:
        raise CheckpointError(f"task must be a non-empty string, got {state.task!r}")
    if not isinstance(state.config, dict):
        raise CheckpointError(f"config must be a dict, got {type(state.config).__name__}")
    _check_json("config", state.config)
    for name in ("step", "adam_step", "data_cursor"):
        value = getattr(state, name)
        if type(value) is not int or not 0 <= value < 2**63:
            raise CheckpointError(f"{name} must be an integer in [0, 2**63), got {value!r}")
    _check_tensors("params", state.params, None)
    _check_tensors("adam_m", state.adam_m, state.params)
    _check_tensors("adam_v", state.adam_v, state.params)


def _check_tensors(label: str, tensors: Any, like: dict[str, np.ndarray] | None) -> None:
    if not isinstance(tensors, dict) or (like is None and not tensors):
        raise CheckpointError(f"{label} must be a non-empty dict of tensors")
    if like is not None and set(tensors) != set(like):
        raise CheckpointError(f"{label} names differ from params: "
                              f"{sorted(map(str, set(tensors) ^ set(like)))}")
    for name, arr in tensors.items():
        if not isinstance(name, str):
            raise CheckpointError(f"{label}: tensor names must be strings, got {name!r}")
        if not isinstance(arr, np.ndarray) or arr.dtype != np.float32:
            got = f"{type(arr).__name__} of {getattr(arr, 'dtype', '?')}"
            raise CheckpointError(f"{label}[{name!r}] must be a float32 tensor, got {got}")
        if like is not None and arr.shape != like[name].shape:
            raise CheckpointError(f"{label}[{name!r}] has shape {arr.shape}, "
                                  f"params[{name!r}] has {like[name].shape}")
        bad = ~np.isfinite(arr)
        if bad.any():
            raise CheckpointError(f"{label}[{name!r}] holds {int(bad.sum())} NaN/Inf value(s)")


def _check_json(path: str, value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise CheckpointError(f"{path} is {value}: config values must be finite")
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(f"{path}[{i}]", item)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CheckpointError(f"{path} has a non-string key {key!r}")
            _check_json(f"{path}.{key}", item)
    elif not (value is None or isinstance(value, bool | int | float | str)):
        raise CheckpointError(f"{path} is a {type(value).__name__}, which is not JSON-compatible")


def _check_expect(state: CheckpointState, expect: dict[str, Any] | None) -> None:
    if not expect:
        return
    unknown = sorted(set(expect) - _EXPECT_KEYS)
    if unknown:
        raise CheckpointError(f"unknown expectations {unknown}; use {sorted(_EXPECT_KEYS)}")
    if "task" in expect and state.task != expect["task"]:
        raise CheckpointError(f"checkpoint is for task {state.task!r}, expected {expect['task']!r}")
    for key, want in (expect.get("config") or {}).items():
        have = state.config.get(key, "<missing>")
        if have != want or type(have) is not type(want):
            raise CheckpointError(f"config {key}: checkpoint has {have!r}, expected {want!r}")
    if "vocab" in expect and state.config.get("vocab", "<missing>") != expect["vocab"]:
        raise CheckpointError(f"vocab: checkpoint config has {state.config.get('vocab', None)!r}"
                              f", expected {expect['vocab']!r}")
    shapes = expect.get("param_shapes")
    if callable(shapes):
        shapes = shapes(state.config)
    if shapes is not None:
        want = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}
        have = {name: arr.shape for name, arr in state.params.items()}
        if set(want) != set(have):
            raise CheckpointError(f"parameter names differ from the model: missing "
                                  f"{sorted(set(want) - set(have))}, unexpected "
                                  f"{sorted(set(have) - set(want))}")
        wrong = [name for name in want if want[name] != have[name]]
        if wrong:
            raise CheckpointError(f"parameter {wrong[0]!r} has shape {have[wrong[0]]}, "
                                  f"the model needs {want[wrong[0]]}")


# --- writing: pickle opcodes -------------------------------------------------------------

class _TorchPickler:
    """Protocol-2 pickle of dict/list/str/int/float/bool/None and numpy arrays as torch tensors."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.storages: list[bytes] = []

    def dump(self, obj: Any) -> tuple[bytes, list[bytes]]:
        self.out += b"\x80\x02"
        self.write(obj)
        self.out += b"."
        return bytes(self.out), self.storages

    def write(self, obj: Any) -> None:
        out = self.out
        if obj is None:
            out += b"N"
        elif isinstance(obj, bool):
            out += b"\x88" if obj else b"\x89"
        elif isinstance(obj, int):
            out += _pickle_int(obj)
        elif isinstance(obj, float):
            out += b"G" + struct.pack(">d", obj)
        elif isinstance(obj, str):
            raw = obj.encode("utf-8")
            out += b"X" + struct.pack("<I", len(raw)) + raw
        elif isinstance(obj, dict):
            out += b"}"
            if obj:
                out += b"("
                for key, value in obj.items():
                    self.write(key)
                    self.write(value)
                out += b"u"
        elif isinstance(obj, list):
            out += b"]"
            if obj:
                out += b"("
                for item in obj:
                    self.write(item)
                out += b"e"
        elif isinstance(obj, np.ndarray):
            self.write_tensor(obj)
        else:
            raise CheckpointError(f"cannot store a {type(obj).__name__} in a checkpoint")

    def write_tensor(self, arr: np.ndarray) -> None:
        key = str(len(self.storages))
        self.storages.append(np.ascontiguousarray(arr, arr.dtype.newbyteorder("<")).tobytes())
        strides, step = [], 1
        for dim in reversed(arr.shape):  # torch's contiguous strides (zero dims count as 1)
            strides.append(step)
            step *= max(dim, 1)
        self.out += b"ctorch._utils\n_rebuild_tensor_v2\n("
        self.out += b"(X\x07\x00\x00\x00storage"
        self.out += f"ctorch\n{_STORAGE_OF[arr.dtype.name]}\n".encode()
        self.write(key)
        self.write("cpu")
        self.write(arr.size)
        self.out += b"tQ" + _pickle_int(0)
        self.write_tuple(arr.shape)
        self.write_tuple(tuple(reversed(strides)))
        self.out += b"\x89ccollections\nOrderedDict\n)Rt" + b"R"

    def write_tuple(self, items: tuple[int, ...]) -> None:
        self.out += b"("
        for item in items:
            self.write(int(item))
        self.out += b"t"


def _pickle_int(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if 0 <= n < 65536:
        return b"M" + struct.pack("<H", n)
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes(n.bit_length() // 8 + 1, "little", signed=True)
    if len(raw) > 255:
        raise CheckpointError(f"integer {n} is too large to store")
    return b"\x8a" + bytes([len(raw)]) + raw


# --- reading: a restricted unpickler ------------------------------------------------------

class _StorageType(NamedTuple):
    name: str          # torch storage class name, e.g. "FloatStorage"


class _Storage(NamedTuple):
    kind: str          # torch storage class name
    data: np.ndarray   # (numel,) read-only elements in native byte order


def _unpickle(records: dict[str, bytes]) -> Any:
    try:
        return _RestrictedUnpickler(records).load()
    except CheckpointError:
        raise
    except Exception as exc:  # a damaged pickle fails in many ways; all mean "refuse"
        raise CheckpointError(f"checkpoint pickle is damaged: {type(exc).__name__}: {exc}") from exc


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only torch's tensor rebuild, its storage classes and OrderedDict."""

    def __init__(self, records: dict[str, bytes]) -> None:
        super().__init__(io.BytesIO(records["data.pkl"]))
        self.records = records
        self.big_endian = records.get("byteorder") == b"big"
        self.storages: dict[str, _Storage] = {}
        self.rebuild = _make_rebuild()  # a fresh function per file: nothing shared to tamper

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return self.rebuild
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise CheckpointError(f"refused: the pickle references {module}.{name}, which no "
                              f"checkpoint needs (a tampered or malicious file?)")

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)
                and type(pid[4]) is int and pid[4] >= 0):
            raise CheckpointError(f"unexpected persistent id {pid!r:.80}")
        _, kind, key, _, numel = pid
        cached = self.storages.get(key)
        if cached is not None:
            if cached.kind != kind.name or cached.data.shape[0] != numel:
                raise CheckpointError(f"storage {key} is used with two different types or sizes")
            return cached
        raw = self.records.get(f"data/{key}")
        dtype = np.dtype(_STORAGE_DTYPES[kind.name])
        if raw is None or len(raw) != numel * dtype.itemsize:
            got = "missing" if raw is None else f"{len(raw)} bytes"
            raise CheckpointError(f"storage data/{key}: {got}, expected {numel} x {dtype.name}")
        data = np.frombuffer(raw, dtype.newbyteorder(">") if self.big_endian else dtype)
        storage = _Storage(kind.name, data.astype(dtype.newbyteorder("=")))
        self.storages[key] = storage
        return storage


def _make_rebuild() -> Callable[..., np.ndarray]:
    def rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any,
                       hooks: Any, metadata: Any = None) -> np.ndarray:
        if not isinstance(storage, _Storage):
            raise CheckpointError("a tensor without a storage")
        if not (isinstance(size, tuple) and isinstance(stride, tuple)
                and len(size) == len(stride)
                and all(type(i) is int and i >= 0 for i in (offset, *size, *stride))):
            raise CheckpointError(f"bad tensor geometry: offset {offset!r}, size {size!r}, "
                                  f"stride {stride!r}")
        if not isinstance(requires_grad, bool) or hooks or metadata:
            raise CheckpointError("tensor carries gradient hooks or metadata; refused")
        numel, available = math.prod(size), storage.data.shape[0]
        last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if numel > available or (numel and last >= available) or offset > available:
            raise CheckpointError(f"tensor of size {size} reaches past its storage ({available})")
        if numel == 0:
            return np.zeros(size, storage.data.dtype)
        item = storage.data.dtype.itemsize
        view = np.lib.stride_tricks.as_strided(
            storage.data[offset:], shape=size, strides=[s * item for s in stride], writeable=False)
        return np.array(view, order="C")

    return rebuild_tensor

