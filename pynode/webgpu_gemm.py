"""The page's WebGPU GEMM backend: exact int8 x int8 -> int32 on the GPU, gated like any other.

The kernel is server/pyodide_app/webgpu.js (integer WGSL: bytes sign-extended from packed u32
words, i32 accumulation, never float). This file packs the operands, cuts products that
exceed the device's buffer or dispatch limits into pieces, and waits for each piece.

WebGPU answers with promises (mapAsync) while `GemmBackend.matmul` must return an array.
The wait is Pyodide's `run_sync` (JS Promise Integration, WebAssembly.Suspending): it
suspends the wasm stack until the promise settles and resumes with its value. It works
only on a call stack that JS entered "promising": an asyncio task's step (the trainer's
loop; `run_checks_async`), `runPythonAsync` or `callPromising`. Anywhere else
`can_run_sync()` is false and the backend reports itself unavailable rather than block.

Legend: B batch, M rows, K reduction length, K4 = ceil(K / 4) words, N columns.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from pynode.core.errors import GateError
from pynode.core.gemm.base import MAX_K, BackendUnavailableError, GemmBackend
from pynode.platform import IN_PYODIDE

# The longest packed row (K = MAX_K) must fit one binding: 4 * ceil(131,071 / 4) bytes.
MIN_BINDING_BYTES = 4 * -(-MAX_K // 4)


class GpuDevice(Protocol):
    """Runs one packed product; `bmm` returns (B, M, N) int32 for (B, M, K4) and (B, N, K4)
    uint32 words within the limits below."""

    adapter: str  # what the browser calls the adapter
    max_binding_bytes: int  # largest buffer one operand or result may take
    max_workgroups: int  # workgroups per dispatch dimension
    tile: int  # output cells per workgroup side

    def bmm(self, a_words: np.ndarray, bt_words: np.ndarray) -> np.ndarray: ...


def pack_rows(x: np.ndarray) -> np.ndarray:
    """(B, R, K) int8 -> (B, R, K4) uint32: four int8 along K per little-endian word (byte j
    of word w is k = 4 w + j), K zero-padded, which adds nothing to any dot product."""
    bs, rows, k = x.shape
    padded = np.zeros((bs, rows, 4 * -(-k // 4)), np.int8)  # (B, R, 4 K4) int8
    padded[:, :, :k] = x
    return padded.view("<u4")


def chunks(bs: int, m: int, n: int, k4: int, device: GpuDevice) -> Iterator[tuple[slice, ...]]:
    """(batch, rows, cols) slices covering (B, M, N) so that each piece's operands and result
    fit one binding and its dispatch fits the workgroup limits."""
    limit, span = device.max_binding_bytes, device.max_workgroups * device.tile
    rows = min(m, limit // (4 * k4), span)
    cols = min(n, limit // (4 * k4), span)
    rows = min(rows, max(1, limit // (4 * cols)))
    per = min(bs, device.max_workgroups, limit // (4 * k4 * max(rows, cols)),
              limit // (4 * rows * cols))
    for b0 in range(0, bs, per):
        for m0 in range(0, m, rows):
            for n0 in range(0, n, cols):
                yield slice(b0, b0 + per), slice(m0, m0 + rows), slice(n0, n0 + cols)


class WebGpuBackend(GemmBackend):
    """Exact int8 GEMM on a GpuDevice (the page's WebGPU, or a fake one in tests)."""

    name = "webgpu"

    def __init__(self, device: GpuDevice) -> None:
        if device.max_binding_bytes < MIN_BINDING_BYTES:
            raise BackendUnavailableError(
                f"webgpu: buffers of {device.max_binding_bytes} bytes cannot hold one row of "
                f"K = {MAX_K} ({MIN_BINDING_BYTES} bytes)")
        self.device = device

    def capped(self, max_binding_bytes: int) -> WebGpuBackend:
        """The same device with smaller pieces (tests: products split as on a small GPU)."""
        device = copy.copy(self.device)
        device.max_binding_bytes = min(device.max_binding_bytes, max_binding_bytes)
        return WebGpuBackend(device)

    def _matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._bmm(a[None], b[None])[0]

    def _bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        (bs, m, _), n = a.shape, b.shape[2]
        a_words = pack_rows(a)  # (B, M, K4) uint32
        bt_words = pack_rows(b.transpose(0, 2, 1))  # (B, N, K4) uint32
        k4 = a_words.shape[2]
        out = np.empty((bs, m, n), np.int32)  # (B, M, N) int32
        for bsl, msl, nsl in chunks(bs, m, n, k4, self.device):
            out[bsl, msl, nsl] = self.device.bmm(np.ascontiguousarray(a_words[bsl, msl]),
                                                 np.ascontiguousarray(bt_words[bsl, nsl]))
        return out


class JsGpuDevice:
    """server/pyodide_app/webgpu.js (`self.daisyWebGPU`) behind the GpuDevice interface."""

    def __init__(self, gpu: Any, info: dict, wait: Any, max_binding_bytes: int = 0) -> None:
        self._gpu, self._wait = gpu, wait
        self.adapter = str(info["adapter"])
        self.max_binding_bytes = min(int(info["maxBindingBytes"]), max_binding_bytes or 1 << 62)
        self.max_workgroups = int(info["maxWorkgroups"])
        self.tile = int(info["tile"])

    def bmm(self, a_words: np.ndarray, bt_words: np.ndarray) -> np.ndarray:
        from pyodide.ffi import JsException, can_run_sync, to_js

        if not can_run_sync():
            raise GateError("webgpu: called where it cannot wait for the GPU (not on a stack "
                            "entered through an async Python function)")
        (bs, m, k4), n = a_words.shape, bt_words.shape[1]
        try:
            result = self._wait(self._gpu.bmm(to_js(memoryview(a_words.reshape(-1))),
                                              to_js(memoryview(bt_words.reshape(-1))),
                                              bs, m, n, k4))
        except JsException as exc:
            raise GateError(f"webgpu: {exc}") from exc
        out = np.empty((bs, m, n), np.int32)  # (B, M, N) int32
        result.assign_to(out)
        return out


def open_webgpu(max_binding_bytes: int = 0) -> WebGpuBackend:
    """The page's WebGPU as a backend (not yet gated). BackendUnavailableError, with the
    reason, where there is no page, no adapter, no webgpu.js or no way to wait.

    max_binding_bytes: cap on one buffer (0: the adapter's limit); small values make
    products split into pieces, which tests use.
    """
    if not IN_PYODIDE:
        raise BackendUnavailableError("webgpu: only in a page (this Python is not Pyodide)")
    import js
    from pyodide.ffi import can_run_sync, run_sync

    gpu = getattr(js, "daisyWebGPU", None)
    if gpu is None:
        raise BackendUnavailableError("webgpu: server/pyodide_app/webgpu.js is not loaded here")
    if not can_run_sync():
        raise BackendUnavailableError(
            "webgpu: this call cannot wait for a promise (run_sync needs JS Promise "
            "Integration and a call entered through an async Python function)")
    info = json.loads(run_sync(gpu.init()))
    if not info["ok"]:
        raise BackendUnavailableError(f"webgpu: {info['reason']}")
    return WebGpuBackend(JsGpuDevice(gpu, info, run_sync, max_binding_bytes))
