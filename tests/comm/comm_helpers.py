"""Helpers of the comm tests: peers as real OS processes, and in-process loopback groups.

Imported by the test modules (pytest puts this folder on sys.path); not a conftest so that
it cannot clash with conftest modules of other test folders.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "tests"):  # pynode without an install; tests/netns.py
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from pynode.comm import loopback  # noqa: E402

PEER_SCRIPT = Path(__file__).with_name("peer_script.py")
sys.path.insert(0, str(PEER_SCRIPT.parent))
import peer_script  # noqa: E402
from pynode_runs import free_port  # noqa: E402


def oracle_sum(arrays: Sequence[np.ndarray]) -> list[int]:
    """Elementwise sum in Python ints: an implementation that shares nothing with numpy's."""
    return [sum(int(a[i]) for a in arrays) for i in range(len(arrays[0]))]


def run_peers(
    transport: str,
    world: int,
    address: str,
    scenario: str,
    out: Path,
    *,
    kill_rank: int | None = None,
    wrap: Callable[[int], list[str]] = lambda rank: [],
    env: Callable[[int], dict[str, str]] = lambda rank: {},
    limit_s: float = 90.0,
) -> dict[int, dict]:
    """Run peer_script.py as `world` processes; SIGKILL `kill_rank` once it says it is ready.

    Returns each surviving rank's JSON record. Every process started here is killed if the
    run overruns `limit_s`.
    """
    script_args = [transport, str(world), address, scenario, str(out)]
    procs = {rank: _launch(rank, script_args, wrap(rank), env(rank)) for rank in range(world)}
    deadline = time.monotonic() + limit_s
    try:
        if kill_rank is not None:
            _kill_when_ready(procs[kill_rank], out / "victim_ready", deadline)
        errors = {}
        for rank, proc in procs.items():
            _, stderr = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            if rank != kill_rank and proc.returncode != 0:
                errors[rank] = stderr[-3000:]
        assert not errors, f"peers failed: {errors}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in procs if r != kill_rank}


def _launch(
    rank: int, script_args: list[str], prefix: list[str], env: dict[str, str]
) -> subprocess.Popen:
    transport, world, *rest = script_args
    argv = [*prefix, sys.executable, str(PEER_SCRIPT), transport, str(rank), world, *rest]
    return subprocess.Popen(
        argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _kill_when_ready(proc: subprocess.Popen, marker: Path, deadline: float) -> None:
    while not marker.exists():
        assert proc.poll() is None, f"victim exited early: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "victim never got ready"
        time.sleep(0.02)
    time.sleep(0.3)  # the survivors are now waiting inside the collective
    os.kill(proc.pid, signal.SIGKILL)


async def loopback_group(world: int, tmp_path: Path, timeout: float = 10.0, **kw) -> list:
    """`world` loopback members in this process (one task each), over a Unix socket."""
    import asyncio

    address = str(tmp_path / "hub.sock")
    return list(
        await asyncio.gather(
            *(
                loopback.connect(rank, world, address, timeout=timeout, **kw)
                for rank in range(world)
            )
        )
    )


__all__ = ["free_port", "loopback_group", "oracle_sum", "peer_script", "run_peers"]
