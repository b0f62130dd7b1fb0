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


def test_the_page_plans_against_what_is_left_of_its_heap_budget(monkeypatch):
    """In the page memory_bytes was 0 ("cannot be known"), so no config was refused: a tab
    that tried a 15 GiB config grew its heap past 2 GiB, where Pyodide copies buffers out
    wrong. Now the budget less the heap; a heap past the budget leaves 1 byte (refuse all)."""
    from pynode import platform
    from pynode.config import RunConfig
    from pynode.run.assemble import MemoryRefusal, check_memory
    from pynode.tasks import load_task

    heap = [300 * 2**20]
    monkeypatch.setattr(platform, "IN_PYODIDE", True)
    monkeypatch.setattr(platform, "heap_bytes", lambda: heap[0])
    assert platform.memory_bytes() == platform.PAGE_HEAP_BUDGET - heap[0]
    with pytest.raises(MemoryRefusal, match=r"needs about 1[45]\.\d GiB, only 1\.2 GiB left "
                       r"of the 1\.5 GiB a tab can hold; choose a smaller one \(width, layers, "
                       r"sequence"):
        check_memory(RunConfig(width=2048, layers=12, heads=8), load_task("gpt"))
    check_memory(RunConfig(), load_task("gpt"))
    heap[0] = platform.PAGE_HEAP_LIMIT + 2**20
    assert platform.memory_bytes() == 1
    with pytest.raises(MemoryRefusal, match=r"already grew to 2\.0 GiB .*reload the page"):
        check_memory(RunConfig(), load_task("gpt"))


def test_nothing_leaves_a_tab_whose_heap_grew_past_2_gib(monkeypatch):
    """Past 2 GiB Pyodide 0.27 copies a buffer out as other bytes of the right length: a
    frame to a peer and the state a checkpoint or generation starts from are refused."""
    from pynode import browser, platform

    monkeypatch.setattr(platform, "heap_bytes", lambda: 2**31 - 2**20)
    browser.copies_are_exact()
    monkeypatch.setattr(platform, "heap_bytes", lambda: 2**31 + 2**20)
    with pytest.raises(browser.HeapTooLarge, match="grew to 2.0 GiB .* reload the page"):
        browser.copies_are_exact()
    mesh = browser.JsMesh(bridge=None, self_id="me")
    mesh.opened("them")
    with pytest.raises(browser.HeapTooLarge):
        mesh.send("them", b"frame")
