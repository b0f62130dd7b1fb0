"""The server under attack (issue 17), and which HTTP server to run it on.

    python benchmarks/server_attack_bench.py            # everything (~1-2 min), a table
    python benchmarks/server_attack_bench.py --json     # one JSON object
    python benchmarks/server_attack_bench.py --only slowloris,fuzz

Part 1, per-connection cost: the same app on `python -m server` (gevent),
`python -m server --dev-server` (Werkzeug, a thread per connection) and, if gunicorn is
installed, gunicorn's gthread and gevent workers (one worker: the rooms live in memory).
500 open websockets: descriptors, threads and memory per socket; then all closed at once:
server CPU spent and the time until a new client is served.

Part 2, attacks on `python -m server` with its defaults (tests/server/attack_kit.py):
50 flooding connections, 2,000 websockets from one address, 1,100 slowloris sockets
under a 1,024 descriptor limit, 10,000 fuzz frames, the room quota. Everything runs on
loopback; client and server share the machine (the client's load is in the figures).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "server"))

import attack_kit  # noqa: E402

TARGETS = {  # the "done when", checked on the figures
    "many_sockets": lambda r: r["relay_p99_ms"] < 100 and r["newcomer_served_s"] < 1.0,
    "slowloris": lambda r: r["worst_newcomer_s"] < 1.0,
    "fuzz": lambda r: r["tracebacks"] == 0,
    "room_quota": lambda r: r["refusal"] is not None and r["other_address_created"],
}


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def servers() -> list[tuple[str, dict[str, Any]]]:
    out = [("python -m server (gevent)", {}),
           ("python -m server --dev-server (Werkzeug)", {"extra_args": ("--dev-server",)})]
    if importlib.util.find_spec("gunicorn") is not None:
        base = [sys.executable, "-m", "gunicorn", "-w", "1", "-b", "127.0.0.1:{port}",
                "--no-control-socket"]
        out.append(("gunicorn -k gthread --threads 1600",
                    {"command": [*base, "-k", "gthread", "--threads", "1600",
                                 "server:create_app()"]}))
        out.append(("gunicorn -k gevent", {"command": [*base, "-k", "gevent",
                                                       "server:create_app()"]}))
    return out


class _Worker:
    """gunicorn's worker process (the arbiter forks it), for /proc figures."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> None:
        return None


def gunicorn_worker(arbiter: int, timeout: float = 30.0) -> int:
    """The pid of the worker gunicorn's arbiter forks (it listens before forking)."""
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        children = open(f"/proc/{arbiter}/task/{arbiter}/children").read().split()
        if children:
            return int(children[0])
        time.sleep(0.1)
    raise RuntimeError("gunicorn started no worker")


def cost_of_servers(folder: Path, sockets: int) -> dict[str, Any]:
    results = {}
    for i, (name, options) in enumerate(servers()):
        where = folder / f"server{i}"
        server = attack_kit.ServerProcess(where, {}, **options)
        arbiter = server.proc
        try:
            if "command" in options:
                server.proc = _Worker(gunicorn_worker(arbiter.pid))
                attack_kit.http_get(server.url + "/healthz", attack_kit.NEWCOMER, timeout=30)
            results[name] = attack_kit.idle_cost(server, sockets)
        finally:
            server.proc = arbiter
            server.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sockets", type=int, default=500, help="open sockets in part 1")
    parser.add_argument("--only", help="comma-separated scenarios (idle_cost = part 1)")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    report: dict[str, Any] = {
        "cpu": cpu_model(), "cores": os.cpu_count(), "load_before": os.getloadavg(),
        "python": platform.python_version(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if only is None or "idle_cost" in only:
            report["servers"] = cost_of_servers(folder / "cost", args.sockets)

        def record(name: str, result: dict[str, Any]) -> None:
            if only is None or name in only:
                if name in TARGETS:
                    result["target_met"] = bool(TARGETS[name](result))
                report[name] = result

        scenarios = [s for s in ("flood", "many_sockets", "slowloris", "fuzz", "room_quota")
                     if only is None or s in only]
        run_scenarios(folder / "attacks", scenarios, record)
    report["load_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print_table(report)
    return 0 if all(r.get("target_met", True) for r in report.values()
                    if isinstance(r, dict)) else 1


def run_scenarios(folder: Path, names: list[str], record: Any) -> None:
    table = {
        "flood": ({}, None, attack_kit.flood),
        "many_sockets": ({}, None, attack_kit.many_sockets),
        "slowloris": ({}, 1024, attack_kit.slowloris),
        "fuzz": (attack_kit.FUZZ_CONFIG, None, attack_kit.fuzz),
        "room_quota": ({}, None, lambda s: attack_kit.room_quota(s, 16)),
    }
    for name in names:
        config, fd_limit, scenario = table[name]
        server = attack_kit.ServerProcess(folder / name, config, fd_limit)
        try:
            record(name, scenario(server))
        finally:
            server.stop()


def print_table(report: dict[str, Any]) -> None:
    print(f"CPU: {report['cpu']} ({report['cores']} cores), Python {report['python']}, "
          f"load average before {report['load_before'][0]:.2f}, "
          f"after {report['load_after'][0]:.2f}")
    if "servers" in report:
        print("\n| server | fds / ws | threads / ws | RSS KiB / ws | close-all CPU s "
              "| new client after close | relay p50 / p99 ms |")
        print("|---|---|---|---|---|---|---|")
        for name, r in report["servers"].items():
            print(f"| {name} | {r['fds_per_socket']:.1f} | {abs(r['threads_per_socket']):.1f} "
                  f"| {r['rss_kib_per_socket']:.0f} | {r['close_storm_cpu_s']:.2f} "
                  f"| {1000 * r['newcomer_served_after_close_s']:.0f} ms "
                  f"| {r['relay_p50_ms']:.2f} / {r['relay_p99_ms']:.1f} |")
    for name in ("flood", "many_sockets", "slowloris", "fuzz", "room_quota"):
        if name in report:
            print(f"\n{name}: " + json.dumps(_rounded(report[name]), default=str))


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


if __name__ == "__main__":
    sys.exit(main())
