"""The browser peer against native: step time of one config, and the WebRTC mesh all-reduce.

    python benchmarks/browser_bench.py            # table
    python benchmarks/browser_bench.py --json     # one JSON object

1. Step time: the same config trained by one tab (Pyodide in a Web Worker, its gated GEMM)
   and by `python -m pynode train` on this machine, with one BLAS thread (what a tab has)
   and with the default threads; median of the steps after the first.
2. All-reduce: `--repeats` reductions of `--size` int64 (8 bytes each) among 2 and then 3
   tabs over WebRTC data channels (reduce-scatter + all-gather, pynode.comm.webrtc). Two
   references from the same run: one raw data channel in a tab pushing the same number of
   bytes one way in 48 KiB messages (what the browser's SCTP gives, no Python, no
   reduction), and the same collective over the in-process MemoryNetwork (no network, no
   JS). MB/s is vector megabytes / median seconds per reduction.

Needs what the e2e tests need: root (a private network namespace), Debian's chromium, the
playwright package and the fetched runtime. Everything runs inside the namespace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "e2e"))
sys.path.insert(0, str(REPO))

from browser_helpers import (  # noqa: E402
    CHROMIUM_FLAGS,
    status,
    wait,
    wait_booted,
    wait_trainable,
)
from private_net import PrivateNet  # noqa: E402

from pynode.bench.browser import BrowserSession, native_steps  # noqa: E402

CONFIG = {"task": "gpt", "width": 64, "layers": 2, "heads": 4, "seq": 64, "microbatch_size": 8,
          "microbatches": 4, "lr": 0.003, "seed": 1}


# One data channel between two connections of one page: `total` bytes one way in `frag`-byte
# messages, fed while bufferedAmount < `high`. Resolves to milliseconds until all arrived.
RAW_CHANNEL = """async ([total, frag, high]) => {
  const a = new RTCPeerConnection(), b = new RTCPeerConnection();
  a.onicecandidate = (e) => e.candidate && b.addIceCandidate(e.candidate);
  b.onicecandidate = (e) => e.candidate && a.addIceCandidate(e.candidate);
  const da = a.createDataChannel("d", { negotiated: true, id: 0 });
  const db = b.createDataChannel("d", { negotiated: true, id: 0 });
  db.binaryType = "arraybuffer";
  await a.setLocalDescription(await a.createOffer());
  await b.setRemoteDescription(a.localDescription);
  await b.setLocalDescription(await b.createAnswer());
  await a.setRemoteDescription(b.localDescription);
  await new Promise((r) => (da.readyState === "open" ? r() : (da.onopen = r)));
  let got = 0, sent = 0;
  const t0 = performance.now();
  const done = new Promise((r) => (db.onmessage = (e) => {
    got += e.data.byteLength;
    if (got >= total) r(performance.now() - t0);
  }));
  const chunk = new Uint8Array(frag);
  da.bufferedAmountLowThreshold = high / 4;
  const pump = () => {
    while (sent < total && da.bufferedAmount < high) { da.send(chunk); sent += frag; }
  };
  da.onbufferedamountlow = pump;
  pump();
  const ms = await done;
  a.close(); b.close();
  return ms;
}"""


def memory_allreduce_seconds(members: int, size: int, repeats: int) -> list[float]:
    import numpy as np

    from pynode.comm.mesh import MemoryNetwork
    from pynode.comm.webrtc import connect

    async def body() -> list[float]:
        net = MemoryNetwork()
        ids = [f"p{i}" for i in range(members)]
        colls = [await connect(net.join(i), ids, group=1) for i in ids]
        x = np.ones(size, np.int64)
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            await asyncio.gather(*(c.allreduce_int64(x, timeout=120) for c in colls))
            seconds.append(time.perf_counter() - started)
        return seconds

    return asyncio.run(body())


def browser_numbers(config: dict, size: int, repeats: int, tmp: Path) -> dict:
    out: dict = {}
    with PrivateNet() as net:
        browser = BrowserSession(tmp, net, CHROMIUM_FLAGS)
        try:
            started = time.perf_counter()
            host = browser.tab("?create=1")
            wait_booted(host)
            out["boot_seconds"] = time.perf_counter() - started
            host.evaluate("(c) => daisychain.start(c)", config)
            wait(host, "s => ['done', 'failed'].includes(s.state)", 600_000)
            out["step_seconds"] = [h["seconds"] for h in status(host)["history"]]
            out["hash"] = status(host)["hash"]
            out["raw_channel_ms"] = [host.evaluate(RAW_CHANNEL, [size * 8, 48 * 1024, 4 << 20])
                                     for _ in range(repeats)]
            room = status(host)["room"]
            tabs = []
            for members in (2, 3):
                tab = browser.tab(f"?room={room}")
                host.evaluate("(id) => daisychain.approve(id)", status(tab)["peerId"])
                tabs.append(tab)
                wait_booted(tab)
                wait_trainable(host, [status(t)["peerId"] for t in tabs])
                result = host.evaluate("([n, r]) => daisychain.benchAllreduce(n, r)",
                                       [size, repeats])
                assert result["exact"] and result["members"] == members, result
                out[f"allreduce_{members}"] = result
        finally:
            browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--size", type=int, default=1_000_000, help="int64 per all-reduce")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    config = {**CONFIG, "steps": args.steps}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        native = {t: native_steps(config, tmp, t)["step_seconds"] for t in ("1", None)}
        page = browser_numbers(config, args.size, args.repeats, tmp)
    memory = {n: memory_allreduce_seconds(n, args.size, args.repeats) for n in (2, 3)}
    megabytes = args.size * 8 / 1e6
    webrtc = {n: statistics.median(page[f"allreduce_{n}"]["seconds"]) for n in (2, 3)}
    report = {
        "config": config,
        "native_step_ms_1_thread": 1000 * statistics.median(native["1"][1:]),
        "native_step_ms": 1000 * statistics.median(native[None][1:]),
        "browser_step_ms": 1000 * statistics.median(page["step_seconds"][1:]),
        "browser_boot_s": page["boot_seconds"],
        "vector_mb": megabytes,
        "raw_channel_mb_s": megabytes / (statistics.median(page["raw_channel_ms"]) / 1000),
        "allreduce": {
            str(n): {"webrtc_ms": 1000 * webrtc[n], "webrtc_mb_s": megabytes / webrtc[n],
                     "bytes_sent_per_reduce": page[f"allreduce_{n}"]["bytes_sent"] / args.repeats,
                     "memory_ms": 1000 * statistics.median(memory[n]),
                     "memory_mb_s": megabytes / statistics.median(memory[n])}
            for n in (2, 3)
        },
    }
    if args.json:
        print(json.dumps(report))
        return 0
    ratio = report["browser_step_ms"] / report["native_step_ms_1_thread"]
    print(f"step time, {config}")
    print(f"  native, 1 BLAS thread   {report['native_step_ms_1_thread']:8.1f} ms")
    print(f"  native, default threads {report['native_step_ms']:8.1f} ms")
    print(f"  browser tab             {report['browser_step_ms']:8.1f} ms  ({ratio:.1f}x native "
          f"on one thread; boot to verified {report['browser_boot_s']:.1f} s)")
    print(f"all-reduce of {args.size:,} int64 ({megabytes:.0f} MB), median of {args.repeats}; "
          f"one raw data channel moves {report['raw_channel_mb_s']:.1f} MB/s one way")
    for n, row in report["allreduce"].items():
        print(f"  {n} tabs  webrtc {row['webrtc_ms']:8.1f} ms {row['webrtc_mb_s']:7.1f} MB/s   "
              f"in-process {row['memory_ms']:7.1f} ms {row['memory_mb_s']:7.1f} MB/s   "
              f"sent/peer {row['bytes_sent_per_reduce'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
