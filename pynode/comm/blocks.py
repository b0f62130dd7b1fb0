"""Bit-packed blocks: the int64 codec's form for peers of one machine (wire.pack_int64's
`local`), where deflate's time is not repaid by a network.

Format (after wire's leading code byte): zigzag(x) (small magnitudes of either sign become
small unsigned words) in blocks of BLOCK values, the last one short. Each block has one
width w in 0..64, the bits of its largest word; then one bit stream holds every value's
w low bits in index order, value after value with no padding, bit k of the stream being
bit k % 64 of little-endian u64 word k // 64 (the last word zero-filled). So the body is
the widths (one byte a block), then ceil(sum of w x block length / 64) words.

A fixed-point gradient's magnitudes change slowly along the parameters, so a block's width
is close to each value's own: 2.6x fewer bytes than raw int64 for a default per-step
gradient, where the byte planes with deflate give 2.6x and without the deflate of the
noisy third plane 2.5x, for ~0.25 ms to pack and ~0.2 to unpack instead of ~0.7 and ~0.4
(numba, pynode/native_codec.py). This module is the numpy form, which every runtime
reads; native peers check numba's against it before first use (wire._native_blocks).

Legend: n values, b blocks; u64 unsigned 64-bit words.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32  # values a block (its width is one byte of overhead: 1 / 32 byte a value)
_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


def zigzag(x: np.ndarray) -> np.ndarray:
    """(n,) u64: x (n,) int64 with the sign moved to bit 0 (0, -1, 1, -2 -> 0, 1, 2, 3)."""
    return ((x << 1) ^ (x >> 63)).view(np.uint64)


def unzigzag(z: np.ndarray) -> np.ndarray:
    """(n,) int64: the inverse of zigzag."""
    sign = np.uint64(0) - (z & np.uint64(1))  # 0 or all ones
    return ((z >> np.uint64(1)) ^ sign).view(np.int64)


def bit_lengths(words: np.ndarray) -> np.ndarray:
    """(...) u8: the number of bits of each u64 word (0 for 0, 64 from 2**63)."""
    rest = words.copy()
    bits = np.zeros(words.shape, np.uint8)
    for step in (32, 16, 8, 4, 2, 1):
        wide = rest >= (np.uint64(1) << np.uint64(step))
        bits[wide] += step
        rest[wide] >>= np.uint64(step)
    bits += (rest > 0).astype(np.uint8)
    return bits


def block_widths(z: np.ndarray) -> np.ndarray:
    """(b,) u8: the width of each block of z (n,) u64."""
    n = z.shape[0]
    padded = np.zeros(-(-n // BLOCK) * BLOCK, np.uint64)
    padded[:n] = z
    return bit_lengths(np.bitwise_or.reduce(padded.reshape(-1, BLOCK), axis=1))


def stream_words(widths: np.ndarray, n: int) -> int:
    """How many u64 words the bit stream of `n` values with block `widths` (b,) takes."""
    lengths = np.full(widths.shape[0], BLOCK, np.int64)
    if lengths.size:
        lengths[-1] = n - BLOCK * (widths.shape[0] - 1)
    return -(-int(np.dot(widths.astype(np.int64), lengths)) // 64)


def positions(widths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """((n,) int64 width, (n,) int64 first stream bit) of each value."""
    each = np.repeat(widths.astype(np.int64), BLOCK)[:n]
    start = np.zeros(n, np.int64)
    np.cumsum(each[:-1], out=start[1:])
    return each, start


def pack(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((b,) u8 widths, (words,) u64 stream) of x (n,) contiguous int64."""
    z = zigzag(x)
    widths = block_widths(z)
    n = x.shape[0]
    words = np.zeros(stream_words(widths, n) + 1, np.uint64)  # one spare for the spill
    each, start = positions(widths, n)
    word, shift = start >> 6, (start & 63).astype(np.uint64)
    np.bitwise_or.at(words, word, z << shift)  # the bits that land in the first word
    spill = shift.astype(np.int64) + each > 64  # and those that cross into the next
    np.bitwise_or.at(words, word[spill] + 1, z[spill] >> (np.uint64(64) - shift[spill]))
    return widths, words[:-1]


def unpack(widths: np.ndarray, words: np.ndarray, n: int) -> np.ndarray:
    """(n,) int64 from block `widths` (b,) u8 and the stream `words` (exactly
    stream_words(widths, n) u64; the caller checks that and every width <= 64)."""
    each, start = positions(widths, n)
    padded = np.zeros(words.shape[0] + 2, np.uint64)  # a word past any value's last bit
    padded[: words.shape[0]] = words
    word, shift = start >> 6, (start & 63).astype(np.uint64)
    low = padded[word] >> shift
    high = np.where(shift == 0, np.uint64(0),
                    padded[word + 1] << ((np.uint64(64) - shift) & np.uint64(63)))
    mask = np.where(each == 64, _ONES,
                    (np.uint64(1) << (each & 63).astype(np.uint64)) - np.uint64(1))
    return unzigzag((low | high) & mask)
