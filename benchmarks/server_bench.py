"""Server benchmark: signaling relay latency/throughput and /data transfer per slice.

    python benchmarks/server_bench.py                       # both parts, defaults
    python benchmarks/server_bench.py --rooms 50 --peers 4 --messages 200
    python benchmarks/server_bench.py --json                # one JSON object

Signaling: ROOMS auto rooms (one fake public address each, via X-Forwarded-For) of PEERS
websocket clients on loopback. Every peer sends MESSAGES offers of SDP_BYTES to the next
peer of its room as fast as the server accepts them (rate limits raised for the run);
latency is receive time minus send time of each relayed frame, on one clock.
Client and server share the machine, so the numbers are a floor for a real deployment.

/data: a FineWeb-Edu-shaped parquet shard is served by a local range-capable HTTP server;
for several steps the first slice of a step (footer on the first request, then one text
column chunk) and the other slices of the step (cache) are counted in bytes and compared
with the row group's compressed size and with downloading the whole shard.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import websocket

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from server import ServerConfig, create_app  # noqa: E402
from server.app import make_threaded_server  # noqa: E402


# ---------------------------------------------------------------- signaling
class Client:
    def __init__(self, url: str, address: str) -> None:
        self.ws = websocket.create_connection(url, timeout=30,
                                              header=[f"X-Forwarded-For: {address}"])
        self.ws.send(json.dumps({"v": 1, "type": "join"}))
        self.id = json.loads(self.ws.recv())["peer"]
        self.latencies: list[float] = []
        self.expected = 0

    def receive(self) -> None:
        while len(self.latencies) < self.expected:
            msg = json.loads(self.ws.recv())
            if msg["type"] == "offer":
                self.latencies.append(time.perf_counter() - float(msg["sdp"].split()[0]))


def bench_signaling(rooms: int, peers: int, messages: int, sdp_bytes: int,
                    rate: float) -> dict[str, Any]:
    """A paced run (each peer sends ``rate`` offers/s: relay latency at a realistic load)
    then a flood (everyone sends at once: relay throughput at saturation)."""
    cfg = ServerConfig(data_dir=Path(tempfile.mkdtemp()), trust_proxy_header="X-Forwarded-For",
                       rate_per_s=1e6, rate_burst=1e6, bytes_per_s=1e12, send_queue=1 << 16)
    httpd = make_threaded_server(create_app(cfg), "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"ws://127.0.0.1:{httpd.server_port}/ws"
    groups = [[Client(url, f"10.{r // 250}.{r % 250}.1") for _ in range(peers)]
              for r in range(rooms)]
    result: dict[str, Any] = {"rooms": rooms, "peers_per_room": peers,
                              "clients": rooms * peers, "sdp_bytes": sdp_bytes}
    for name, interval in (("paced", 1 / rate), ("flood", 0.0)):
        seconds, latencies = _exchange(groups, messages, "x" * sdp_bytes, interval)
        result[name] = {
            "offered_per_s": round(rate * rooms * peers) if interval else "max",
            "messages": len(latencies), "seconds": round(seconds, 3),
            "relayed_per_s": round(len(latencies) / seconds),
            "latency_ms": {f"p{p}": round(1000 * _percentile(latencies, p), 2)
                           for p in (50, 90, 99, 100)},
        }
    for group in groups:
        for client in group:
            client.ws.close()
    httpd.shutdown()
    return result


def _exchange(groups: list[list[Client]], messages: int, pad: str, interval: float
              ) -> tuple[float, list[float]]:
    """Every peer sends ``messages`` offers to the next peer of its room."""
    for group in groups:
        for client in group:
            client.latencies, client.expected = [], messages

    def send(client: Client, target: str) -> None:
        start = time.perf_counter()
        for k in range(messages):
            if interval:
                time.sleep(max(0.0, start + k * interval - time.perf_counter()))
            sdp = f"{time.perf_counter():.9f} {pad}"
            client.ws.send(json.dumps({"v": 1, "type": "offer", "to": target, "sdp": sdp}))

    pairs = [(g[i], g[(i + 1) % len(g)]) for g in groups for i in range(len(g))]
    receivers = [threading.Thread(target=c.receive) for g in groups for c in g]
    senders = [threading.Thread(target=send, args=(a, b.id)) for a, b in pairs]
    started = time.perf_counter()
    for t in receivers + senders:
        t.start()
    for t in senders + receivers:
        t.join()
    elapsed = time.perf_counter() - started
    return elapsed, sorted(x for g in groups for c in g for x in c.latencies)


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


# ---------------------------------------------------------------- /data
class _Counter:
    sent = 0


class _RangeHandler(BaseHTTPRequestHandler):
    root: Path

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        data = (self.root / self.path.lstrip("/")).read_bytes()
        spec = self.headers["Range"].removeprefix("bytes=")
        first, _, last = spec.partition("-")
        if not first:
            first, last = str(len(data) - int(last)), str(len(data) - 1)
        body = data[int(first): int(last) + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{int(first) + len(body) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        _Counter.sent += len(body)


def fineweb_like(rows: int, group_rows: int, path: Path) -> None:
    rnd = random.Random(0)
    words = [f"w{i}" for i in range(5000)] + ["the", "of", "and", "équation", "数学"]
    texts = [" ".join(rnd.choices(words, k=rnd.randint(200, 1500))) for _ in range(rows)]
    table = pa.table({
        "text": texts, "id": [f"<urn:uuid:{i}>" for i in range(rows)],
        "dump": ["CC-MAIN-2024-10"] * rows, "url": [f"https://e.org/{i}" for i in range(rows)],
        "date": ["2024-02-21"] * rows, "file_path": ["s3://cc/x"] * rows,
        "language": ["en"] * rows, "language_score": [0.9] * rows,
        "token_count": [len(t) // 4 for t in texts], "score": [3.5] * rows,
        "int_score": [4] * rows,
    })
    pq.write_table(table, path, row_group_size=group_rows)


def bench_data(steps: int, per_step: int, nbytes: int, rows: int, group_rows: int
               ) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp())
    shard = folder / "000_00000.parquet"
    fineweb_like(rows, group_rows, shard)
    handler = type("H", (_RangeHandler,), {"root": folder})
    files = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{files.server_port}/{shard.name}"
    app = create_app(ServerConfig(data_dir=folder / "state", data_urls=(url,)))
    client = app.test_client()
    meta = pq.read_metadata(shard)
    first_costs, other_costs, cold_ms, warm_ms, groups = [], [], [], [], []
    for step in range(steps):
        for index in range(per_step):
            before, t0 = _Counter.sent, time.perf_counter()
            body = client.get(f"/data?seed=1&step={step}&index={index}&bytes={nbytes}").json
            assert body["source"] == "parquet", body
            cost, ms = _Counter.sent - before, 1000 * (time.perf_counter() - t0)
            (first_costs if index == 0 else other_costs).append(cost)
            (cold_ms if index == 0 and cost else warm_ms).append(ms)
            groups.append(body["row_group"])
    files.shutdown()
    rg = [meta.row_group(i) for i in range(meta.num_row_groups)]
    group_bytes = [sum(g.column(c).total_compressed_size for c in range(g.num_columns)) for g in rg]
    text_bytes = [g.column(0).total_compressed_size for g in rg]
    return {
        "shard_bytes": shard.stat().st_size, "row_groups": meta.num_row_groups,
        "footer_bytes": int.from_bytes(shard.read_bytes()[-8:-4], "little") + 8,
        "row_group_bytes_mean": round(statistics.mean(group_bytes)),
        "text_chunk_bytes_mean": round(statistics.mean(text_bytes)),
        "first_slice_of_run_bytes": first_costs[0],
        "first_slice_of_step_bytes_mean": round(statistics.mean(first_costs[1:] or [0])),
        "other_slices_bytes_max": max(other_costs or [0]),
        "slice_bytes": nbytes, "slices": steps * per_step,
        "fetch_ms_median": round(statistics.median(cold_ms), 2) if cold_ms else None,
        "cached_ms_median": round(statistics.median(warm_ms), 2) if warm_ms else None,
        "distinct_row_groups": len(set(groups)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rooms", type=int, default=20)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=25, help="offers per peer per run")
    parser.add_argument("--sdp-bytes", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=5.0, help="paced offers/s per peer")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--per-step", type=int, default=8, help="microbatches per step")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    result = {
        "signaling": bench_signaling(args.rooms, args.peers, args.messages, args.sdp_bytes,
                                     args.rate),
        "data": bench_data(args.steps, args.per_step, 4096, rows=4000, group_rows=500),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for part, values in result.items():
            print(f"[{part}]")
            for key, value in values.items():
                print(f"  {key:32s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
