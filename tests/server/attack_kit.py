"""Attacks on `python -m server`, as one anonymous client on one machine would make them.

Each scenario runs against a real server process on loopback (`ServerProcess`, optionally
under a lowered descriptor limit) and returns what it measured; test_attacks.py asserts
what must hold, benchmarks/server_attack_bench.py records the figures in docs/SERVER.md.
Attackers and bystanders connect from different loopback addresses (127.0.0.0/8 is all
loopback on Linux), so the server sees them as different clients.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import websocket
from server_testkit import Peer, bound_socket

REPO = Path(__file__).resolve().parents[2]
ATTACKER = "127.0.0.1"
BYSTANDERS = "127.0.0.2"
NEWCOMER = "127.0.0.3"


class ServerProcess:
    """``python -m server`` on a free loopback port, its log in a file."""

    def __init__(self, folder: Path, config: dict[str, Any] | None = None,
                 fd_limit: int | None = None, extra_args: tuple[str, ...] = (),
                 command: list[str] | None = None, port: int = 0) -> None:
        """``command``: another server of the same app (the benchmark's gunicorn), given
        as a command line with ``{port}`` in it; it must listen on that port. ``port``: the
        port of ``python -m server`` (0: a free one); one started on the port and folder of a
        stopped one is that server restarted, with its secret (its log starts over)."""
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / "server.log"
        cfg_path = folder / "config.json"
        cfg_path.write_text(json.dumps(config or {}))
        cmd = [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", str(port),
               "--data-dir", str(folder / "state"), "--config", str(cfg_path),
               "--log-level", "INFO", *extra_args]
        env = {**os.environ, "PYTHONPATH": str(REPO),
               "DAISYCHAIN_SERVER_DATA": str(folder / "state")}
        if command is not None:
            free = socket.socket()
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
            free.close()
            cmd = [part.replace("{port}", str(port)) for part in command]

        def lower_limit() -> None:
            if fd_limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, preexec_fn=lower_limit)
        if command is not None:
            self.port = port
            _wait_listening(port, self)
        else:
            line = self.proc.stdout.readline()
            found = re.search(r":(\d+)/", line)
            if not found:
                self.stop()
                raise RuntimeError(f"the server did not start: {line!r}\n{self.log()}")
            self.port = int(found.group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tracebacks(self) -> int:
        return self.log().count("Traceback")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def threads(self) -> int:
        return int(self._status()["Threads"])

    def rss_kib(self) -> int:
        return int(self._status()["VmRSS"].split()[0])

    def cpu_s(self) -> float:
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _status(self) -> dict[str, str]:
        lines = open(f"/proc/{self.proc.pid}/status").read().splitlines()
        return dict(line.split(":", 1) for line in lines if ":" in line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _wait_listening(port: int, server: ServerProcess, timeout: float = 30.0) -> None:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if server.proc.poll() is not None:
            raise RuntimeError(f"the server exited: {server.log()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError("the server did not listen in time")


def http_get(url: str, source: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url`` over a fresh connection from ``source``; (status, body)."""
    sock = bound_socket(url, source, timeout)
    try:
        path = url.split("/", 3)[3] if url.count("/") >= 3 else ""
        sock.sendall(f"GET /{path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    finally:
        sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, body


def time_to_serve(server: ServerProcess, source: str) -> float:
    """Seconds for a new client from ``source`` to get /healthz and join its auto room."""
    start = time.perf_counter()
    status, _ = http_get(server.url + "/healthz", source)
    assert status == 200, status
    peer = Peer(server.ws_url, source=source)
    try:
        assert peer.join()["state"] == "approved"
    finally:
        peer.close()
    return time.perf_counter() - start


class Bystanders:
    """Two approved peers of one auto room that relay offers to each other."""

    def __init__(self, server: ServerProcess, source: str = BYSTANDERS) -> None:
        self.a = Peer(server.ws_url, source=source)
        self.b = Peer(server.ws_url, source=source)
        self.a.join()
        self.b.join()
        self.a.sync()
        self.b.sync()

    def relay_latencies(self, count: int, gap_s: float = 0.01) -> list[float]:
        """Seconds from a's send to b's receipt, for ``count`` offers (b echoes nothing)."""
        out = []
        for i in range(count):
            start = time.perf_counter()
            self.a.send("offer", to=self.b.id, sdp=f"v=0 {i}")
            while True:
                msg = self.b.recv()
                if msg["type"] == "offer":
                    break
            out.append(time.perf_counter() - start)
            time.sleep(gap_s)
        return out

    def close(self) -> None:
        self.a.close()
        self.b.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------ scenarios
def many_sockets(server: ServerProcess, count: int = 2000) -> dict[str, Any]:
    """One address opens ``count`` websockets, then closes them all at once."""
    bystanders = Bystanders(server)
    opened: list[websocket.WebSocket] = []
    refused = 0
    for _ in range(count):
        try:
            opened.append(websocket.create_connection(
                server.ws_url, timeout=5, socket=bound_socket(server.ws_url, ATTACKER)))
        except (websocket.WebSocketBadStatusException, OSError):
            refused += 1
    peak_fds = server.open_fds()
    for ws in opened:
        ws.close(timeout=0)
    closed_at = time.perf_counter()
    connect_s = time_to_serve(server, NEWCOMER)
    latencies = bystanders.relay_latencies(200)
    after = time.perf_counter() - closed_at
    bystanders.close()
    return {"attempted": count, "accepted": len(opened), "refused": refused,
            "peak_server_fds": peak_fds, "newcomer_served_s": connect_s,
            "relay_p50_ms": 1000 * percentile(latencies, 0.5),
            "relay_p99_ms": 1000 * percentile(latencies, 0.99),
            "relayed": len(latencies), "measured_within_s": after,
            "tracebacks": server.tracebacks()}


def slowloris(server: ServerProcess, count: int = 1100, addresses: int = 1100,
              newcomers: int = 5) -> dict[str, Any]:
    """``count`` sockets that send half a request and stall, from ``addresses`` addresses."""
    stalled: list[socket.socket] = []
    failed = 0
    for i in range(count):
        n = i % addresses
        source = f"127.1.{n // 250}.{n % 250 + 1}"
        try:
            sock = bound_socket(server.url, source, timeout=5)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            stalled.append(sock)
        except OSError:
            failed += 1
    time.sleep(0.5)
    times = [time_to_serve(server, f"127.0.0.{10 + i}") for i in range(newcomers)]
    # Of the stalled sockets, how many the server has dropped meanwhile.
    dropped = 0
    for sock in stalled:
        sock.setblocking(False)
        try:
            if sock.recv(1) == b"":
                dropped += 1
        except BlockingIOError:
            pass
        except OSError:
            dropped += 1
        sock.close()
    return {"stalled": count, "addresses": addresses, "connect_failed": failed,
            "dropped_by_server": dropped, "newcomer_served_s": times,
            "worst_newcomer_s": max(times), "tracebacks": server.tracebacks()}


def idle_cost(server: ServerProcess, count: int = 500) -> dict[str, Any]:
    """What ``count`` open websockets cost the server, and what closing them all costs.

    They come from ``count // 50`` addresses (under the default per-address cap).
    """
    bystanders = Bystanders(server)
    base = (server.open_fds(), server.threads(), server.rss_kib())
    opened = [Peer(server.ws_url, source=f"127.0.2.{i // 50 + 1}") for i in range(count)]
    for peer in opened:
        peer.send("ping", t=1)
    for peer in opened:
        peer.expect("pong")
    full = (server.open_fds(), server.threads(), server.rss_kib())
    cpu_before = server.cpu_s()
    for peer in opened:
        peer.ws.close(timeout=0)
    closed_at = time.perf_counter()
    served_s = time_to_serve(server, NEWCOMER)
    latencies = bystanders.relay_latencies(100)
    time.sleep(1.0)
    bystanders.close()
    return {"sockets": count,
            "fds_per_socket": (full[0] - base[0]) / count,
            "threads_per_socket": (full[1] - base[1]) / count,
            "rss_kib_per_socket": (full[2] - base[2]) / count,
            "close_storm_cpu_s": server.cpu_s() - cpu_before,
            "newcomer_served_after_close_s": served_s,
            "relay_p50_ms": 1000 * percentile(latencies, 0.5),
            "relay_p99_ms": 1000 * percentile(latencies, 0.99),
            "within_s": time.perf_counter() - closed_at}


def flood(server: ServerProcess, flooders: int = 50, seconds: float = 5.0,
          rate: float = 50.0) -> dict[str, Any]:
    """``flooders`` connections (10 per address) ping at ``rate`` frames/s each (the default
    sustained budget) while a bystander room relays; its latency before and during."""
    import threading

    bystanders = Bystanders(server)
    quiet = bystanders.relay_latencies(100)
    stop = threading.Event()
    sent = [0] * flooders

    def run(i: int) -> None:
        peer = Peer(server.ws_url, source=f"127.0.4.{i // 10 + 1}")
        gap = 1.0 / rate
        next_at = time.perf_counter()
        try:
            while not stop.is_set():
                peer.send("ping", t=sent[i])
                peer.recv()
                sent[i] += 1
                next_at += gap
                time.sleep(max(0.0, next_at - time.perf_counter()))
        except (OSError, websocket.WebSocketException):
            pass
        finally:
            peer.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(flooders)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    start = time.perf_counter()
    loud = bystanders.relay_latencies(int(seconds * 50), gap_s=0.02)
    elapsed = time.perf_counter() - start
    stop.set()
    for thread in threads:
        thread.join(timeout=5)
    bystanders.close()
    return {"flooders": flooders, "flood_frames_per_s": sum(sent) / (elapsed + 1.0),
            "quiet_p50_ms": 1000 * percentile(quiet, 0.5),
            "quiet_p99_ms": 1000 * percentile(quiet, 0.99),
            "flood_p50_ms": 1000 * percentile(loud, 0.5),
            "flood_p99_ms": 1000 * percentile(loud, 0.99), "tracebacks": server.tracebacks()}


# Fuzz values: huge integers first among them.
HUGE = [10**400, -(10**400), 9 * 10**3000, 2**64, 2**53 + 1, 1e308, -1e308]


def _fuzz_value(rnd: random.Random) -> Any:
    pick = rnd.random()
    if pick < 0.35:
        return rnd.choice(HUGE)
    if pick < 0.5:
        return rnd.choice([None, True, False, 0, -1, 1.5, "", "x" * rnd.randint(1, 3000)])
    if pick < 0.6:
        return [rnd.choice(HUGE)] * rnd.randint(0, 3)
    if pick < 0.7:
        return {"a": rnd.choice(HUGE)}
    if pick < 0.8:
        return "".join(rnd.choice("abcXYZ_-09") for _ in range(rnd.randint(1, 40)))
    return rnd.randint(-(2**70), 2**70)


def fuzz_frame(rnd: random.Random, kinds: list[str], fields: dict[str, list[str]],
               ids: list[str]) -> str:
    """One frame: a known type with random values (huge integers often), or garbage."""
    pick = rnd.random()
    if pick < 0.05:
        return rnd.choice(['{"v":1,"type":"ping","t":' + "9" * rnd.randint(300, 5000) + "}",
                           "[" * 5000, "{", "nul", '{"v":1e999}', "\x00" * 10])
    kind = rnd.choice(kinds)
    msg: dict[str, Any] = {"v": rnd.choice([1, 1, 1, 10**400, "1"]), "type": kind}
    for name in fields[kind]:
        if rnd.random() < 0.6:
            msg[name] = rnd.choice(ids) if name in ("to", "peer") else _fuzz_value(rnd)
    if rnd.random() < 0.05:
        msg["extra"] = _fuzz_value(rnd)
    return json.dumps(msg)


def fuzz(server: ServerProcess, frames: int = 10000, seed: int = 17) -> dict[str, Any]:
    """``frames`` fuzz frames from an unjoined peer, an auto-room pair and a private host."""
    from server.protocol import CLIENT_SCHEMAS

    rnd = random.Random(seed)
    kinds = sorted(set(CLIENT_SCHEMAS) - {"leave"})  # leave would end the connection
    fields = {k: sorted(v) for k, v in CLIENT_SCHEMAS.items()}
    host = Peer(server.ws_url, source="127.0.0.20")
    host.create()
    member_a = Peer(server.ws_url, source="127.0.0.21")
    member_a.join()
    member_b = Peer(server.ws_url, source="127.0.0.21")
    member_b.join()
    loose = Peer(server.ws_url, source="127.0.0.22")
    peers = [host, member_a, member_b, loose]
    ids = [p.id for p in peers if p.id] + ["nobody", "x" * 40]
    errors = 0
    sent = 0
    start = time.perf_counter()
    while sent < frames:
        for peer in peers:
            for _ in range(50):
                peer.send_raw(fuzz_frame(rnd, kinds, fields, ids))
            sent += 50
            for frame in peer.sync():  # drain: the peer reads everything it was sent
                errors += frame["type"] == "error"
    elapsed = time.perf_counter() - start
    for peer in peers:
        peer.close()
    return {"frames": sent, "error_frames": errors, "seconds": elapsed,
            "tracebacks": server.tracebacks(), "still_serving_s": time_to_serve(server,
                                                                               NEWCOMER)}


FUZZ_CONFIG = {"rate_per_s": 1e6, "rate_burst": 1e6, "bytes_per_s": 1e9, "max_strikes": 10**6,
               "max_ws_per_address": 64}


def room_quota(server: ServerProcess, quota: int) -> dict[str, Any]:
    """One address creates rooms until refused; another address then creates one."""
    held: list[Peer] = []
    refusal: dict[str, Any] | None = None
    for _ in range(quota + 5):
        peer = Peer(server.ws_url, source=ATTACKER)
        held.append(peer)
        peer.send("create")
        reply = peer.recv()
        if reply["type"] == "error":
            refusal = reply
            break
    other = Peer(server.ws_url, source=NEWCOMER)
    other_code = other.create()
    for peer in [*held, other]:
        peer.close()
    return {"created": len(held) - (refusal is not None), "refusal": refusal,
            "other_address_created": bool(other_code)}


def run_all(folder: Path, report: Callable[[str, dict[str, Any]], None]) -> None:
    """Every scenario on a fresh server each (the benchmark's order)."""
    scenarios: list[tuple[str, dict[str, Any], int | None, Callable[..., dict[str, Any]]]] = [
        ("idle_cost", {}, None, idle_cost),
        ("flood", {}, None, flood),
        ("many_sockets", {}, None, many_sockets),
        ("slowloris", {}, 1024, slowloris),
        ("fuzz", FUZZ_CONFIG, None, fuzz),
        ("room_quota", {}, None, lambda s: room_quota(s, 16)),
    ]
    for name, config, fd_limit, scenario in scenarios:
        server = ServerProcess(folder / name, config, fd_limit)
        try:
            report(name, scenario(server))
        finally:
            server.stop()
