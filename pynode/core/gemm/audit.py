"""Continuous audit: re-check a few cells of live GEMM results against the LUT reference.

The start-up gate proves a backend on fixed shapes; the audit watches the shapes training
actually uses. On every `every`-th call (a call counter, never the clock, so a run
audits the same calls each time) it recomputes a stratified sample of output cells
exactly: first the structural danger points (corners, edge midpoints and centre of the
last matrix, corners of the first), where tail and blocking bugs land, then
`random_cells` cells drawn from pynode.core.rng at a stream position fixed by the call
number. Each cell is one int8 dot product of length K through the multiply LUT, so an
audited call costs O(cells * K). A wrong cell raises GateError; whether to demote the
backend is the caller's choice (Gemm.demote).

Legend: B batch, M rows, K reduction length, N columns, C sampled cells.
"""

from __future__ import annotations

import numpy as np

from pynode.core import rng
from pynode.core.errors import GateError
from pynode.core.gemm.reference import checked_lut, lut_dot

AUDIT_PURPOSE = 0xA0D1
AUDIT_EVERY = 16  # measured overhead at this rate: see benchmarks/README.md
AUDIT_RANDOM_CELLS = 4
DRAW_BLOCK = 64  # audits whose random cells one rng call draws (an rng call costs ~90 us)


def structural_cells(bs: int, m: int, n: int) -> set[tuple[int, int, int]]:
    """(batch, row, col): corners, edge midpoints and centre of the last matrix, corners
    of the first."""
    last = {(bs - 1, i, j) for i in (0, m // 2, m - 1) for j in (0, n // 2, n - 1)}
    return last | {(0, i, j) for i in (0, m - 1) for j in (0, n - 1)}


class GemmAudit:
    """Counts calls and audits every `every`-th one (the first call included)."""

    def __init__(
        self,
        mul_lut: np.ndarray,
        every: int = AUDIT_EVERY,
        random_cells: int = AUDIT_RANDOM_CELLS,
        seed: int = 0,
    ) -> None:
        if every < 1 or random_cells < 0:
            raise ValueError(
                f"audit needs every >= 1 and random_cells >= 0, got {every} and {random_cells}"
            )
        self._lut = checked_lut(mul_lut)
        self.every = every
        self.random_cells = random_cells
        self.seed = seed
        self.calls = 0  # products seen
        self.audits = 0  # products audited
        self.cells_checked = 0
        self._block: tuple[int, int] | None = None  # which draws self._bits holds
        self._bits = np.empty((0, 3, 0), np.uint64)

    def _draws(self, audit_index: int) -> np.ndarray:
        """(3, random_cells) uint64 for this audit; one rng call serves DRAW_BLOCK audits."""
        block, i = divmod(audit_index, DRAW_BLOCK)
        per = 3 * self.random_cells
        if self._block != (block, per):
            bits = rng.bits64(
                (AUDIT_PURPOSE, self.seed), per * DRAW_BLOCK, per * DRAW_BLOCK * block
            )
            self._bits = bits.reshape(DRAW_BLOCK, 3, self.random_cells)
            self._block = (block, per)
        return self._bits[i]

    def _cells(self, audit_index: int, bs: int, m: int, n: int) -> tuple[np.ndarray, ...]:
        # A modulo of 64 random bits: its bias (< size / 2**64) is irrelevant to sampling.
        coords = self._draws(audit_index) % np.array([[bs], [m], [n]], np.uint64)
        drawn = zip(*coords.tolist(), strict=True)
        cells = sorted(structural_cells(bs, m, n).union(drawn))
        return tuple(np.array(c, dtype=np.intp) for c in zip(*cells, strict=True))  # 3 x (C,)

    def check(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, backend: str) -> bool:
        """Note one product out = a @ b (2-d, or 3-d batched) and audit it if it is due.

        Returns True when this call was audited; raises GateError on a wrong cell.
        """
        call = self.calls
        self.calls += 1
        if call % self.every:
            return False
        if a.ndim == 2:
            a, b, out = a[None], b[None], out[None]
        bs, m, n = out.shape
        if bs == 0 or m == 0 or n == 0:
            return False
        bi, mi, ni = self._cells(call // self.every, bs, m, n)
        want = lut_dot(self._lut, a[bi, mi], b[bi, :, ni])  # (C,) int64
        got = out[bi, mi, ni].astype(np.int64)  # (C,) int64
        self.audits += 1
        self.cells_checked += len(want)
        bad = np.flatnonzero(got != want)
        if len(bad):
            c = bad[0]
            cell = (int(bi[c]), int(mi[c]), int(ni[c]))
            raise GateError(
                f"live audit of GEMM backend {backend!r}, call {call}: {len(bad)} of {len(want)} "
                f"sampled cells wrong; cell (batch, row, col) {cell} of a {tuple(out.shape)} "
                f"result: expected {int(want[c])}, got {int(got[c])}"
            )
        return True
