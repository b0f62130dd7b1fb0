"""Native peers (`python -m pynode join`) for the mixed tests, run inside the private network.

Each one writes its messages (stderr) and per-step JSON lines (--log) to files in the test's
tmp folder, which the test polls; a failing assertion shows the messages.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@cache
def join_argv() -> tuple[str, ...]:
    """`python -m pynode join`, or the module itself until the CLI lists the subcommand."""
    done = subprocess.run([sys.executable, "-m", "pynode", "join", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    if done.returncode == 0:
        return (sys.executable, "-m", "pynode", "join")
    return (sys.executable, "-m", "pynode", "join")


def config_flags(config: dict[str, Any]) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in sorted(config.items())]


class NativeJoin:
    """One `join` process inside `net`; `args` are its flags after --server."""

    def __init__(self, net: Any, server_url: str, folder: Path, name: str, *args: str,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.err_path = folder / f"{name}.err"
        self.out_path = folder / f"{name}.out"
        self.log_path = folder / f"{name}.jsonl"
        # One BLAS thread each: several peers share the machine's cores.
        environ = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                   **(env or {})}
        argv = [*join_argv(), "--server", server_url, "--log", str(self.log_path),
                "--no-progress", *args]
        with open(self.err_path, "w") as err, open(self.out_path, "w") as out:
            # Ctrl-C reaches it as a user's would, even under a runner that ignores SIGINT
            # (a background job's children inherit that)
            self.proc = net.popen(argv, cwd=REPO, stdout=out, stderr=err, env=environ,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                   signal.SIG_DFL))

    def messages(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match:
        """The first match of `pattern` in the messages, once it appears."""
        until = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.messages())
            if found:
                return found
            if self.proc.poll() is not None or time.monotonic() > until:
                raise AssertionError(f"{self.name}: no {pattern!r} (exit {self.proc.poll()}):\n"
                                     f"{self.messages()}")
            time.sleep(0.1)

    @property
    def peer_id(self) -> str:
        return self.wait_for(r"as peer (\S+) ").group(1)

    def rows(self) -> list[dict]:
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line]

    def hashes(self) -> dict[int, str]:
        return {row["step"]: row["hash"] for row in self.rows()}

    def wait_step(self, step: int, timeout: float = 120.0) -> None:
        until = time.monotonic() + timeout
        while max(self.hashes(), default=0) < step:
            if self.proc.poll() is not None or time.monotonic() > until:
                raise AssertionError(f"{self.name}: never reached step {step}:\n"
                                     f"{self.messages()}")
            time.sleep(0.05)

    def finish(self, timeout: float = 120.0) -> int:
        """Its exit code, once it ended by itself."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not finish:\n{self.messages()}") from None

    def stdout(self) -> str:
        return self.out_path.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def reference_rows(config: dict[str, Any], folder: Path, *extra: str) -> list[dict]:
    """`python -m pynode train` alone with `config` (and `extra` flags): one row per step."""
    log = folder / f"reference-{len(list(folder.glob('reference-*')))}.jsonl"
    done = subprocess.run([sys.executable, "-m", "pynode", "train", *config_flags(config),
                           *extra, "--log", str(log), "--no-progress"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]
