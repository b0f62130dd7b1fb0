"""`python -m pynode ...` runs as a user starts them, for the CLI and group tests.

Output goes to files (no pipe can fill up), each run in its own session so a timeout kills
it with the loopback peers it spawned, and a watcher notes when it exited.
"""

from __future__ import annotations

import json
import os
import signal
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

    def __init__(self, folder: Path, name: str, args: list[str], env: dict | None = None):
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
