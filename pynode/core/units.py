"""Verified INT8 units: trained integer networks, their full-domain check, certified LUTs.

The formats, encodings and weight layout are specified in units/SPEC.md. `load_units`
runs every unit network over its complete input domain, refuses any output that differs
from integer arithmetic, builds the lookup tables from the network outputs and certifies
them against the integer operation again. Everything downstream (the GEMM reference, the
gates, the layers) multiplies through those tables.

Legend: R rows of a block, I network inputs, H hidden units, L layers.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from pynode.core.errors import DaisyError, ShapeError, UnitVerificationError

UNIT_NAMES = ("mul8", "requant16", "relu8")
COUNTER_NAMES = ("mul", "requant", "relu")
FORMAT_VERSION = 1
MAGIC = "DaisyChain unit"
# unit -> (encoding name, network input width, domain size); see SPEC section 4.2
ENCODINGS = {
    "mul8": ("nibble-pair-onehot32", 32, 65536),
    "requant16": ("bits16", 16, 65536),
    "relu8": ("bits8", 8, 256),
}
_BOUND_LIMIT = 1 << 62  # int64 headroom every intermediate of a unit network must stay under
_MAX_LAYERS, _MAX_WIDTH, _MAX_FRAC_BITS = 4, 4096, 24
_A_PER_BLOCK = 4  # mul8 block: 4 values of a x 256 of b -> 4096 nibble rows, ~2 MB of int64
_X_PER_BLOCK = 8192  # requant16 block: 8192 inputs x 16 bits, ~1 MB of int64


class UnitCountError(DaisyError):
    """A unit counter was misused, or reports fewer invocations than the work required."""


class UnitCounter:
    """Invocation counts of the three units; there is deliberately no way to switch it off."""

    __slots__ = ("mul", "requant", "relu", "_lock")

    def __init__(self) -> None:
        self.mul = self.requant = self.relu = 0
        self._lock = threading.Lock()  # GEMMs may run in a worker thread (asyncio.to_thread)

    def add(self, name: str, n: int) -> None:
        """Record n invocations of unit `name` ("mul", "requant" or "relu")."""
        if name not in COUNTER_NAMES:
            raise UnitCountError(f"unknown unit counter {name!r}; expected one of {COUNTER_NAMES}")
        if isinstance(n, bool):
            raise UnitCountError(f"unit count must be an integer, got {n!r}")
        try:
            n = operator.index(n)
        except TypeError:
            raise UnitCountError(f"unit count must be an integer, got {n!r}") from None
        if n < 0:
            raise UnitCountError(f"unit count must be >= 0, got {n} for {name!r}")
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        """The current counts as {"mul": ..., "requant": ..., "relu": ...}."""
        with self._lock:
            return {name: getattr(self, name) for name in COUNTER_NAMES}

    def require(self, **minimums: int) -> None:
        """Raise UnitCountError unless each named counter is at least its minimum (>= 1)."""
        if not minimums:
            raise UnitCountError("require() needs at least one counter minimum, e.g. mul=1")
        counts = self.snapshot()
        for name, minimum in minimums.items():
            if name not in counts:
                raise UnitCountError(f"unknown unit counter {name!r}; expected {COUNTER_NAMES}")
            if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 1:
                raise UnitCountError(f"minimum for {name!r} must be an int >= 1, got {minimum!r}")
            if counts[name] < minimum:
                raise UnitCountError(
                    f"unit counter {name} = {counts[name]:,}, but the work done needs at least "
                    f"{minimum:,}: the units were bypassed or counting was disabled; "
                    "refusing to report it"
                )

    def __repr__(self) -> str:
        return f"UnitCounter({self.snapshot()})"


class UnitCheck(NamedTuple):
    """One row of the start-up check, as the CLI prints it."""

    unit: str  # "mul8", "requant16" or "relu8"
    domain: int  # inputs checked: the complete domain
    result: str  # "pass" (a failure raises instead of producing a row)
    seconds: float  # wall time of running the network over the domain


@dataclass(frozen=True, eq=False)
class Units:
    """Lookup tables built from verified unit networks, and the invocation counter.

    Build it with load_units (or pynode.unitfiles.load_default_units), never by hand:
    only then do the tables come from networks checked over their whole domain.
    """

    mul_lut: np.ndarray  # (256, 256) int32, [a + 128, b + 128] = a * b
    requant_lut: np.ndarray  # (65536,) int8, [x + 32768] = sat8((x + 128) >> 8)
    relu_lut: np.ndarray  # (256,) int8, [x + 128] = max(x, 0)
    counts: UnitCounter
    checks: tuple[UnitCheck, ...] = ()

    def verify_report(self) -> list[UnitCheck]:
        """Rows (unit, domain size, result, seconds) of the check that built these tables."""
        return list(self.checks)

    def mul_array(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Elementwise a * b through mul_lut; int8 operands broadcast, int32 result."""
        a, b = _int8_operand(a, "mul_array a"), _int8_operand(b, "mul_array b")
        try:
            rows, cols = np.broadcast_arrays(a.astype(np.intp) + 128, b.astype(np.intp) + 128)
        except ValueError:
            shapes = f"{a.shape} and {b.shape}"
            raise ShapeError(f"mul_array: shapes {shapes} do not broadcast") from None
        out = self.mul_lut[rows, cols]  # (...) int32
        self.counts.add("mul", out.size)
        return out

    def requant_array(self, x: np.ndarray) -> np.ndarray:
        """Elementwise sat8((x + 128) >> 8) through requant_lut; int16 in, int8 out."""
        x = _typed_operand(x, np.int16, "requant_array")
        out = self.requant_lut[x.astype(np.intp) + 32768]  # (...) int8
        self.counts.add("requant", out.size)
        return out

    def relu_array(self, x: np.ndarray) -> np.ndarray:
        """Elementwise max(x, 0) through relu_lut; int8 in, int8 out."""
        x = _int8_operand(x, "relu_array")
        out = self.relu_lut[x.astype(np.intp) + 128]  # (...) int8
        self.counts.add("relu", out.size)
        return out


def _typed_operand(x: object, dtype: type, what: str) -> np.ndarray:
    if not isinstance(x, (np.ndarray, np.generic)) or x.dtype != dtype:
        got = x.dtype if isinstance(x, (np.ndarray, np.generic)) else type(x).__name__
        raise ShapeError(f"{what}: expected {np.dtype(dtype).name} values, got {got}")
    return np.asarray(x)


def _int8_operand(x: object, what: str) -> np.ndarray:
    return _typed_operand(x, np.int8, what)


# ---- the integer operations the networks must reproduce (SPEC section 3) ----


def _native_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.int32) * b.astype(np.int32)


def _native_requant(x: np.ndarray) -> np.ndarray:
    return np.clip((x.astype(np.int32) + 128) >> 8, -128, 127).astype(np.int8)


def _native_relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0).astype(np.int8)


# ---- the integer MLP (SPEC section 4.1) ----


@dataclass(frozen=True)
class UnitNetwork:
    """A parsed, bounds-checked unit network; its forward pass is exact int64 arithmetic."""

    unit: str
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]  # ((I, H) int64, (H,) int64), ...
    shift: int  # S: total fractional bits of the output

    def output_logits(self, first: np.ndarray) -> np.ndarray:
        """Run layers 1.. on the first layer's pre-activations (R, H) int64; (R,) int64 out."""
        z = first
        for w, b in self.layers[1:]:
            z = np.maximum(z, 0) @ w + b  # (R, H') int64, exact (bounded below 2**62)
        return z[:, 0]

    def decode(self, z: np.ndarray) -> np.ndarray:
        """Round z / 2**S to the nearest integer (ties up; a verified net never ties)."""
        if self.shift == 0:
            return z
        return (z + (1 << (self.shift - 1))) >> self.shift

    def bits_logits(self, x: np.ndarray, width: int) -> np.ndarray:
        """Logits for inputs x (R,) int64 fed as `width` two's-complement bits."""
        bits = (x[:, None] >> np.arange(width, dtype=np.int64)) & 1  # (R, width) int64, 0/1
        w0, b0 = self.layers[0]
        return self.output_logits(bits @ w0 + b0)

    def nibble_logits(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Logits for nibble pairs x, y (R,) int64 in 0..15, one-hot encoded (a row lookup)."""
        w0, b0 = self.layers[0]
        return self.output_logits(w0[x] + w0[16 + y] + b0)


def _scalar_str(arrays: Mapping[str, np.ndarray], key: str, unit: str) -> str:
    value = np.asarray(arrays[key])
    if value.dtype.kind != "U" or value.ndim != 0:
        raise UnitVerificationError(f"{unit}: malformed weights: {key!r} must be a string")
    return str(value[()])


def _int_array(arrays: Mapping[str, np.ndarray], key: str, ndim: int, unit: str) -> np.ndarray:
    if key not in arrays:
        raise UnitVerificationError(f"{unit}: malformed weights: array {key!r} is missing")
    value = np.asarray(arrays[key])
    if value.dtype.kind != "i" or value.ndim != ndim or value.size == 0:
        raise UnitVerificationError(
            f"{unit}: malformed weights: {key!r} must be a non-empty {ndim}-D signed integer "
            f"array, got {value.dtype} {value.shape}"
        )
    return value.astype(np.int64)


def parse_network(unit: str, arrays: Mapping[str, np.ndarray]) -> UnitNetwork:
    """Validate the arrays of one weight file (SPEC 4.3) and bound every intermediate."""
    if unit not in ENCODINGS:
        raise UnitVerificationError(f"unknown unit {unit!r}; expected one of {UNIT_NAMES}")
    encoding, width, _ = ENCODINGS[unit]
    for key in ("magic", "format_version", "unit", "encoding", "frac_bits"):
        if key not in arrays:
            raise UnitVerificationError(f"{unit}: malformed weights: array {key!r} is missing")
    header = {k: _scalar_str(arrays, k, unit) for k in ("magic", "unit", "encoding")}
    if header != {"magic": MAGIC, "unit": unit, "encoding": encoding}:
        raise UnitVerificationError(
            f"{unit}: weights are for {header}, expected magic {MAGIC!r}, unit {unit!r}, "
            f"encoding {encoding!r}"
        )
    version = _int_array(arrays, "format_version", 0, unit)
    if int(version) != FORMAT_VERSION:
        raise UnitVerificationError(
            f"{unit}: weight format version {int(version)}, this pynode reads {FORMAT_VERSION}"
        )
    frac = [int(f) for f in _int_array(arrays, "frac_bits", 1, unit)]
    if len(frac) > _MAX_LAYERS or not all(0 <= f <= _MAX_FRAC_BITS for f in frac):
        raise UnitVerificationError(f"{unit}: malformed weights: frac_bits {frac} out of range")
    if f"w{len(frac)}" in arrays:
        raise UnitVerificationError(f"{unit}: malformed weights: more layers than frac_bits")
    layers, bound, fan_in = [], 1, width  # inputs are 0/1
    for index in range(len(frac)):
        w = _int_array(arrays, f"w{index}", 2, unit)
        b = _int_array(arrays, f"b{index}", 1, unit)
        fan_out = 1 if index == len(frac) - 1 else b.shape[0]
        if w.shape != (fan_in, fan_out) or b.shape != (fan_out,) or fan_out > _MAX_WIDTH:
            raise UnitVerificationError(
                f"{unit}: malformed weights: layer {index} has w {w.shape}, b {b.shape}; "
                f"expected ({fan_in}, {fan_out}) and ({fan_out},)"
            )
        if max(-int(w.min()), int(w.max()), -int(b.min()), int(b.max())) >= 1 << 40:
            raise UnitVerificationError(f"{unit}: layer {index} weights exceed 2**40")
        bound = int(np.abs(w).sum(axis=0).max()) * bound + int(np.abs(b).max())
        if bound >= _BOUND_LIMIT:
            raise UnitVerificationError(f"{unit}: layer {index} could overflow int64")
        layers.append((w, b))
        fan_in = fan_out
    return UnitNetwork(unit, tuple(layers), sum(frac))


# ---- full-domain runs: network outputs == integer op, first mismatch named ----


def _refuse_mismatch(
    unit: str, got: np.ndarray, want: np.ndarray, names: str, *inputs: np.ndarray
) -> None:
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = bad[0]
        where = ", ".join(f"{n}={int(v[i])}" for n, v in zip(names.split(","), inputs, strict=True))
        raise UnitVerificationError(
            f"{unit}: network output differs from integer arithmetic at {where}: "
            f"network gives {int(got[i])}, integer op gives {int(want[i])} "
            f"({bad.size} wrong in this block); refusing to train"
        )


def _worst(net: UnitNetwork, z: np.ndarray, y: np.ndarray) -> int:
    return int(np.abs(z - (y << net.shift)).max())


def _mul_domain(net: UnitNetwork) -> tuple[np.ndarray, int]:
    lut, worst = np.empty((256, 256), np.int32), 0  # (256, 256) int32
    for a0 in range(-128, 128, _A_PER_BLOCK):
        a = np.repeat(np.arange(a0, a0 + _A_PER_BLOCK, dtype=np.int64), 256)  # (R,) int64
        b = np.tile(np.arange(-128, 128, dtype=np.int64), _A_PER_BLOCK)  # (R,) int64
        ma, mb = np.abs(a), np.abs(b)
        x = np.concatenate([ma >> 4, ma >> 4, ma & 15, ma & 15])  # (4R,) nibbles of |a|
        y = np.concatenate([mb >> 4, mb & 15, mb >> 4, mb & 15])  # (4R,) nibbles of |b|
        z = net.nibble_logits(x, y)  # (4R,) int64
        n = net.decode(z)
        worst = max(worst, _worst(net, z, n))
        hh, hl, lh, ll = n.reshape(4, -1)
        p = (hh << 8) + ((hl + lh) << 4) + ll  # (R,) |a * b|
        got = np.where((a < 0) != (b < 0), -p, p)
        _refuse_mismatch("mul8", got, _native_mul(a, b), "a,b", a, b)
        lut[a0 + 128 : a0 + 128 + _A_PER_BLOCK] = got.reshape(_A_PER_BLOCK, 256)
    return lut, worst


def _requant_domain(net: UnitNetwork) -> tuple[np.ndarray, int]:
    lut, worst = np.empty(65536, np.int8), 0  # (65536,) int8
    for x0 in range(-32768, 32768, _X_PER_BLOCK):
        x = np.arange(x0, x0 + _X_PER_BLOCK, dtype=np.int64)  # (R,) int64
        z = net.bits_logits(x, 16)
        got = net.decode(z)
        worst = max(worst, _worst(net, z, got))
        _refuse_mismatch("requant16", got, _native_requant(x), "x", x)
        lut[x0 + 32768 : x0 + 32768 + _X_PER_BLOCK] = got
    return lut, worst


def _relu_domain(net: UnitNetwork) -> tuple[np.ndarray, int]:
    x = np.arange(-128, 128, dtype=np.int64)  # (256,) int64
    z = net.bits_logits(x, 8)
    got = net.decode(z)
    _refuse_mismatch("relu8", got, _native_relu(x), "x", x)
    return got.astype(np.int8), _worst(net, z, got)


_DOMAIN_RUNS = {"mul8": _mul_domain, "requant16": _requant_domain, "relu8": _relu_domain}


def run_unit(unit: str, arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, float]:
    """Run one unit network over its full domain; return its table and its margin.

    Raises UnitVerificationError naming the first input where the network is wrong. The
    margin is 0.5 minus the largest distance of a real output from its integer answer.
    """
    net = parse_network(unit, arrays)
    table, worst = _DOMAIN_RUNS[unit](net)
    return table, 0.5 - worst / (1 << net.shift)


def load_units(weights: Mapping[str, Mapping[str, np.ndarray]]) -> Units:
    """Verify every unit network over its complete domain and build certified LUTs from it.

    weights: {"mul8": arrays, "requant16": arrays, "relu8": arrays}, arrays as in
    units/SPEC.md section 4.3. Raises UnitVerificationError (naming the unit and the first
    wrong input) if any network output differs from integer arithmetic.
    """
    if not isinstance(weights, Mapping):
        raise UnitVerificationError(f"unit weights must be a mapping, got {type(weights).__name__}")
    missing = [u for u in UNIT_NAMES if u not in weights]
    if missing:
        raise UnitVerificationError(f"unit weights missing for {missing}")
    tables, checks = {}, []
    for unit in UNIT_NAMES:
        started = time.perf_counter()
        tables[unit], _ = run_unit(unit, weights[unit])
        tables[unit].setflags(write=False)
        seconds = time.perf_counter() - started
        checks.append(UnitCheck(unit, ENCODINGS[unit][2], "pass", seconds))
    units = Units(tables["mul8"], tables["requant16"], tables["relu8"], UnitCounter(),
                  tuple(checks))
    certify_luts(units)
    return units


def _certify(name: str, lut: object, dtype: type, shape: tuple, want: np.ndarray,
             describe: Callable[[int], str]) -> None:
    if not isinstance(lut, np.ndarray) or lut.dtype != dtype or lut.shape != shape:
        got = f"{lut.dtype} {lut.shape}" if isinstance(lut, np.ndarray) else type(lut).__name__
        raise UnitVerificationError(f"{name} must be {np.dtype(dtype).name} {shape}, got {got}")
    bad = np.flatnonzero(lut.reshape(-1) != want.reshape(-1))
    if bad.size:
        i = int(bad[0])
        raise UnitVerificationError(
            f"{name}[{describe(i)}] = {int(lut.reshape(-1)[i])}, integer op gives "
            f"{int(want.reshape(-1)[i])} ({bad.size} cells wrong); the table is corrupted"
        )


def certify_luts(units: Units) -> None:
    """Re-check every cell of the three LUTs against integer arithmetic; raise on any."""
    v8 = np.arange(-128, 128, dtype=np.int64)  # (256,)
    v16 = np.arange(-32768, 32768, dtype=np.int64)  # (65536,)
    _certify("mul_lut", units.mul_lut, np.int32, (256, 256), _native_mul(v8[:, None], v8),
             lambda i: f"a={i // 256 - 128}, b={i % 256 - 128}")
    _certify("requant_lut", units.requant_lut, np.int8, (65536,), _native_requant(v16),
             lambda i: f"x={i - 32768}")
    _certify("relu_lut", units.relu_lut, np.int8, (256,), _native_relu(v8),
             lambda i: f"x={i - 128}")
