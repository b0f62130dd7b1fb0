"""The page's WebGPU GEMM against numpy_int in the same tab: products and training steps.

    python benchmarks/webgpu_bench.py            # table
    python benchmarks/webgpu_bench.py --json     # one JSON object

One tab at http://localhost (WebGPU needs a secure context), Chromium with
`--enable-unsafe-webgpu`: headless, that is SwiftShader's adapter, a GPU emulated on the
CPU, so this measures the backend's plumbing and a software rasterizer, not a GPU.
1. Products: `daisychain.gemm` times each backend's raw matmul/bmm on seeded int8
   operands (best of `--repeats`) and hashes the result; both backends must agree.
2. Steps: the same config trained by a tab forced onto each backend (`?backend=`);
   median step seconds after the first, and the per-step hashes, which must agree.

Needs Debian's chromium, the playwright package and the fetched runtime; no root.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "e2e"))
sys.path.insert(0, str(REPO))

from browser_helpers import BOOT_TIMEOUT_MS, status, wait  # noqa: E402
from local_page import WEBGPU_FLAGS, LocalServer, open_page  # noqa: E402

BACKENDS = ("numpy_int", "webgpu")
SHAPES = [(0, 64, 64, 64), (0, 256, 256, 256), (0, 512, 512, 512), (8, 64, 64, 64),
          (0, 128, 64, 192)]  # (batch (0: matmul), M, K, N)
CONFIG = {"task": "gpt", "width": 64, "layers": 2, "heads": 4, "seq": 48, "microbatch_size": 4,
          "microbatches": 4, "steps": 5, "lr": 0.003, "seed": 12}


def products(page, repeats: int) -> list[dict]:
    cases = [{"backend": name, "batch": bs, "m": m, "k": k, "n": n, "seed": 1, "fill": "random",
              "repeats": repeats} for bs, m, k, n in SHAPES for name in BACKENDS]
    results = page.evaluate("(cases) => daisychain.gemm(cases)", cases)
    rows = []
    for i in range(0, len(results), len(BACKENDS)):
        pair = results[i:i + len(BACKENDS)]
        assert len({r["sha256"] for r in pair}) == 1, f"backends disagree: {pair}"
        row = {"shape": pair[0]["shape"], "k": pair[0]["k"]}
        for r in pair:
            row[f"{r['backend']}_ms"] = 1000 * r["seconds"]
        rows.append(row)
    return rows


def steps(browser, url: str, console: list[str]) -> dict:
    found = {}
    for name in BACKENDS:
        page = open_page(browser, f"{url}/?backend={name}", console)
        wait(page, "s => ['ready', 'failed'].includes(s.state)", BOOT_TIMEOUT_MS)
        assert status(page)["backend"] == name, status(page)["error"]
        page.evaluate("(c) => daisychain.start(c)", CONFIG)
        wait(page, "s => ['done', 'failed'].includes(s.state)", 600_000)
        history = status(page)["history"]
        page.context.close()
        found[name] = {"median_step_s": statistics.median(h["seconds"] for h in history[1:]),
                       "hashes": [h["hash"] for h in history]}
    assert found["numpy_int"]["hashes"] == found["webgpu"]["hashes"], "step hashes differ"
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    console: list[str] = []
    server = LocalServer(Path(tempfile.mkdtemp(prefix="webgpu-bench-")))
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=shutil.which("chromium"),
                                         args=WEBGPU_FLAGS)
            page = open_page(browser, f"{server.url}/?backend=webgpu", console)
            wait(page, "s => ['ready', 'failed'].includes(s.state)", BOOT_TIMEOUT_MS)
            state = status(page)
            assert state["backend"] == "webgpu", state["error"]
            gate = next(r for r in state["checks"] if r["backend"] == "webgpu")
            result = {"adapter": state["webgpu"], "gate_s": gate["seconds"],
                      "products": products(page, args.repeats)}
            page.context.close()
            result["steps"] = steps(browser, server.url, console)
            browser.close()
    finally:
        server.close()
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"adapter: {result['adapter']}; webgpu exact gate {result['gate_s']:.2f} s")
    print(f"{'product':>22} {'numpy_int ms':>13} {'webgpu ms':>10} {'ratio':>6}")
    for row in result["products"]:
        shape = "x".join(map(str, row["shape"])) + f" K={row['k']}"
        ratio = row["webgpu_ms"] / max(row["numpy_int_ms"], 1e-3)
        print(f"{shape:>22} {row['numpy_int_ms']:13.1f} {row['webgpu_ms']:10.1f} {ratio:6.1f}")
    for name, found in result["steps"].items():
        print(f"step ({name}): median {found['median_step_s']:.3f} s; hashes agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
