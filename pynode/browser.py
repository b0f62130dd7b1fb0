"""The page's Python side (under Pyodide, in the Web Worker): checks, the JS mesh, the room peer.

server/pyodide_app/worker.js calls, in order:

    checks = await run_checks_async(break_gate, backend)   the start-up checks; .to_json()
    peer = BrowserPeer(bridge, self_id, checks) once the checks passed and signaling named us
    peer.opened(id) / peer.deliver(id, ArrayBuffer) / peer.gone(id)     mesh events
    await peer.start(config_json)               this tab leads a run (a Promise in JS)
    await peer.bench(size, repeats)             this tab leads an all-reduce benchmark
    preview_checkpoint(buffer, steps)           what a resume of a .pt would continue
                                                (pynode/browser_resume.py), before any run

`bridge` is a JS object: `send(peer, Uint8Array)` hands a message to the main thread (which
fragments it onto the peer's data channel), `post(kind, json)` reports to the page. Each
large buffer is converted once each way (`to_js` copies into a fresh ArrayBuffer that the
worker then transfers; `to_bytes` copies an arriving one), never element by element.
`await gemm_cases(checks, cases_json)` runs GEMM cases through any candidate backend (tests,
benchmarks). `await generate_text(checks, buffer, request_json, bridge)` continues a prompt
with a .pt's model; the page runs it in a second worker that joins no room (generate.js),
so generating never takes the training worker's time; `kit_html(buffer)` writes a .pt's
inference kit there too. Nothing here runs natively except under tests, which pass a fake
bridge.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pynode.browser_resume import buffer_bytes, read_page_resume

# the worker calls it as pynode.browser's, beside the rest of the page's Python
from pynode.browser_resume import preview_checkpoint as preview_checkpoint
from pynode.comm.mesh import Mesh
from pynode.config import RunConfig
from pynode.core.errors import DaisyError, GateError
from pynode.run.protocol import RoomPeer, goodbye
from pynode.run.trainer import Trainer
from pynode.verify import CheckRow, product_check_row

GEMM_CASE_PURPOSE = 0x6E3C  # rng key of case_operands' random operands
# A tab training alone never waits on the mesh, so the worker would take no message (a
# download, a copy of the state to generate from) until the run ends: it yields between
# two steps at least this often, and only then (a group's steps wait on the mesh already).
SOLO_YIELD_EVERY_S = 0.25
GENERATE_YIELD_EVERY_S = 0.05  # generation hands its worker's event loop over this often


class BrokenBackend:
    """Test hook (`?break_gate=1`): a backend whose last result cell is off by one."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.array(self.inner.matmul(a, b))  # (M, N) int32
        if out.size:
            out.reshape(-1)[-1] += 1
        return out

    def bmm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.array(self.inner.bmm(a, b))  # (B, M, N) int32
        if out.size:
            out.reshape(-1)[-1] += 1
        return out


def broken_kernels(inner: Any) -> Any:
    """Test hook (`run_checks(break_kernels=True)`): `inner` with GELU one ulp high."""

    class BrokenKernels(type(inner)):
        def gelu_with_grad(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            y, dy = super().gelu_with_grad(x)
            return np.nextafter(y, np.float32(np.inf)), dy

    return BrokenKernels()


@dataclass
class Checks:
    """What the start-up checks found, and what this peer computes with if they passed."""

    rows: list[CheckRow] = field(default_factory=list)
    units: Any = None  # verified Units
    gemm: Any = None  # the gated GEMM; None unless every check passed
    backends: dict[str, Any] = field(default_factory=dict)  # name -> each candidate backend
    webgpu: str = "not checked"  # "available: <adapter>" or "unavailable: <reason>"
    kernels: str = "numpy"  # the hot kernels the GEMM carries: "wasm" once gated, else "numpy"

    @property
    def ready(self) -> bool:
        return self.gemm is not None

    def to_json(self) -> str:
        """{ready, backend (the GEMM in use, or null), kernels (the hot kernels in use, or
        null), rows: [{..., passed, skipped}], webgpu (available or why not)}."""
        return json.dumps({
            "ready": self.ready,
            "backend": self.gemm.backend_name if self.ready else None,
            "kernels": self.kernels if self.ready else None,
            "rows": [{**r.__dict__, "passed": r.passed, "skipped": r.skipped} for r in self.rows],
            "webgpu": self.webgpu,
        })

    def make_trainer(self, cfg: RunConfig, collective: Any, resume: Any) -> Trainer:
        """A trainer on the verified units and gated GEMM (pynode.run.assemble)."""
        from pynode.run.assemble import build_trainer

        if not self.ready:
            raise GateError("this peer did not pass its start-up checks; it must not train")
        return build_trainer(cfg, collective, resume, arithmetic=(self.units, self.gemm))


def page_backends(mul_lut: np.ndarray, checks: Checks) -> tuple[list[Any], list[tuple]]:
    """The page's candidates best first, and (name, why not) for those that cannot run:
    PAGE_ORDER (wasm SIMD, then the no-BLAS numpy order) with WebGPU, where it opens, after
    the CPU backends (before the slow reference), so it is used when forced
    (`?backend=webgpu`) or when every CPU backend failed its gate. SwiftShader, the
    software adapter of headless Chromium, is far slower than numpy_int; order alone must
    not pick it."""
    from pynode.browser_gemm import PAGE_ORDER
    from pynode.core.gemm import BackendUnavailableError
    from pynode.gemm_backends import available_backends
    from pynode.webgpu_gemm import open_webgpu

    order, skipped = available_backends(PAGE_ORDER, mul_lut)
    try:
        webgpu = open_webgpu()
    except BackendUnavailableError as exc:
        checks.webgpu = f"unavailable: {exc}"
    else:
        checks.webgpu = f"available: {webgpu.device.adapter}"
        at = next((i for i, b in enumerate(order) if b.name == "reference"), len(order))
        order.insert(at, webgpu)
    checks.backends = {b.name: b for b in order}
    return order, skipped


async def run_checks_async(break_gate: bool = False, backend: str | None = None) -> Checks:
    """run_checks on an asyncio task's stack, where WebGPU's promises can be waited on."""
    return run_checks(break_gate, backend)


def run_checks(break_gate: bool = False, backend: str | None = None,
               break_kernels: bool = False) -> Checks:
    """Units over their full domain, LUT == integer op, then the exact gate of each backend
    best first for a page (`page_backends`); the first that passes computes. A backend that
    cannot run here gets a `skipped` row. `backend` forces one by name (`?backend=`): it
    must exist and pass its gate. Last the kernel gate: the wasm hot kernels go with the
    GEMM if they pass it, else the numpy reference (`break_kernels`: a test hook that
    breaks them). Never raises for a failed check."""
    from pynode.core.gemm import UnknownBackendError, select_gemm
    from pynode.verify import kernel_gate, unit_checks

    checks = Checks()
    rows = checks.rows
    units = unit_checks(rows)
    if units is None:
        return checks
    order, skipped = page_backends(units.mul_lut, checks)
    rows.extend(CheckRow("exact gate", "-", f"skipped: {why}", name, 0.0)
                for name, why in skipped)
    if "webgpu" not in checks.backends:  # said in the table, not only in status().webgpu
        rows.append(CheckRow("exact gate", "-", f"skipped: {checks.webgpu}", "webgpu", 0.0))
        if backend == "webgpu":  # forced, but this browser has none: not "unknown"
            rows.append(CheckRow("exact gate", "webgpu", f"FAIL: GEMM backend 'webgpu' is "
                                 f"{checks.webgpu} in this browser", "webgpu", 0.0))
            return checks
    if break_gate:
        order = [BrokenBackend(b) for b in order]
    ops, kernel_rows = kernel_gate(broken_kernels if break_kernels else None)
    try:
        # Every product checked, inline (the page has no threads): by the wasm kernel
        # (kernels.wat, daisychain_product_holds) once the kernels passed their gate.
        gemm = select_gemm(units, prefer=backend, order=order, kernels=ops, check=True)
    except (GateError, UnknownBackendError) as exc:
        rows.append(CheckRow("exact gate", backend or "every backend", f"FAIL: {exc}",
                             backend or "-", 0.0))
        return checks
    for report in gemm.gate_reports:
        result = "pass" if report.passed else f"FAIL at {report.failing_case}: {report.detail}"
        rows.append(CheckRow("exact gate", f"{report.cases} shapes", result, report.backend,
                             report.seconds))
    rows.extend(kernel_rows)
    rows.append(product_check_row(ops))
    rows.append(philox_row())
    checks.units, checks.gemm, checks.kernels = units, gemm, ops.name
    return checks


def philox_row() -> CheckRow:
    """Whether the stochastic-rounding draws run on the wasm Philox (its words equalled the
    oracle's) or on numpy's Philox (the same words, slower)."""
    import time

    from pynode import browser_philox

    started = time.perf_counter()
    result = "pass" if browser_philox.available() else (
        "skipped: numpy's Philox draws instead (same words; see the console for why)")
    return CheckRow("wasm Philox", "== Philox4x64 oracle", result, "wasm",
                    time.perf_counter() - started)


def case_operands(case: dict) -> tuple[np.ndarray, np.ndarray]:
    """The operands of a GEMM case {batch, m, k, n, seed, fill}: batch 0 means matmul
    ((M, K), (K, N) int8), else bmm ((B, M, K), (B, K, N) int8); fill "random" (seeded
    pynode.core.rng, the same bits natively and in the page), "min" (-128) or "max" (127)."""
    from pynode.core import rng

    lead = (case["batch"],) if case["batch"] else ()
    shapes = (lead + (case["m"], case["k"]), lead + (case["k"], case["n"]))
    if case["fill"] in ("min", "max"):
        value = -128 if case["fill"] == "min" else 127
        return tuple(np.full(shape, value, np.int8) for shape in shapes)  # type: ignore[return-value]
    if case["fill"] != "random":
        raise ValueError(f"unknown fill {case['fill']!r}")
    a, b = ((rng.randint((GEMM_CASE_PURPOSE, case["seed"], i), shape, 256) - 128).astype(np.int8)
            for i, shape in enumerate(shapes))
    return a, b


async def gemm_cases(checks: Checks, cases_json: str) -> str:
    """Test and benchmark hook (`daisychain.gemm`): run each case {backend, batch, m, k, n,
    seed, fill, repeats, max_binding_bytes (webgpu: split into pieces of at most this)}
    through that candidate backend (raw, without the gated wrapper).
    JSON [{backend, sha256 of the int32 result, shape, seconds (best of repeats)}] or
    [{..., error}]. Async so WebGPU can wait on its promises."""
    results = []
    for case in json.loads(cases_json):
        backend = checks.backends.get(case["backend"])
        if backend is None:
            results.append({**case, "error": f"no backend {case['backend']!r} in this page"})
            continue
        if case.get("max_binding_bytes"):
            backend = backend.capped(int(case["max_binding_bytes"]))
        a, b = case_operands(case)
        product = backend.bmm if a.ndim == 3 else backend.matmul
        best = float("inf")
        for _ in range(max(1, int(case.get("repeats", 1)))):
            t0 = time.perf_counter()
            out = product(a, b)
            best = min(best, time.perf_counter() - t0)
        results.append({**case, "sha256": hashlib.sha256(out.tobytes()).hexdigest(),
                        "shape": list(out.shape), "dtype": str(out.dtype), "seconds": best})
    return json.dumps(results)


async def generate_text(checks: Checks, buffer: Any, request_json: str, bridge: Any) -> str:
    """Continue a prompt with the model of the .pt `buffer` (a JS ArrayBuffer, or bytes):
    request {id, prompt (text), tokens, temperature, top_k, seed}: the bytes `python -m
    pynode generate` writes (pynode.run.generate). Streams the text as it comes, whole
    characters, as `generated` reports {id, text}, yielding to the worker's event loop
    every GENERATE_YIELD_EVERY_S, when it asks `bridge.stopped(id)` whether the page's Stop
    came (it then ends there); returns JSON {ok, bytes (hex), text, step, context,
    prompt_bytes, seconds, stopped} or {ok: false, error} (never raises into JS)."""
    from pynode.run.generate import load_generator, text_pieces

    started = time.perf_counter()
    produced = bytearray()
    try:
        request = json.loads(request_json)
        if not checks.ready:
            raise GateError("this page did not pass its start-up checks; it must not compute")
        sampling, prompt = generate_request(request)
        data = buffer.to_bytes() if hasattr(buffer, "to_bytes") else bytes(buffer)
        generator = load_generator(data, arithmetic=(checks.units, checks.gemm))

        def tokens():
            for token in generator.generate(prompt, sampling):
                produced.append(token)
                yield token

        yielded, stopped = time.perf_counter(), False
        for piece in text_pieces(tokens()):  # one byte each
            if piece:
                bridge.post("generated", json.dumps({"id": request["id"], "text": piece}))
            if time.perf_counter() - yielded > GENERATE_YIELD_EVERY_S:
                await asyncio.sleep(0)  # the worker's other messages get their turn
                yielded = time.perf_counter()
                stopped = bool(bridge.stopped(request["id"]))  # the page's Stop came
                if stopped:
                    break
    except (DaisyError, ValueError, TypeError, KeyError) as exc:
        return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return json.dumps({"ok": True, "bytes": produced.hex(), "text": produced.decode(
        "utf-8", "replace"), "step": generator.step, "context": generator.context,
        "prompt_bytes": len(prompt), "seconds": time.perf_counter() - started,
        "stopped": stopped})


def generate_request(request: Any) -> tuple[Any, bytes]:
    """(Sampling, prompt bytes) of a page's generate request: the keys it leaves out take
    `python -m pynode generate`'s defaults; others are refused, as start refuses them."""
    from pynode.run.generate import GenerateError, Sampling

    fields = ("tokens", "temperature", "top_k", "seed")
    if not isinstance(request, dict) or not isinstance(request.get("prompt"), str):
        raise GenerateError("generate takes {prompt: text, tokens, temperature, top_k, seed}; "
                            "the prompt is missing")
    unknown = sorted(set(request) - {"id", "prompt", *fields})
    if unknown:
        raise GenerateError(f"unknown generate keys: {', '.join(unknown)} (it takes prompt, "
                            f"{', '.join(fields)})")
    return (Sampling(**{k: request[k] for k in fields if k in request}),
            request["prompt"].encode("utf-8"))


def kit_html(buffer: Any) -> str:
    """The inference kit of the .pt `buffer` (pynode.run.kit): JSON {ok, html, step} or
    {ok: false, error} (never raises into JS)."""
    from pynode.run.kit import build_kit

    try:
        data = buffer.to_bytes() if hasattr(buffer, "to_bytes") else bytes(buffer)
        html = build_kit(data)
    except (DaisyError, ValueError, TypeError) as exc:
        return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return json.dumps({"ok": True, "html": html})


class HeapTooLarge(DaisyError):
    """The page's Python heap grew past what Pyodide copies buffers out of exactly."""


def goodbye_bytes() -> Any:
    """The message a closing tab's main thread sends every peer as it goes (pagehide, when
    this worker may not run again): the others say it left, not that it was lost."""
    from pyodide.ffi import to_js  # only in the page

    return to_js(memoryview(goodbye()))


def copies_are_exact() -> None:
    """HeapTooLarge once this tab's heap has grown past platform.PAGE_HEAP_LIMIT (it never
    shrinks): from there Pyodide 0.27 copies a buffer out as the right length of other
    bytes, so nothing that leaves Python (a frame to a peer, a checkpoint, the state a
    generation starts from) could be trusted. A config refused by its estimate never gets
    there; this is for whatever grew it anyway."""
    from pynode import platform

    if platform.heap_bytes() > platform.PAGE_HEAP_LIMIT:
        raise HeapTooLarge(
            f"this tab's Python memory grew to {platform.heap_bytes() / 2**30:.1f} GiB (a "
            "config too big for a tab was tried): past 2 GiB the browser's Python copies "
            "its buffers out wrong, so this tab sends, saves and generates nothing more; "
            "reload the page")


class JsMesh(Mesh):
    """The data channels of the page, as the main thread reports them through the worker."""

    def __init__(self, bridge: Any, self_id: str) -> None:
        self.self_id = self_id
        self._bridge = bridge
        self._open: set[str] = set()
        self._events: asyncio.Queue[tuple[str, bytes | None]] = asyncio.Queue()

    @property
    def peers(self) -> frozenset[str]:
        return frozenset(self._open)

    def send(self, peer: str, data: bytes) -> None:
        copies_are_exact()  # a frame of other bytes would reach the peer
        from pyodide.ffi import to_js  # only in the page

        if peer in self._open:
            self._bridge.send(peer, to_js(memoryview(data)))

    async def recv(self) -> tuple[str, bytes | None]:
        return await self._events.get()

    def opened(self, peer: str) -> None:
        if peer not in self._open:
            self._open.add(peer)
            self._events.put_nowait((peer, b""))

    def deliver(self, peer: str, buffer: Any) -> None:
        data = buffer.to_bytes() if hasattr(buffer, "to_bytes") else bytes(buffer)
        if data:
            self._events.put_nowait((peer, data))

    def gone(self, peer: str) -> None:
        if peer in self._open:
            self._open.discard(peer)
            self._events.put_nowait((peer, None))


class BrowserPeer:
    """This tab in its room: the JS mesh, the room protocol, reports to the page."""

    def __init__(self, bridge: Any, self_id: str, checks: Checks) -> None:
        if not checks.ready:
            raise GateError("this peer did not pass its start-up checks; it must not train")
        self.bridge = bridge
        self.mesh = JsMesh(bridge, self_id)
        self.room = RoomPeer(self.mesh, checks.make_trainer, self.post,
                             before_step=(self.let_messages_in,))
        self.yielded = time.perf_counter()
        self.task = asyncio.ensure_future(self.room.serve())

    def post(self, kind: str, fields: dict) -> None:
        self.bridge.post(kind, json.dumps(fields))

    async def let_messages_in(self, trainer: Trainer) -> None:
        """Before a step of a run this tab trains alone: hand the worker's event loop its
        turn (asyncio's next task runs from a JS timer), so messages waiting are taken
        between steps, never inside one."""
        if len(trainer.members()) > 1 or time.perf_counter() - self.yielded < SOLO_YIELD_EVERY_S:
            return
        await asyncio.sleep(0)
        self.yielded = time.perf_counter()

    def opened(self, peer: str) -> None:
        self.mesh.opened(peer)

    def deliver(self, peer: str, buffer: Any) -> None:
        self.mesh.deliver(peer, buffer)

    def gone(self, peer: str) -> None:
        self.mesh.gone(peer)

    def leave(self, reason: str) -> None:
        """The host removed or declined this page: its run stops (RoomPeer.leave)."""
        self.room.leave(reason)

    async def start(self, config_json: str) -> str:
        """Lead a run; returns JSON {ok, ranks} or {ok: false, error} (never raises into JS)."""
        try:
            ranks = await self.room.start(json.loads(config_json))
        except (DaisyError, ValueError, TypeError) as exc:
            return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return json.dumps({"ok": True, "ranks": ranks})

    async def resume(self, buffer: Any, steps: int | None = None) -> str:
        """Lead a run continuing the uploaded .pt (a JS ArrayBuffer): validated whole first
        (magic, version, dims, vocab, finiteness, hash), then broadcast to every ready peer
        as their sync. A run the checkpoint finished continues to `steps` (the form's), as
        `train --resume --steps` does. JSON {ok, ranks} or {ok: false, error}; a bad file
        changes nothing. The page's preview (`preview_checkpoint`) read the file the same
        way; it is read again here, whatever the preview said."""
        try:
            cfg, ckpt = read_page_resume(buffer_bytes(buffer), steps)
            ranks = await self.room.start_resumed(cfg, ckpt)
        except (DaisyError, ValueError, TypeError) as exc:
            return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return json.dumps({"ok": True, "ranks": ranks, "step": ckpt.step})

    def steer(self, request_json: str) -> str:
        """The leader's steering ({lr, steps, pause}, each optional; pynode.run.schedule):
        JSON {ok, requested, paused, step} or {ok: false, error}; a refused one changes
        nothing."""
        try:
            request = json.loads(request_json)
            if not isinstance(request, dict):
                raise ValueError(f"a steer request is an object, got {request!r}")
            unknown = sorted(set(request) - {"lr", "steps", "pause", "stop"})
            if unknown:  # a misspelt field must not pass as a request of nothing
                raise ValueError(f"steer takes lr, steps, pause and stop, not {unknown}")
            answer = self.room.steer(request.get("lr"), request.get("steps"),
                                     request.get("pause"), request.get("stop", False))
        except (DaisyError, ValueError, TypeError, AttributeError) as exc:
            return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return json.dumps({"ok": True, **answer})

    def checkpoint(self) -> Any:
        """The current state as .pt bytes, or a JSON error string (never raises into JS)."""
        try:
            copies_are_exact()  # the download (and a generation's state) would be corrupt
            return self.room.checkpoint()
        except DaisyError as exc:
            return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})

    async def bench(self, size: int, repeats: int) -> str:
        """Lead an all-reduce benchmark; JSON {ok, size, members, seconds, ...} or an error."""
        try:
            result = await self.room.bench(int(size), int(repeats))
        except (DaisyError, ValueError, TypeError) as exc:
            return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return json.dumps({"ok": True, **result})
