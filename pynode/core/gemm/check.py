"""Freivalds' check of every GEMM result: C == A @ B, exactly, in O(MK + KN + MN).

The start-up gate proves a backend on fixed shapes and the audit re-computes a few cells;
this check covers every cell of every call. For C (M, N) from A (M, K) and B (K, N) it takes
V random vectors r of integers in [0, 2**bits) from the project RNG (stream CHECK_PURPOSE,
at a position fixed by the calls before it) and compares A @ (B @ r) with C @ r. If C is wrong
anywhere, some row d of A @ B - C is nonzero; with every entry of r but one (at a nonzero
place of d) fixed, d . r == 0 for at most one value of that entry, so a wrong result passes
with probability at most 2**-(bits * V). Entries take min(entry_bits, SECURITY_BITS) bits
and V is the fewest vectors with bits * V >= SECURITY_BITS (one vector of 20-bit entries
for every shape of the default model: one width of lanes to fill per block of calls).

The arithmetic is exact whatever the order of summation (Kernels.product_holds: numpy's
matmul, or a fused numba loop). numpy: A @ (B @ r) is float64, whose partial sums stay
integers below 2**53: |a|, |b| <= 2**7, so they stay below 2**(14 + bits) * K * N; C @ r
is float64 too once C is checked to lie within the exact product's bound 2**14 * K.
numba: each row's a_i . (B @ r) - c_i . r is one wrapping int64 sum, exact mod 2**64; its
true value is -(D @ r)_i, below 2**(32 + bits) * N <= 2**64 in magnitude for any int32 C,
so it is 0 mod 2**64 only when it is 0 (no pass for the bound, no float conversions).
`bits` is chosen per shape for both. Shapes too large for float64 fall back to wrapping
uint64 arithmetic: mod 2**64 the same identity holds, and a wrong cell (|d| < 2**32)
passes with probability <= 2**-32.

Natively the model's products take the same identity in the kernels' own passes
(`fused_vectors`, Gemm.scaled): B @ r and A @ (B @ r) are summed as B and A are quantized
(Kernels.quantize_dots), and each row of C times r as the epilogue converts C
(Kernels.epilogue_checked), one vector of SECURITY_BITS-bit entries in wrapping int64 as
in native_check; nothing is read again for the check. `holds` serves every other caller.

Legend: B batch, M rows, K reduction length, N columns, V random vectors.
"""

from __future__ import annotations

import time

import numpy as np

from pynode.core.kernels import REFERENCE, Kernels

CHECK_PURPOSE = 0xF4E1
SECURITY_BITS = 20  # a wrong product passes its call's check with probability <= 2**-20
LANE_BITS = 32  # bits of one rng lane; an entry takes the top `bits` of its lane
# random bits per vector entry, at most: entries fit int32, and out @ r stays exact in
# int64 for any int32 `out` when bits + log2(N) <= 32 (the numba kernel's integer side)
MAX_BITS = 31
DRAW_BLOCK = 64  # calls whose vectors one rng call draws (an rng call costs ~10 us)
# 32-bit lanes a call takes from such a block: N * V up to this (every product of the
# default model); a wider product draws its own. Drawing 4096 lanes a call made the draws
# a quarter of the check's time.
DRAW_LANES = 256
FUSED_LANES = 1 << 14  # lanes of one draw for fused_vectors (a default step takes ~16,000)


def _log2_ceil(x: int) -> int:
    return max(0, int(x - 1).bit_length())


def entry_bits(k: int, n: int) -> int:
    """Random bits per entry of R that keep the float64 products exact for K, N (0: none)."""
    return max(0, min(MAX_BITS, 53 - 14 - _log2_ceil(k) - _log2_ceil(n), 32 - _log2_ceil(n)))


class ProductCheck:
    """Checks every product it is shown; counts calls and failures."""

    def __init__(self, kernels: Kernels = REFERENCE, seed: int = 0) -> None:
        self.kernels = kernels  # its gated product_holds does the arithmetic
        self.seed = seed
        self.calls = 0  # products checked, both ways
        self._held = 0  # of them by `holds`: its position in the blocks below
        self.failures = 0
        self.seconds = 0.0  # spent checking
        self._block = -1  # which block of calls the views below serve
        self._pool = np.empty((DRAW_BLOCK, DRAW_LANES), np.uint32)
        self._shifted = np.empty((DRAW_BLOCK, DRAW_LANES), np.uint32)
        # The block's lanes as `holds` takes them, each width refilled in place the first
        # time a block uses it (natively only the probe's one product a step does):
        self._scaled: dict[int, np.ndarray] = {}  # bits -> the block's lanes, float64
        self._fresh: set[int] = set()  # the widths of _scaled filled for this block
        # fused_vectors' own stream, taken N lanes a call: SECURITY_BITS-bit int64 entries
        self._fused = np.empty(0, np.int64)
        self._cursor = FUSED_LANES  # the next lane of _fused to hand out (none drawn yet)
        self._fused_draws = 0  # draws of that stream so far
        # (K, N) -> (every block's R for each call, (DRAW_BLOCK, V, N) views of
        # self._scaled, their bits); False: that shape draws its own (too wide) or is
        # checked mod 2**64 (too large)
        self._views: dict[tuple[int, int], tuple[np.ndarray, int] | bool] = {}

    def vectors(self, call: int, n: int, bits: int) -> np.ndarray:
        """R (V, N) float64 for this call: V vectors of `bits`-bit random integers, 32-bit
        lanes of the stream (CHECK_PURPOSE, seed) from a position fixed by the call number
        (one rng call serves DRAW_BLOCK calls of up to DRAW_LANES lanes)."""
        count = -(-SECURITY_BITS // bits)
        size = n * count
        block, i = divmod(call, DRAW_BLOCK)
        if size > DRAW_LANES:  # a very wide product: its own draw
            words = self.kernels.raw64((CHECK_PURPOSE, self.seed, 1, call), -(-size // 2))
            lanes = words.astype("<u8", copy=False).view("<u4")[:size]
            return (lanes >> np.uint32(LANE_BITS - bits)).reshape(count, n).astype(np.float64)
        if self._block != block:
            self._draw(block)
        return self._lanes(bits)[i, :size].reshape(count, n)

    def _draw(self, block: int) -> None:
        """The block's lanes; the widths taken from them are refilled in place as the
        block first uses each (so the shapes' views stay valid from block to block).
        Refilling every width at each draw cost ~1 % of a default step natively."""
        key = (CHECK_PURPOSE, self.seed, 0, block)
        words = self.kernels.raw64(key, DRAW_BLOCK * DRAW_LANES // 2)
        self._pool = words.astype("<u8", copy=False).view("<u4").reshape(DRAW_BLOCK, -1)
        self._block = block
        self._fresh.clear()

    def fused_vectors(self, n: int) -> np.ndarray | None:
        """r (N,) int64, SECURITY_BITS-bit entries, for the next product of N columns,
        counted as a call: its check then rides in the kernels' passes (Kernels.
        quantize_dots and epilogue_checked: A @ (B @ r) from the operands as they are
        quantized, against out @ r in the epilogue; Gemm.scaled). Both sides are wrapping
        int64, exact mod 2**64 as in native_check, for N <= DRAW_LANES (the entries sum
        below 2**32). None for a wider product: the caller then checks it with `holds`.

        Each call takes the next N lanes of a stream of its own ((CHECK_PURPOSE, seed, 3,
        draw), FUSED_LANES a draw): no two calls share a lane, and one draw serves about
        a default step (a block of DRAW_LANES a call drew 2.5 a step, ~1 % of it)."""
        if not 0 < n <= DRAW_LANES:
            return None
        self.calls += 1
        start = self._cursor
        if start + n > FUSED_LANES:
            key = (CHECK_PURPOSE, self.seed, 3, self._fused_draws)
            words = self.kernels.raw64(key, FUSED_LANES // 2).astype("<u8", copy=False)
            # a new array, never refilled in place: a product still checking on another
            # thread (a peer's recheck beside a group's other peers in one process) keeps
            # the lanes it was given
            self._fused = (words.view("<u4") >> np.uint32(LANE_BITS - SECURITY_BITS)).astype(
                np.int64)
            self._fused_draws += 1
            start = 0
        self._cursor = start + n
        return self._fused[start:start + n]

    def failed(self) -> None:
        """A fused check found its product wrong (Gemm.scaled)."""
        self.failures += 1

    def _fill(self, bits: int, scaled: np.ndarray) -> None:
        """scaled (DRAW_BLOCK, DRAW_LANES) f64 = the top `bits` of the block's lanes."""
        np.right_shift(self._pool, np.uint32(LANE_BITS - bits), out=self._shifted)
        scaled[...] = self._shifted

    def _lanes(self, bits: int) -> np.ndarray:
        scaled = self._scaled.get(bits)
        if scaled is None:  # a width of entries first used
            scaled = self._scaled[bits] = np.empty(self._pool.shape, np.float64)
        if bits not in self._fresh:
            self._fill(bits, scaled)
            self._fresh.add(bits)
        return scaled

    def _view(self, k: int, n: int) -> tuple[np.ndarray, int] | bool:
        """(DRAW_BLOCK, V, N), bits: row i is vectors(call, n, bits) for call i of a
        block; the same view serves every block."""
        bits = min(entry_bits(k, n), SECURITY_BITS)  # one width for most shapes: one fill
        count = -(-SECURITY_BITS // bits) if bits else 0
        if not bits or n * count > DRAW_LANES:
            view: tuple[np.ndarray, int] | bool = False
        else:
            view = self._lanes(bits)[:, :n * count].reshape(DRAW_BLOCK, count, n), bits
        self._views[k, n] = view
        return view

    def holds(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
        """Whether out == a @ b (int8 operands, 2-d or 3-d batched; out int32). Called for
        every GEMM product in the page (natively the model's go through fused_vectors),
        so the common path is one dictionary lookup and one kernel (~1.3 us of Python a
        call). Its vectors are the blocks' lanes at its own count of calls."""
        call = self._held
        self._held = call + 1
        self.calls += 1
        block, i = divmod(call, DRAW_BLOCK)
        if block != self._block:
            self._draw(block)
        entry = self._views.get((a.shape[-1], b.shape[-1]))
        if entry is None:
            entry = self._view(a.shape[-1], b.shape[-1])
        started = time.perf_counter()
        if entry is not False and out.size:
            view, bits = entry  # type: ignore[misc]
            if bits not in self._fresh:
                self._lanes(bits)
            ok = self.kernels.product_holds(a, b, out, view[i])
        else:
            ok = self._holds_edge(call, a, b, out)
        self.seconds += time.perf_counter() - started
        if not ok:
            self.failures += 1
        return ok

    def _holds_edge(self, call: int, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
        """Empty products, and shapes the block's draw does not serve."""
        if out.size == 0:
            return True
        if a.shape[-1] == 0:
            return not np.any(out)
        bits = min(entry_bits(a.shape[-1], b.shape[-1]), SECURITY_BITS)
        if not bits:
            return self._holds_mod64(call, a, b, out)
        return self.kernels.product_holds(a, b, out, self.vectors(call, b.shape[-1], bits))

    def _holds_mod64(self, call: int, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
        count = -(-SECURITY_BITS // 32)
        n = b.shape[-1]
        r = self.kernels.raw64((CHECK_PURPOSE, self.seed, 2, call), n * count).reshape(n, count)
        wrap = np.uint64
        br = np.matmul(b.astype(np.int64).view(wrap), r)  # (..., K, V) mod 2**64
        lhs = np.matmul(a.astype(np.int64).view(wrap), br)
        rhs = np.matmul(out.astype(np.int64).view(wrap), r)
        return bool(np.array_equal(lhs, rhs))

