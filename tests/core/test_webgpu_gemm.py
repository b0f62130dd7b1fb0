"""pynode/webgpu_gemm.py natively, on a numpy twin of the WGSL kernel: packing, splitting,
the exact gate, and a clear "unavailable" off the page. The real kernel runs in Chromium in
e2e/test_webgpu.py.

Legend: B batch, M rows, K reduction length, K4 = ceil(K / 4) words, N columns.
"""

from __future__ import annotations

import numpy as np
import pytest

from pynode.core.gemm import BackendUnavailableError, ExactGate
from pynode.core.gemm.reference import ReferenceBackend
from pynode.webgpu_gemm import MIN_BINDING_BYTES, WebGpuBackend, chunks, open_webgpu, pack_rows

VALUES = np.arange(-128, 128, dtype=np.int64)
LUT = (VALUES[:, None] * VALUES[None, :]).astype(np.int32)  # (256, 256) int32


def unpack(words: np.ndarray, signed: bool = True) -> np.ndarray:
    """(..., K4) uint32 -> (..., K4, 4) int32, as the kernel does: byte j shifted to the top
    of an i32, then shifted down arithmetically (or logically, for a broken twin)."""
    w = words.view(np.int32)[..., None]
    up = np.left_shift(w, np.array([24, 16, 8, 0], np.int32))
    if signed:
        return np.right_shift(up, 24)
    return np.right_shift(up.view(np.uint32), 24).astype(np.int32)


class TwinDevice:
    """The WGSL kernel's arithmetic in numpy (i32 products and sums), with its limits."""

    adapter, max_workgroups, tile = "numpy twin", 65_535, 16

    def __init__(self, max_binding_bytes: int = 1 << 27, signed: bool = True,
                 words_dropped: int = 0) -> None:
        self.max_binding_bytes, self.signed = max_binding_bytes, signed
        self.words_dropped = words_dropped
        self.calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def bmm(self, a_words: np.ndarray, bt_words: np.ndarray) -> np.ndarray:
        self.calls.append((a_words.shape, bt_words.shape))
        for x in (a_words, bt_words, np.empty(a_words.shape[:2] + bt_words.shape[1:2], np.int32)):
            assert x.nbytes <= self.max_binding_bytes, (x.shape, self.max_binding_bytes)
        k4 = a_words.shape[2] - self.words_dropped
        a = unpack(a_words[:, :, :k4], self.signed)  # (B, M, K4, 4) int32
        b = unpack(bt_words[:, :, :k4], self.signed)  # (B, N, K4, 4) int32
        return np.einsum("bmkj,bnkj->bmn", a, b, dtype=np.int32)  # (B, M, N) int32


@pytest.fixture(scope="module")
def gate():
    return ExactGate(ReferenceBackend(LUT))


def test_pack_rows_puts_k_in_little_endian_bytes_and_pads_with_zero():
    x = np.array([[[1, -2, 3, -128, 127]]], np.int8)  # (1, 1, 5) int8
    words = pack_rows(x)
    assert words.dtype == np.dtype("<u4") and words.shape == (1, 1, 2)
    assert words[0, 0, 0] == 0x80_03_FE_01 and words[0, 0, 1] == 0x7F
    assert np.array_equal(unpack(words).reshape(1, 1, 8)[..., :5], x.astype(np.int32))


@pytest.mark.parametrize("shape", [(3, 70, 9, 5), (1, 200, 1, 300), (40, 3, 33, 2), (2, 1, 1, 1)])
@pytest.mark.parametrize("limit", [MIN_BINDING_BYTES, 4096, 1 << 27])
def test_chunks_cover_every_cell_once_within_the_limits(shape, limit):
    bs, m, n, k4 = shape
    device = TwinDevice(limit)
    device.max_workgroups, device.tile = 3, 4
    seen = np.zeros((bs, m, n), np.int32)
    for bsl, msl, nsl in chunks(bs, m, n, k4, device):
        rows, cols, items = range(m)[msl], range(n)[nsl], range(bs)[bsl]
        assert 4 * k4 * max(len(rows), len(cols)) * len(items) <= limit
        assert 4 * len(rows) * len(cols) * len(items) <= limit
        assert len(items) <= 3 and len(rows) <= 12 and len(cols) <= 12
        seen[bsl, msl, nsl] += 1
    assert np.array_equal(seen, np.ones_like(seen))


@pytest.mark.parametrize("limit", [1 << 27, MIN_BINDING_BYTES])
def test_twin_passes_the_exact_gate(gate, limit):
    device = TwinDevice(limit)
    report = gate.run(WebGpuBackend(device))
    assert report.passed, report
    if limit == MIN_BINDING_BYTES:  # K = MAX_K rows: one row per piece
        assert any(a[1] == 1 for a, _ in device.calls)


@pytest.mark.parametrize("broken, failing", [
    (TwinDevice(signed=False), "odd_tails"),  # bytes not sign-extended
    (TwinDevice(words_dropped=1), "tiny_1x1x1"),  # the K tail's word skipped
])
def test_gate_catches_a_broken_kernel(gate, broken, failing):
    report = gate.run(WebGpuBackend(broken))
    assert not report.passed and report.failing_case == failing, report


def test_matches_int64_on_tails_batches_and_extremes():
    backend = WebGpuBackend(TwinDevice(MIN_BINDING_BYTES))
    rng = np.random.default_rng(3)
    for bs, m, k, n in [(0, 17, 5, 33), (4, 9, 130, 7), (0, 1, 3, 1)]:
        lead = (bs,) if bs else ()
        a = rng.integers(-128, 128, lead + (m, k)).astype(np.int8)
        b = rng.integers(-128, 128, lead + (k, n)).astype(np.int8)
        got = backend.bmm(a, b) if bs else backend.matmul(a, b)
        assert got.dtype == np.int32
        assert np.array_equal(got, np.matmul(a.astype(np.int64), b.astype(np.int64)))
    low = np.full((3, 131_071), -128, np.int8)
    got = backend.matmul(low, low.T.copy())
    assert np.array_equal(got, np.full((3, 3), 131_071 * 16_384, np.int32))


def test_too_small_buffers_are_refused():
    with pytest.raises(BackendUnavailableError, match="cannot hold one row"):
        WebGpuBackend(TwinDevice(MIN_BINDING_BYTES - 4))


def test_off_the_page_webgpu_is_unavailable_with_the_reason():
    with pytest.raises(BackendUnavailableError, match="only in a page"):
        open_webgpu()


def test_page_checks_report_webgpu_and_a_forced_missing_one_fails():
    from pynode.browser import run_checks

    checks = run_checks()
    assert checks.ready and checks.gemm.backend_name == "numpy_int"
    assert checks.webgpu.startswith("unavailable: webgpu: only in a page")
    assert "webgpu" not in checks.backends
    (row,) = [r for r in checks.rows if r.backend == "webgpu"]  # in the table, not only status
    assert row.skipped and row.result == f"skipped: {checks.webgpu}"
    forced = run_checks(backend="webgpu")
    assert not forced.ready
    said = forced.rows[-1].result  # it was "unknown GEMM backend 'webgpu'", which it is not
    assert said.startswith("FAIL: GEMM backend 'webgpu' is unavailable: webgpu: only in a page")
    assert said.endswith("in this browser") and "unknown" not in said
