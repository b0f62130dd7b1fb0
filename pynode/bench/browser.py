"""`python -m pynode bench browser [--json]`: a training step in a Chromium tab against native.

    python -m pynode bench browser                 # the default config, 6 steps each
    python -m pynode bench browser --steps 10 --config '{"width": 32}' --json

In one run on this machine: our server (`python -m server` on 127.0.0.1) and Debian's
headless Chromium (Playwright, `executable_path` = `chromium` on PATH, never a downloaded
browser) open one tab, which boots Pyodide, verifies and trains the config alone; then
`python -m pynode train` trains the same config natively with one BLAS/OpenMP thread. Step
time is the median of the steps after the first. The report names each side's GEMM backend
and hot kernels, the CPU (model; avx2, avx512f, avx512_vnni, avx_vnni) and the thread
counts. A last part times the page's GEMM backends against each other in a worker of the
same browser, at the products a default-config step computes.

Needs the playwright package, `chromium` on PATH and the fetched runtime
(`python -m server.runtime fetch`). benchmarks/browser_bench.py (WebRTC all-reduce among
tabs) uses the same session with a private network namespace.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pynode
from pynode.bench import CONFIG_HELP, bench_parser

SOURCE_ROOT = Path(pynode.__file__).resolve().parent.parent  # holds pynode/ and server/
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni")
BOOT_TIMEOUT_MS = 300_000
# (M, K, N) of the default config's GEMMs: 512 tokens (8 x 64), width 64, MLP 256, vocab 256;
# and the attention products (B*H, T, Dh) = (32, 64, 16).
STEP_SHAPES = ((512, 64, 192), (512, 64, 256), (512, 256, 64), (64, 512, 256), (512, 192, 64))
STEP_BATCHED = ((32, 64, 16, 64), (32, 64, 64, 16))

# A Web Worker from a blob (the CSP allows them) that boots Pyodide, numpy and the pynode
# bundle from `base`, as the page's worker does, writes `files` and runs `code`; it answers
# {ok, result: the value of the code's last expression as a string} or {ok: false, error}.
WORKER = """
self.onmessage = async (event) => {
  const { base, files, code } = event.data;
  try {
    importScripts(base + "/runtime/pyodide.js");
    const pyodide = await loadPyodide({ indexURL: base + "/runtime/" });
    await pyodide.loadPackage("numpy", { messageCallback: () => {}, checkIntegrity: true });
    const zip = await (await fetch(base + "/bundle/pynode.zip")).arrayBuffer();
    pyodide.unpackArchive(new Uint8Array(zip), "zip", { extractDir: "/home/pyodide/bundle" });
    pyodide.runPython("import sys; sys.path.insert(0, '/home/pyodide/bundle')");
    for (const [path, text] of Object.entries(files)) {
      pyodide.FS.mkdirTree(path.slice(0, path.lastIndexOf("/")));
      pyodide.FS.writeFile(path, text);
    }
    self.postMessage({ ok: true, result: String(pyodide.runPython(code)) });
  } catch (err) {
    self.postMessage({ ok: false, error: String((err && err.stack) || err) });
  }
};
"""
RUN_WORKER = """([worker, message]) => new Promise((resolve) => {
  const url = URL.createObjectURL(new Blob([worker], { type: "text/javascript" }));
  const w = new Worker(url);
  w.onmessage = (event) => { w.terminate(); resolve(event.data); };
  w.onerror = (event) => resolve({ ok: false, error: event.message });
  w.postMessage(message);
})"""


class BrowserSession:
    """Our server and headless Chromium, both inside `net` (a private network namespace,
    e2e/private_net.py, which WebRTC between tabs needs) or on 127.0.0.1 without one."""

    def __init__(self, tmp: Path, net: Any = None, flags: list[str] | None = None) -> None:
        from playwright.sync_api import sync_playwright

        chromium = shutil.which("chromium")
        if chromium is None:
            raise RuntimeError("Debian's chromium is not on PATH (apt-get install chromium)")
        host = net.address if net is not None else "127.0.0.1"
        cmd = [sys.executable, "-m", "server", "--host", host, "--port", "0",
               "--data-dir", str(tmp / "server"), "--log-level", "WARNING"]
        popen = net.popen if net is not None else subprocess.Popen
        self.server = popen(cmd, cwd=SOURCE_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
        line = self.server.stdout.readline()
        found = re.search(r":(\d+)/", line)
        if not found:
            self.server.terminate()
            raise RuntimeError(f"the server did not start: {line}")
        self.base = f"http://{host}:{found.group(1)}"
        if net is not None:
            chromium = str(net.wrapper(tmp / "chromium", chromium))
        self.pw = sync_playwright().start()
        self.browser = self.pw.chromium.launch(executable_path=chromium,
                                               args=flags or CHROMIUM_FLAGS)

    def tab(self, query: str = "?create=1") -> Any:
        page = self.browser.new_context().new_page()
        page.goto(f"{self.base}/{query}")
        page.wait_for_function("() => window.daisychain && daisychain.status().peerId")
        return page

    def run_python(self, code: str, files: dict[str, str] | None = None) -> str:
        """Run `code` in a fresh Pyodide worker of this origin; the last expression as str."""
        context = self.browser.new_context()
        try:
            return run_python_in_worker(context, self.base, code, files)
        finally:
            context.close()

    def close(self) -> None:
        self.browser.close()
        self.pw.stop()
        self.server.terminate()
        self.server.wait(timeout=30)


def run_python_in_worker(context: Any, base: str, code: str,
                         files: dict[str, str] | None = None) -> str:
    """Boot Pyodide + numpy + the bundle from `base` in a Web Worker of a new page of
    `context` (a Playwright browser context), write `files` ({path: text}) into its file
    system and run `code`; returns its last expression as a string, RuntimeError if it
    raised."""
    page = context.new_page()
    page.set_default_timeout(BOOT_TIMEOUT_MS)
    page.goto(f"{base}/runtime/")  # any document of this origin can host the worker
    answer = page.evaluate(RUN_WORKER, [WORKER, {"base": base, "files": files or {},
                                                 "code": code}])
    page.close()
    if not answer["ok"]:
        raise RuntimeError(f"Python in the worker failed: {answer['error']}")
    return answer["result"]


def page_status(page: Any) -> dict:
    return page.evaluate("() => daisychain.status()")


def wait_page(page: Any, predicate: str, timeout_ms: int) -> None:
    page.wait_for_function(f"() => ({predicate})(daisychain.status())", timeout=timeout_ms)


def tab_steps(session: BrowserSession, config: dict) -> dict:
    """One tab boots, verifies and trains `config` alone: boot seconds, step seconds, GEMM
    backend and hot kernels."""
    started = time.perf_counter()
    page = session.tab()
    wait_page(page, "s => ['ready', 'failed'].includes(s.state)", BOOT_TIMEOUT_MS)
    boot = time.perf_counter() - started
    booted = page_status(page)
    if booted["state"] != "ready":
        page.context.close()
        raise RuntimeError(f"the tab could not start: {booted['error']} (is the Pyodide "
                           "runtime fetched? `python -m server.runtime fetch`)")
    page.evaluate("(c) => daisychain.start(c)", config)
    wait_page(page, "s => ['done', 'failed'].includes(s.state)", 60_000 * config["steps"])
    s = page_status(page)
    page.context.close()
    if s["state"] != "done":
        raise RuntimeError(f"the tab did not finish: {s['error']}")
    return {"boot_seconds": boot, "step_seconds": [h["seconds"] for h in s["history"]],
            "backend": s["gemm"], "kernels": s["kernels"], "hash": s["hash"]}


def native_steps(config: dict, tmp: Path, threads: str | None = "1", popen: Any = None) -> dict:
    """`python -m pynode train` of `config` with `threads` BLAS/OpenMP threads (None: default)."""
    log = tmp / f"native-{threads}.jsonl"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in sorted(config.items())]
    env = {**os.environ, **({k: threads for k in ONE_THREAD} if threads else {})}
    done = subprocess.run([sys.executable, "-m", "pynode", "train", *flags, "--log", str(log),
                           "--no-progress"], cwd=SOURCE_ROOT, check=True, capture_output=True,
                          text=True, env=env)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    backend = re.search(r"backend (\S+)", done.stderr)  # the CLI reports on stderr
    kernels = re.search(r"kernels (\S+)", done.stderr)
    return {"step_seconds": [r["seconds"] for r in rows], "hash": rows[-1]["hash"],
            "backend": backend.group(1) if backend else None,
            "kernels": kernels.group(1) if kernels else None}


def _per_call(f: Any, reps: int) -> float:
    started = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - started) / reps


def page_gemm_rows(rounds: int = 5, round_seconds: float = 0.02) -> str:
    """(Runs in the page's Pyodide.) Each page backend at STEP_SHAPES, as JSON rows: the best
    of `rounds` alternating rounds, each repeating the call for ~`round_seconds` (a page's
    clock is coarse, 0.1 ms in Chromium)."""
    import numpy as np

    from pynode.browser_gemm import WasmSimdBackend
    from pynode.core.gemm.numpy_int import NumpyIntBackend

    wasm, numpy_int = WasmSimdBackend(), NumpyIntBackend()
    operands = np.random.default_rng(0)
    rows = []
    for shape in (*[(1, *s) for s in STEP_SHAPES], *STEP_BATCHED):
        bs, m, k, n = shape
        a = operands.integers(-128, 128, (bs, m, k), dtype=np.int8)
        b = operands.integers(-128, 128, (bs, k, n), dtype=np.int8)
        if not np.array_equal(wasm.bmm(a, b), numpy_int.bmm(a, b)):
            raise AssertionError(f"wasm_simd and numpy_int differ at {shape}")
        calls = [functools.partial(wasm.bmm, a, b), functools.partial(numpy_int.bmm, a, b)]
        reps = [max(1, int(round_seconds / max(_per_call(f, 1), 1e-4))) for f in calls]
        best = [float("inf")] * 2
        for _ in range(rounds):  # alternating, so load from other processes hits both alike
            for i in (0, 1):
                best[i] = min(best[i], _per_call(calls[i], reps[i]))
        rows.append({"shape": list(shape), "wasm_simd_ms": 1e3 * best[0],
                     "numpy_int_ms": 1e3 * best[1], "speedup": best[1] / best[0],
                     "wasm_simd_gmac_s": bs * m * k * n / best[0] / 1e9})
    return json.dumps(rows)


def cpu_info() -> dict:
    """Model name, which of CPU_FLAGS the CPU has, and the cores this process may use."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        import platform

        model = platform.processor() or platform.machine()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": model, "flags": {f: f in flags for f in CPU_FLAGS}, "cores": cores}


def measure(config: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="pynode-bench-browser-") as tmp_name:
        tmp = Path(tmp_name)
        session = BrowserSession(tmp)
        try:
            tab = tab_steps(session, config)
            gemm = json.loads(session.run_python(
                "from pynode.bench.browser import page_gemm_rows\npage_gemm_rows()"))
            version = session.browser.version
        finally:
            session.close()
        native = native_steps(config, tmp, "1")
    tab_ms = 1e3 * statistics.median(tab["step_seconds"][1:] or tab["step_seconds"])
    native_ms = 1e3 * statistics.median(native["step_seconds"][1:] or native["step_seconds"])
    return {
        "config": config,
        "tab_step_ms": tab_ms,
        "native_step_ms": native_ms,
        "tab_over_native": tab_ms / native_ms,
        "same_hash": tab["hash"] == native["hash"],
        "tab_backend": tab["backend"],
        "native_backend": native["backend"],
        "tab_kernels": tab["kernels"],
        "native_kernels": native["kernels"],
        "tab_boot_s": tab["boot_seconds"],
        "threads": {"tab": 1, "native_blas": 1, "cores": cpu_info()["cores"]},
        "cpu": cpu_info(),
        "chromium": version,
        "page_gemm": gemm,
    }


def main(argv: list[str]) -> int:
    from pynode.config import RunConfig

    parser = bench_parser("browser", __doc__)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument("--steps", type=int, default=6, help="steps on each side")
    parser.add_argument("--config", default="{}", help=CONFIG_HELP)
    args = parser.parse_args(argv)
    cfg = RunConfig.from_dict({**json.loads(args.config), "steps": args.steps})
    try:
        report = measure(json.loads(cfg.to_json()))
    except RuntimeError as exc:  # no browser, the server or the tab could not start
        print(f"bench browser: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0
    cpu = report["cpu"]
    flags = " ".join(f for f, has in cpu["flags"].items() if has) or "none of " + str(CPU_FLAGS)
    print(f"config {cfg.to_json()}")
    print(f"cpu {cpu['model']} ({flags}); {cpu['cores']} cores; Chromium {report['chromium']}")
    print(f"tab     {report['tab_step_ms']:8.1f} ms/step  backend {report['tab_backend']:<10} "
          f"kernels {report['tab_kernels']!s:<6} 1 thread (Pyodide worker); boot to "
          f"verified {report['tab_boot_s']:.1f} s")
    print(f"native  {report['native_step_ms']:8.1f} ms/step  backend "
          f"{report['native_backend']:<10} kernels {report['native_kernels']!s:<6} "
          "1 BLAS/OpenMP thread")
    print(f"tab / native = {report['tab_over_native']:.2f}   same final hash: "
          f"{report['same_hash']}")
    print("page GEMM (best of 5; ms)   wasm_simd  numpy_int  speed-up  wasm GMAC/s")
    for row in report["page_gemm"]:
        shape = "x".join(map(str, row["shape"]))
        print(f"  {shape:<24} {row['wasm_simd_ms']:9.3f} {row['numpy_int_ms']:10.2f} "
              f"{row['speedup']:9.1f} {row['wasm_simd_gmac_s']:12.1f}")
    return 0
