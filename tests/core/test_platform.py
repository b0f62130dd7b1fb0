"""pynode.platform: the malloc arena a worker thread allocates from."""

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
