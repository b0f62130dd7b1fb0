"""numba's forms of the int64 codec (pynode/comm/wire.py), each one pass each way: the
byte planes of zigzag(x), and the bit-packed blocks of pynode/comm/blocks.py's format.

The same bytes as the numpy forms, which wire._native_planes and wire._native_blocks
check on a vector of every magnitude before first use; where numba is missing the numpy
forms serve.
"""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:
    numba = None

if numba is not None:
    jit = numba.njit(cache=True, nogil=True, error_model="numpy")  # as native_kernels

    @jit
    def pack(x, block, widths, out):
        """Fill widths (b,) u8 and out (at least the stream's words + 1) u64 from x (n,)
        int64; returns the stream's word count."""
        n = x.shape[0]
        acc = np.uint64(0)
        fill = 0
        o = 0
        for b in range(widths.shape[0]):
            lo = b * block
            hi = min(n, lo + block)
            top = np.uint64(0)
            for i in range(lo, hi):
                top |= np.uint64((x[i] << 1) ^ (x[i] >> 63))
            w = 0
            while w < 64 and (top >> np.uint64(w)) != 0:
                w += 1
            widths[b] = w
            if w == 0:
                continue
            for i in range(lo, hi):
                z = np.uint64((x[i] << 1) ^ (x[i] >> 63))
                acc |= z << np.uint64(fill)
                fill += w
                if fill >= 64:
                    out[o] = acc
                    o += 1
                    fill -= 64
                    acc = z >> np.uint64(w - fill) if fill > 0 else np.uint64(0)
        if fill > 0:
            out[o] = acc
            o += 1
        return o

    @jit
    def unpack(widths, words, block, out):
        """Fill out (n,) int64 from widths (b,) u8 and the stream `words` (checked by the
        caller: every width <= 64, exactly the stream's length)."""
        n = out.shape[0]
        pos = 0
        for b in range(widths.shape[0]):
            lo = b * block
            hi = min(n, lo + block)
            w = np.int64(widths[b])
            if w == 0:
                for i in range(lo, hi):
                    out[i] = 0
                continue
            mask = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - w)
            for i in range(lo, hi):
                shift = pos & 63
                z = words[pos >> 6] >> np.uint64(shift)
                if shift + w > 64:
                    z |= words[(pos >> 6) + 1] << np.uint64(64 - shift)
                z &= mask
                out[i] = np.int64(z >> np.uint64(1)) ^ -np.int64(z & np.uint64(1))
                pos += w

    # The int64 codec's byte planes (pynode.comm.wire): zigzag and the eight little-endian
    # byte planes in one pass (numpy takes ~0.9 ms a way for 119k values, these ~0.03).
    @jit
    def _zigzag_planes(x, planes):
        for i in range(x.shape[0]):
            v = x[i]
            z = np.uint64((v << 1) ^ (v >> 63))
            for b in range(8):
                planes[b, i] = np.uint8((z >> np.uint64(8 * b)) & np.uint64(0xFF))

    @jit
    def _words_of_planes(planes, out):
        for i in range(out.shape[0]):
            z = np.uint64(0)
            for b in range(8):
                z |= np.uint64(planes[b, i]) << np.uint64(8 * b)
            out[i] = np.int64(z >> np.uint64(1)) ^ -np.int64(z & np.uint64(1))


def zigzag_planes(x: np.ndarray) -> np.ndarray:
    """(8, n) u8: the little-endian byte planes of zigzag(x), x (n,) contiguous int64 (the
    wire codec's; numba must be available)."""
    planes = np.empty((8, x.shape[0]), np.uint8)
    _zigzag_planes(x, planes)
    return planes


def words_of_planes(planes: np.ndarray) -> np.ndarray:
    """(n,) int64: the inverse of zigzag_planes for planes (8, n) u8."""
    out = np.empty(planes.shape[1], np.int64)
    _words_of_planes(planes, out)
    return out
