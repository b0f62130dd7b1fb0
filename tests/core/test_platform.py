"""pynode.platform: the malloc arena a worker thread allocates from, and the core a
benchmark pins a peer to."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A thread allocates, then glibc's malloc_stats prints one "Arena N:" block per arena.
SCRIPT = """
import ctypes, threading
import numpy as np
from pynode import platform
print(platform.share_malloc_arena())
worker = threading.Thread(target=lambda: np.ones(1 << 16).sum())
worker.start()
worker.join()
ctypes.CDLL(None).malloc_stats()
"""

glibc = pytest.mark.skipif(not sys.platform.startswith("linux")
                           or os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc only")


def arenas(env: dict[str, str]) -> tuple[str, int]:
    base = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env={**base, **env}, check=True, timeout=60)
    return done.stdout.strip(), done.stderr.count("Arena ")


@glibc
def test_a_worker_thread_allocates_from_the_main_arena():
    said, count = arenas({})
    assert (said, count) == ("True", 1)


@glibc
def test_a_users_malloc_arena_max_is_kept():
    said, count = arenas({"MALLOC_ARENA_MAX": "4"})
    assert said == "False"
    assert count == 2  # the worker thread got an arena of its own, as glibc does alone


# The one-peer `train` pins itself as the local peers of `train --peers N` do: `bench
# scaling` compares one peer with two core for core. Run in a child: pinning is for good.
PINNED = """
import os, sys
from pynode.cli.main import main
assert main(["train", "--steps", "1", "--no-progress"]) == 0
print(sorted(os.sched_getaffinity(0)))
"""

pinning = pytest.mark.skipif(not hasattr(os, "sched_setaffinity")
                             or len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")


@pinning
@pytest.mark.parametrize("pin", ["1", None])
def test_a_lone_peer_runs_on_one_core_when_benchmarks_pin_peers(pin):
    env = {k: v for k, v in os.environ.items() if k != "PYNODE_PIN_CORES"}
    if pin:
        env["PYNODE_PIN_CORES"] = pin
    done = subprocess.run([sys.executable, "-c", PINNED], capture_output=True, text=True,
                          env=env, check=True, timeout=300)
    cores = sorted(os.sched_getaffinity(0))
    assert done.stdout.strip().splitlines()[-1] == str(cores[:1] if pin else cores)


@pinning
def test_a_rank_past_the_last_core_wraps_around():
    cores = sorted(os.sched_getaffinity(0))
    script = ("import os; from pynode import platform; "
              f"platform.pin_to_core({len(cores) + 1}); print(sorted(os.sched_getaffinity(0)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYNODE_PIN_CORES": "1"}, check=True, timeout=60)
    assert done.stdout.strip() == str([cores[1]])
