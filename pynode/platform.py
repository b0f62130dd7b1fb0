"""The one place that asks "am I in a browser?" (Pyodide) and what this machine has."""

from __future__ import annotations

import os
import sys

IN_PYODIDE = sys.platform == "emscripten" or "pyodide" in sys.modules


def cpu_count() -> int:
    """Cores this peer may use (affinity-aware natively, 1 in the page)."""
    if IN_PYODIDE:
        return 1
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def memory_bytes() -> int:
    """Available memory in bytes, or 0 where it cannot be known (the page)."""
    if IN_PYODIDE:
        return 0
    try:
        import psutil
    except ImportError:
        return 0
    return int(psutil.virtual_memory().available)


def device_name() -> str:
    """A short description of this peer's hardware for the plan table."""
    if IN_PYODIDE:
        return "browser (wasm)"
    import platform

    return f"{platform.machine()} cpu"


def has_torch() -> bool:
    if IN_PYODIDE:
        return False
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def http_get_text(url: str, timeout: float = 30.0) -> str:
    """GET `url` and return its body as text (blocking: a worker thread in the page)."""
    if IN_PYODIDE:
        from pyodide.http import open_url

        return open_url(url).getvalue()
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode("utf-8")
