"""`python -m pynode ...` runs as a user starts them, for the CLI and group tests.

Output goes to files (no pipe can fill up), each run in its own session so a timeout kills
it with the loopback peers it spawned, and a watcher notes when it exited.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 300
# Many interpreters share 2 cores: BLAS / OpenMP pools that spin-wait for idle cores would
# slow all of them. A test that wants the default pools passes these names with None.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now, below the kernel's ephemeral range.

    A port the kernel hands out (a bind to port 0) is free now, but until the test's process
    binds it, any connection another process opens may take it as its local port: a gloo
    store once failed so with EADDRINUSE while other runs connected. The kernel hands out
    no port below its range, so only an explicit bind can take one of these.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randrange(10000, max(low, 10001))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port between 10000 and {low}")


@dataclass
class Done:
    rc: int
    out: str
    err: str
    log: list[dict]
    ended: float  # time.monotonic() when the process exited

    @property
    def final_hash(self) -> str:
        return self.out.strip().splitlines()[-1]

    @property
    def hashes(self) -> list[str]:
        return [row["hash"] for row in self.log]


class Launched:
    """One `python -m pynode ARGS` process; `train`/`cluster` runs also write --log."""

    def __init__(self, folder: Path, name: str, args: list[str], env: dict | None = None,
                 ignore_sigint: bool = False):
        """`ignore_sigint`: started as a script's background job is (SIGINT ignored)."""
        self.folder, self.name = folder, name
        self.log = folder / f"{name}.jsonl"
        if args[0] in ("train", "cluster"):
            args = [*args, "--log", str(self.log)]
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYNODE_")}
        full_env = {**inherited, "PYTHONPATH": str(REPO), **ONE_THREAD, **(env or {})}
        full_env = {k: v for k, v in full_env.items() if v is not None}
        with open(folder / f"{name}.out", "w") as out, open(folder / f"{name}.err", "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pynode", *args], cwd=REPO, env=full_env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, text=True,
                start_new_session=True,
                # SIGINT as a terminal's command has it (default), whatever this process
                # inherited: a test suite run as a script's background job ignores SIGINT,
                # and its children would too (a Ctrl-C test then waited for its limit)
                preexec_fn=lambda: signal.signal(
                    signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL),
            )
        self.ended = 0.0
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def _watch(self) -> None:
        self.proc.wait()
        self.ended = time.monotonic()

    def wait(self, limit_s: float = LIMIT_S) -> Done:
        self.watcher.join(timeout=limit_s)
        if self.proc.poll() is None:
            kill_group(self.proc)
            self.watcher.join()
        rows = []
        if self.log.exists():
            rows = [json.loads(line) for line in self.log.read_text().splitlines()]
        return Done(
            self.proc.returncode, (self.folder / f"{self.name}.out").read_text(),
            (self.folder / f"{self.name}.err").read_text(), rows, self.ended,
        )


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a run we started and the loopback peers it spawned (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
