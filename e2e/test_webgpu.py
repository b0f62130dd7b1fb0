"""The WebGPU GEMM backend in a real page: exact gate, bit-equal products, native hashes.

One tab at http://localhost (a secure context, which WebGPU needs) served by the real
server; Chromium with `--enable-unsafe-webgpu` gets SwiftShader's adapter, without it
none, and the page must then say WebGPU is unavailable and train on the CPU backends.
Products are compared through sha256 of the int32 result with numpy's int64 matmul of
the same seeded operands computed here, natively.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from browser_helpers import BOOT_TIMEOUT_MS, CHROMIUM_FLAGS, status, unavailable, wait
from local_page import WEBGPU_FLAGS, LocalServer, open_page

from pynode.browser import case_operands
from pynode.webgpu_gemm import MIN_BINDING_BYTES

pytestmark = [pytest.mark.slow]

SMALL = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
         "microbatches": 4, "steps": 3, "lr": 0.003, "seed": 11}
MAX_K = 131_071


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    if importlib.util.find_spec("playwright") is None:
        unavailable("the playwright package is not installed")
    if shutil.which("chromium") is None:
        unavailable("Debian's chromium is not installed (apt-get install chromium)")
    from server.runtime import RuntimeMissingError, runtime_dir

    try:
        runtime_dir()
    except RuntimeMissingError as exc:
        unavailable(str(exc))
    local = LocalServer(tmp_path_factory.mktemp("server-data"))
    yield local
    local.close()


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def gpu_browser(playwright, server) -> Iterator[Any]:
    browser = playwright.chromium.launch(executable_path=shutil.which("chromium"),
                                         args=WEBGPU_FLAGS)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def plain_browser(playwright, server) -> Iterator[Any]:
    browser = playwright.chromium.launch(executable_path=shutil.which("chromium"),
                                         args=CHROMIUM_FLAGS)
    yield browser
    browser.close()


def booted(page: Any) -> dict:
    wait(page, "s => ['ready', 'failed'].includes(s.state)", BOOT_TIMEOUT_MS)
    return status(page)


def native_sha256(case: dict) -> str:
    a, b = case_operands(case)
    out = np.matmul(a.astype(np.int64), b.astype(np.int64))
    assert np.all(np.abs(out) < 2**31)
    return hashlib.sha256(out.astype(np.int32).tobytes()).hexdigest()


def gemm_cases() -> list[dict]:
    """Tails of the 16 x 16 workgroup tile in M and N, K not a multiple of 4, batches, the
    int8 extremes up to the int32 bound, products cut into pieces, and random shapes."""
    shapes = [  # (batch (0: matmul), M, K, N, fill, max_binding_bytes)
        (0, 1, 1, 1, "random", 0), (0, 16, 4, 16, "random", 0), (0, 17, 5, 33, "random", 0),
        (0, 33, 130, 47, "random", 0), (0, 100, 1027, 3, "random", 0),
        (0, 3, 2049, 70, "random", 0), (4, 9, 67, 21, "random", 0), (2, 31, 1, 17, "random", 0),
        (3, 16, 63, 15, "random", 0),
        (0, 5, MAX_K, 3, "min", 0), (0, 7, 1000, 9, "max", 0), (2, 3, 4099, 5, "min", 0),
        (0, 300, 1000, 200, "random", MIN_BINDING_BYTES),
        (0, 4, MAX_K, 3, "min", MIN_BINDING_BYTES),
        (3, 40, 700, 30, "random", MIN_BINDING_BYTES),
    ]
    rng = np.random.default_rng(2024)
    for _ in range(8):
        shapes.append((int(rng.choice([0, 0, 1, 3])), int(rng.integers(1, 70)),
                       int(rng.integers(1, 300)), int(rng.integers(1, 70)), "random", 0))
    return [{"backend": "webgpu", "batch": bs, "m": m, "k": k, "n": n, "seed": i, "fill": fill,
             "repeats": 1, "max_binding_bytes": cap}
            for i, (bs, m, k, n, fill, cap) in enumerate(shapes)]


def test_webgpu_passes_the_gate_and_equals_the_reference(gpu_browser, server, console):
    page = open_page(gpu_browser, f"{server.url}/?backend=webgpu", console)
    state = booted(page)
    assert state["state"] == "ready", state["error"]
    assert state["backend"] == "webgpu" and state["webgpu"].startswith("available: "), state
    gate = [r for r in state["checks"] if r["check"] == "exact gate"]
    assert [(r["backend"], r["passed"]) for r in gate] == [("webgpu", True)], gate
    cases = gemm_cases()
    results = page.evaluate("(cases) => daisychain.gemm(cases)", cases)
    wrong = []
    for case, got in zip(cases, results, strict=True):
        assert "error" not in got, got
        expected_shape = ([case["batch"]] if case["batch"] else []) + [case["m"], case["n"]]
        assert got["shape"] == expected_shape and got["dtype"] == "int32", got
        if got["sha256"] != native_sha256(case):
            wrong.append(case)
    assert wrong == [], f"{len(wrong)} of {len(cases)} products differ: {wrong}"


def train(page: Any, config: dict) -> dict:
    answer = page.evaluate("(c) => daisychain.start(c)", config)
    assert answer["ok"], answer
    wait(page, "s => ['done', 'failed'].includes(s.state)", 240_000)
    return status(page)


def assert_native_steps(state: dict, native: list[dict]) -> None:
    assert state["state"] == "done", state["error"]
    assert [(h["step"], h["hash"]) for h in state["history"]] == \
        [(r["step"], r["hash"]) for r in native]
    assert state["probe"] == native[-1]["probe"]


def test_a_run_forced_onto_webgpu_has_the_native_hashes(gpu_browser, server, console,
                                                         native_reference):
    page = open_page(gpu_browser, f"{server.url}/?backend=webgpu", console)
    assert booted(page)["backend"] == "webgpu"
    assert_native_steps(train(page, SMALL), native_reference(SMALL))


def test_without_the_flag_webgpu_is_unavailable_and_the_page_trains(plain_browser, server,
                                                                    console, native_reference):
    page = open_page(plain_browser, f"{server.url}/", console)
    state = booted(page)
    assert state["state"] == "ready", state["error"]
    assert state["webgpu"].startswith("unavailable: webgpu: ") and "adapter" in state["webgpu"]
    assert state["backend"] == "wasm_simd"  # the page's first CPU backend
    assert_native_steps(train(page, SMALL), native_reference(SMALL))
    forced = open_page(plain_browser, f"{server.url}/?backend=webgpu", console)
    state = booted(forced)
    assert state["state"] == "failed" and "unavailable: webgpu: " in state["error"], state
