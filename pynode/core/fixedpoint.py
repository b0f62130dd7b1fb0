"""int64 fixed-point gradients: the only form in which numbers cross a peer boundary.

A float32 gradient g becomes q = round_half_even(g * 2**F). Integer sums of q do not depend
on order, topology or transport, so every peer holds the same total. Legend: n = elements.

Why F = 32 by default: the largest gradient seen while training (0.27) then needs 31 bits,
leaving 32 bits of int64 headroom; values below 2**-33 round to zero, finer than the
float32 round-off of the gradients themselves (DESIGN section 3: F = 32..40 all work).

Bound: one converted value must satisfy |q| <= VALUE_BOUND = 2**53, so that any 1024
contributions (microbatches, peers) can be added without wrapping. More contributions, or
partial sums of unknown size, go through `check_headroom` before they are reduced.
"""

from __future__ import annotations

import numpy as np

from pynode.core.errors import DaisyError, FixedPointOverflowError, NonFiniteError, ShapeError

DEFAULT_FRAC_BITS = 32
VALUE_BOUND = 2**53
SAFE_CONTRIBUTIONS = 2**63 // VALUE_BOUND  # 1024 values at the bound still fit in int64
MAX_FRAC_BITS = 62


class FixedPointFormatError(DaisyError, ValueError):
    """A fixed-point format parameter (frac_bits, divisor) that cannot be used."""


def to_fixed(g: np.ndarray, frac_bits: int = DEFAULT_FRAC_BITS) -> np.ndarray:
    """round_half_even(g * 2**frac_bits) as int64, computed exactly.

    g: float32 array of any shape. Raises NonFiniteError for NaN/Inf and
    FixedPointOverflowError if any |result| would exceed VALUE_BOUND; nothing is returned then.
    """
    _check_frac_bits(frac_bits)
    g = np.asarray(g)
    if g.dtype != np.float32:
        raise ShapeError(f"to_fixed takes float32 gradients, got {g.dtype}")
    if not np.isfinite(g).all():
        bad = ~np.isfinite(g)
        first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), g.shape))
        raise NonFiniteError(
            f"{int(bad.sum())} non-finite gradient value(s), first {g[first]} at index {first}"
        )
    # float32 -> float64 is exact and ldexp only moves the exponent, so the product is
    # exact; rint then rounds half to even exactly once.
    scaled = g.astype(np.float64)  # (...) float64, a fresh array: rounded in place
    np.rint(np.ldexp(scaled, frac_bits, out=scaled), out=scaled)
    limit = float(VALUE_BOUND)
    # max and min are exact, so this is |scaled| <= limit everywhere, without a temporary.
    if scaled.size and not (scaled.max() <= limit and scaled.min() >= -limit):
        over = np.abs(scaled) > limit
        worst = float(np.max(np.abs(g.astype(np.float64))))
        raise FixedPointOverflowError(
            f"{int(over.sum())} gradient value(s) exceed the fixed-point bound: "
            f"|g| up to {worst:.6g} but F={frac_bits} allows |g| <= 2**{53 - frac_bits}; "
            f"lower frac_bits or clip the gradient"
        )
    return np.asarray(scaled.astype(np.int64))  # 0-d stays an array, not a numpy scalar


def from_fixed(total: np.ndarray, frac_bits: int, divisor: int) -> np.ndarray:
    """total / (divisor * 2**frac_bits) as float32: the mean gradient of `divisor` microbatches.

    Deterministic on every platform: int64 splits into two halves that float64 holds exactly,
    they are added with one IEEE rounding, scaled exactly, divided with one rounding and
    cast to float32 with one rounding.
    """
    _check_frac_bits(frac_bits)
    if isinstance(divisor, bool) or not isinstance(divisor, int | np.integer) or divisor < 1:
        raise FixedPointFormatError(f"divisor must be a positive integer, got {divisor!r}")
    total = np.asarray(total)
    if total.dtype != np.int64:
        raise ShapeError(f"from_fixed takes an int64 total, got {total.dtype}")
    hi = np.right_shift(total, 32)  # (...) int64 in [-2**31, 2**31)
    lo = np.bitwise_and(total, 0xFFFFFFFF)  # (...) int64 in [0, 2**32)
    whole = np.ldexp(hi.astype(np.float64), 32) + lo.astype(np.float64)  # (...) float64
    mean = np.ldexp(whole, -frac_bits) / np.float64(int(divisor))  # (...) float64
    return np.asarray(mean.astype(np.float32))


def max_abs(q: np.ndarray) -> int:
    """Largest |value| of an int64 array as a Python int (no wrap at -2**63)."""
    q = np.asarray(q)
    if q.dtype != np.int64:
        raise ShapeError(f"max_abs takes int64, got {q.dtype}")
    if q.size == 0:
        return 0
    return max(int(q.max()), -int(q.min()))


def check_headroom(partials_maxabs: int, contributions: int) -> None:
    """Raise FixedPointOverflowError unless `contributions` values of magnitude up to
    `partials_maxabs` can be summed in int64 without wrapping (gloo wraps silently)."""
    if partials_maxabs < 0 or contributions < 0:
        raise FixedPointFormatError(
            f"headroom check needs non-negative numbers, got maxabs={partials_maxabs}, "
            f"contributions={contributions}"
        )
    if int(contributions) * int(partials_maxabs) >= 2**63:
        raise FixedPointOverflowError(
            f"summing {contributions} partials of magnitude up to {partials_maxabs} "
            f"could reach 2**{(int(contributions) * int(partials_maxabs)).bit_length() - 1} "
            f"and wrap int64; lower frac_bits or reduce fewer contributions at once"
        )


def _check_frac_bits(frac_bits: int) -> None:
    if isinstance(frac_bits, bool) or not isinstance(frac_bits, int | np.integer):
        raise FixedPointFormatError(f"frac_bits must be an integer, got {frac_bits!r}")
    if not 0 <= frac_bits <= MAX_FRAC_BITS:
        raise FixedPointFormatError(f"frac_bits must be in 0..{MAX_FRAC_BITS}, got {frac_bits}")
