"""Counter-based random numbers: Philox4x32-10 on uint64 numpy arrays (DESIGN section 2).

Every output is a pure function of (key, position), so a peer can draw any slice of
any stream without drawing the rest, and every platform gets the same bits: the
generator uses only 32x32->64-bit products, shifts, xor and masks on uint64 arrays,
which are exact on x86-64 and on numpy for wasm32 alike. numpy's Generator is never
used (its normal sampler calls libm).

A key is a tuple of non-negative ints, e.g. (seed, step, microbatch, layer, purpose).
BLAKE2b of its canonical encoding gives the 64-bit Philox key and the upper 64 bits
of the 128-bit counter; the lower 64 bits count blocks. Distinct keys therefore give
independent streams, and (1, 2) differs from (1, 2, 0).

Stream layout (fixed; golden values in tests/core/test_rng.py): block b of a key
yields four 32-bit words w[4b], ..., w[4b+3] in Random123's output order.
bits64 element i is w[2i] << 32 | w[2i+1]. uniform reads w[i]; normal, randint and
permutation read bits64. Each draw starts at the stream's beginning, so give each use
of randomness its own purpose element in the key.

The hot draw, `uniform16` (stochastic rounding, millions of values a step), runs at C
speed on numpy's own Philox4x64-10 bit generator, whose raw words are defined by the
algorithm: block b of a key is philox4x64((b + 1, 0, c2, c3), (k0, k1)) with k0, k1, c2,
c3 from a BLAKE2b of the key (personalised apart from the 4x32 streams), its four 64-bit
words in order, and word j holds draws 4j .. 4j+3 as its 16-bit lanes, lowest first.
`philox4x64` below is the oracle; `check_bit_generator` compares the two at start-up.

Legend: (n,) flat; u64 uint64 holding 32-bit values unless noted.
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Sequence

import numpy as np

from . import detmath
from .errors import DaisyError

_M32 = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # round multipliers
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # key schedule increments (Weyl)
_PHILOX_ROUNDS = 10
_KEY_PERSON = b"daisychain.rng1"  # BLAKE2b personalisation: the key-derivation version
_KEY_PERSON_64 = b"daisychain.rng64"  # the same for the Philox4x64 streams
_PHILOX64_M = (0xD2E7470EE14C6C93, 0xCA5A826395121157)  # 4x64 round multipliers
_PHILOX64_W = (0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B)  # 4x64 key schedule increments
_M64 = 2**64 - 1
_CHUNK_BLOCKS = 16384  # blocks per Philox pass: the round temporaries stay in cache (2x faster)
_TWO_M24 = np.float32(2.0**-24)
_TWO_M16 = np.float32(2.0**-16)
_TWO_M53 = 2.0**-53


class RngArgumentError(DaisyError, ValueError):
    """A key, shape, bound or offset the generator cannot use."""


def _key_words(key: Sequence[int]) -> tuple[int, int, int, int]:
    """(philox k0, k1, counter c2, c3) from BLAKE2b of the key's canonical encoding."""
    encoded = _canonical_key(key)
    digest = hashlib.blake2b(bytes(encoded), digest_size=16, person=_KEY_PERSON).digest()
    w = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    return w[0], w[1], w[2], w[3]


def _canonical_key(key: Sequence[int]) -> bytes:
    if not isinstance(key, (tuple, list)):
        raise RngArgumentError(f"an rng key is a tuple of ints >= 0, got {key!r}")
    encoded = bytearray(len(key).to_bytes(8, "little"))
    for part in key:
        if isinstance(part, (bool, np.bool_)):
            raise RngArgumentError(f"rng key parts are ints, got a bool in {key!r}")
        try:
            value = operator.index(part)
        except TypeError:
            raise RngArgumentError(f"rng key parts are ints, got {part!r} in {key!r}") from None
        if value < 0:
            raise RngArgumentError(f"rng key parts are >= 0, got {value} in {key!r}")
        raw = value.to_bytes((value.bit_length() + 7) // 8, "little")
        encoded += len(raw).to_bytes(8, "little") + raw
    return bytes(encoded)


def philox4x32(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """The Philox4x32-10 bijection of Salmon et al. (SC'11), column by column.

    counter: (4, n) uint64 holding 32-bit words; key: two 32-bit ints.
    Returns (4, n) uint64 holding 32-bit words. Matches Random123's known-answer tests.
    """
    counter = np.asarray(counter)
    k0, k1 = key
    if counter.dtype != np.uint64 or counter.ndim != 2 or counter.shape[0] != 4:
        raise RngArgumentError(f"counter: need (4, n) uint64, got {counter.dtype} {counter.shape}")
    if np.any(counter >> np.uint64(32)) or not (0 <= k0 <= _M32 and 0 <= k1 <= _M32):
        raise RngArgumentError("philox4x32 counter and key words must be below 2**32")
    c0, c1, c2, c3 = counter
    with np.errstate(over="ignore"):
        for rnd in range(_PHILOX_ROUNDS):
            if rnd:
                k0, k1 = (k0 + _PHILOX_W[0]) & _M32, (k1 + _PHILOX_W[1]) & _M32
            p0 = c0 * np.uint64(_PHILOX_M[0])  # exact: both factors < 2**32
            p1 = c2 * np.uint64(_PHILOX_M[1])
            c0, c1, c2, c3 = (
                (p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0),
                p1 & np.uint64(_M32),
                (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1),
                p0 & np.uint64(_M32),
            )
    return np.stack([c0, c1, c2, c3])


def philox4x64(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """The Philox4x64-10 bijection from 32-bit limbs: the oracle of numpy's Philox.

    counter: (4, n) uint64; key: two 64-bit ints. Returns (4, n) uint64. Slow (every
    64x64-bit product is four 32x32-bit ones) and exact; matches Random123's known answers.
    """
    counter = np.asarray(counter)
    k0, k1 = key
    if counter.dtype != np.uint64 or counter.ndim != 2 or counter.shape[0] != 4:
        raise RngArgumentError(f"counter: need (4, n) uint64, got {counter.dtype} {counter.shape}")
    if not (0 <= k0 <= _M64 and 0 <= k1 <= _M64):
        raise RngArgumentError("philox4x64 key words must be below 2**64")
    c0, c1, c2, c3 = counter
    m0, m1 = (np.uint64(m) for m in _PHILOX64_M)
    with np.errstate(over="ignore"):
        for rnd in range(_PHILOX_ROUNDS):
            if rnd:
                k0, k1 = (k0 + _PHILOX64_W[0]) & _M64, (k1 + _PHILOX64_W[1]) & _M64
            hi0, lo0 = _mulhi64(c0, _PHILOX64_M[0]), c0 * m0  # wrapping product: low word
            hi1, lo1 = _mulhi64(c2, _PHILOX64_M[1]), c2 * m1
            c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
    return np.stack([c0, c1, c2, c3])


def key_words64(key: Sequence[int]) -> tuple[list[int], list[int]]:
    """([k0, k1], [0, 0, c2, c3]) of numpy's Philox for a key, from BLAKE2b."""
    digest = hashlib.blake2b(_canonical_key(key), digest_size=32, person=_KEY_PERSON_64).digest()
    w = [int.from_bytes(digest[i : i + 8], "little") for i in range(0, 32, 8)]
    return w[:2], [0, 0, w[2], w[3]]


def raw64(key: Sequence[int], n: int) -> np.ndarray:
    """The first n 64-bit words of the key's Philox4x64 stream, (n,) uint64, at C speed."""
    k, c = key_words64(key)
    # uint64 arrays: numpy would read a list of large ints as float64 and round them.
    bit_generator = np.random.Philox(key=np.array(k, np.uint64), counter=np.array(c, np.uint64))
    return bit_generator.random_raw(n)


def raw64_reference(key: Sequence[int], n: int) -> np.ndarray:
    """`raw64` computed by `philox4x64` (the oracle); same bits, much slower."""
    k, c = key_words64(key)
    blocks = (n + 3) // 4
    index = np.arange(1, blocks + 1, dtype=np.uint64)  # numpy counts before its first block
    counter = np.stack([index, np.zeros_like(index), np.full_like(index, c[2]),
                        np.full_like(index, c[3])])
    return philox4x64(counter, (k[0], k[1])).T.reshape(-1)[:n]


def uniform16(key: Sequence[int], shape: int | Sequence[int]) -> np.ndarray:
    """float32 in [0, 1): multiples of 2**-16, each equally likely; 16 random bits a value."""
    dims, n = _count(shape)
    lanes = raw64(key, (n + 3) // 4).astype("<u8", copy=False).view("<u2")[:n]  # (n,) u16
    return (lanes * _TWO_M16).reshape(dims)


def check_bit_generator() -> None:
    """Refuse to train if numpy's Philox4x64 differs from `philox4x64` on a few blocks.

    The fast draws trust numpy's C generator; this ties it to the oracle on this runtime.
    """
    key = (0x5EED, 2**40 + 3, 7)
    if not np.array_equal(raw64(key, 64), raw64_reference(key, 64)):
        raise RngArgumentError(
            "numpy's Philox bit generator differs from pynode's Philox4x64 on this runtime; "
            "stochastic rounding would fork from other peers"
        )


def _words(key: Sequence[int], start: int, count: int) -> np.ndarray:
    """Words w[start : start + count] of the key's stream, (count,) u64."""
    k0, k1, c2, c3 = _key_words(key)
    first, last = start // 4, (start + count + 3) // 4
    blocks = np.empty((last - first, 4), np.uint64)  # (blocks, 4) u64, stream order
    for lo in range(first, last, _CHUNK_BLOCKS):
        index = np.arange(min(_CHUNK_BLOCKS, last - lo), dtype=np.uint64) + np.uint64(lo)
        counter = np.stack([
            index & np.uint64(_M32),
            index >> np.uint64(32),
            np.full_like(index, c2),
            np.full_like(index, c3),
        ])
        blocks[lo - first : lo - first + index.size] = philox4x32(counter, (k0, k1)).T
    skip = start - 4 * first
    return blocks.reshape(-1)[skip : skip + count]


def _count(shape: int | Sequence[int]) -> tuple[tuple[int, ...], int]:
    try:
        dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dims = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise RngArgumentError(f"a shape is an int or a tuple of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise RngArgumentError(f"negative dimension in shape {shape!r}")
    return dims, math.prod(dims)


def bits64(key: Sequence[int], n: int, offset: int = 0) -> np.ndarray:
    """Elements offset .. offset+n-1 of the key's 64-bit stream, (n,) uint64."""
    n, offset = operator.index(n), operator.index(offset)
    if n < 0 or offset < 0 or offset + n > 2**64:
        raise RngArgumentError(f"need n >= 0, offset >= 0, offset + n <= 2**64; got {n}, {offset}")
    w = _words(key, 2 * offset, 2 * n).reshape(n, 2)  # (n, 2) u64
    return (w[:, 0] << np.uint64(32)) | w[:, 1]


def uniform(key: Sequence[int], shape: int | Sequence[int]) -> np.ndarray:
    """float32 in [0, 1): multiples of 2**-24, each value equally likely."""
    dims, n = _count(shape)
    top24 = (_words(key, 0, n) >> np.uint64(8)).astype(np.float32)  # exact: < 2**24
    return (top24 * _TWO_M24).reshape(dims)


def normal(key: Sequence[int], shape: int | Sequence[int]) -> np.ndarray:
    """Standard normal float32 by Box-Muller on detmath's log, sqrt, cospi and sinpi.

    Radius from 53 random bits (tails reach 8.57 sigma), angle from 53 more; each pair of
    bits64 elements gives two samples. Evaluated in float64, rounded once.
    """
    dims, n = _count(shape)
    pairs = (n + 1) // 2
    u = bits64(key, 2 * pairs).reshape(pairs, 2) >> np.uint64(11)  # (pairs, 2) u64 < 2**53
    radius_u = (u[:, 0] + np.uint64(1)).astype(np.float64) * _TWO_M53  # (0, 1], exact
    turns = u[:, 1].astype(np.float64) * _TWO_M53  # [0, 1), exact
    radius = detmath.sqrt(-2.0 * detmath.log(radius_u))
    sin, cos = detmath.sincospi(2.0 * turns)
    z = np.empty((pairs, 2), np.float64)
    z[:, 0] = radius * cos
    z[:, 1] = radius * sin
    return z.reshape(-1)[:n].astype(np.float32).reshape(dims)


def _mulhi64(x: np.ndarray, high: int) -> np.ndarray:
    """floor(x * high / 2**64) exactly, from 32-bit limbs; x (n,) uint64 (full 64 bits)."""
    m32, s32 = np.uint64(_M32), np.uint64(32)
    xh, xl = x >> s32, x & m32
    hh, hl = np.uint64(high >> 32), np.uint64(high & _M32)
    with np.errstate(over="ignore"):
        mid1 = xh * hl + ((xl * hl) >> s32)  # < 2**64: no carry lost
        mid2 = xl * hh + (mid1 & m32)
        return xh * hh + (mid1 >> s32) + (mid2 >> s32)


def randint(key: Sequence[int], shape: int | Sequence[int], high: int) -> np.ndarray:
    """int64 in [0, high) by Lemire's multiply-shift on 64 random bits.

    No rejection, so each value's probability is within high / 2**64 (relative) of
    1/high: below 2**-32 for high <= 2**32, and exactly uniform when high is a power of 2.
    """
    dims, n = _count(shape)
    high = operator.index(high)
    if not 1 <= high <= 2**63:
        raise RngArgumentError(f"randint needs 1 <= high <= 2**63, got {high}")
    return _mulhi64(bits64(key, n), high).astype(np.int64).reshape(dims)


def permutation(key: Sequence[int], n: int) -> np.ndarray:
    """A uniformly random permutation of 0..n-1, (n,) int64: indices sorted by bits64.

    The sort is stable, so even a (2**-64-likely) tie has one answer.
    """
    n = operator.index(n)
    if n < 0:
        raise RngArgumentError(f"permutation length must be >= 0, got {n}")
    return np.argsort(bits64(key, n), kind="stable").astype(np.int64)
