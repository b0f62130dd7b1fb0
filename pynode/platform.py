"""The one place that asks "am I in a browser?" (Pyodide) and what this machine has."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

IN_PYODIDE = sys.platform == "emscripten" or "pyodide" in sys.modules


def cpu_count() -> int:
    """Cores this peer may use (affinity-aware natively, 1 in the page)."""
    if IN_PYODIDE:
        return 1
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def share_malloc_arena() -> bool:
    """Have threads started from now on allocate from the main thread's malloc arena
    (glibc's M_ARENA_MAX = 1), unless MALLOC_ARENA_MAX says otherwise. A new thread would
    get an arena of its own, whose pages fault in as it first fills them: the cross-check's
    first recomputation in its worker thread took 55 ms instead of 18 (3,400 more page
    faults, on a 2-core KVM guest). True where set (glibc), False elsewhere."""
    if IN_PYODIDE or not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_arena_max = -8  # glibc's malloc.h; musl's mallopt takes and ignores it
    return bool(mallopt(m_arena_max, 1))


def pin_to_core(rank: int) -> None:
    """With PYNODE_PIN_CORES=1 (benchmarks) this process runs on core `rank` only (modulo
    the cores it may use): each local peer on a core of its own, and one peer alone on one
    core as well, so that 1 and N peers are compared core for core."""
    if os.environ.get("PYNODE_PIN_CORES") == "1" and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})


# The page's Python heap (wasm32 memory) past which Pyodide 0.27 copies buffers out wrong:
# its python2js_buffer_1d_contiguous slices HEAP8 at a signed address, so a buffer above
# 2 GiB comes out as the right length of other bytes (a tab that had tried a config too big
# for it downloaded corrupt checkpoints, and would have sent peers corrupt frames).
PAGE_HEAP_LIMIT = 2**31
# What a tab may plan a run's memory against: the limit less room for a run's temporaries
# (checkpoint copies, frames) beyond memory_needed's estimate.
PAGE_HEAP_BUDGET = 3 * 2**29  # 1.5 GiB


def heap_bytes() -> int:
    """The page's Python heap now (its wasm memory, which never shrinks); 0 natively or
    where it cannot be read."""
    if not IN_PYODIDE:
        return 0
    try:
        import pyodide_js  # only in the page

        return int(pyodide_js._module.HEAP8.length)
    except (ImportError, AttributeError, TypeError, ValueError):
        return 0


def memory_bytes() -> int:
    """Available memory in bytes, or 0 where it cannot be known. In the page: what is left
    of PAGE_HEAP_BUDGET beside the heap already grown (at least 1 byte: a tab whose heap
    outgrew it can plan nothing more)."""
    if IN_PYODIDE:
        heap = heap_bytes()
        return max(1, PAGE_HEAP_BUDGET - heap) if heap else 0
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


# A GET is given up on after HTTP_TIMEOUT_S; `on_slow` is called once it has gone
# SLOW_ANSWER_S without an answer (a server that took the connection and hung kept a run
# silent for the whole timeout, a trial).
HTTP_TIMEOUT_S = 30.0
SLOW_ANSWER_S = 5.0


def http_get_text(url: str, on_slow: Callable[[float, float], object] | None = None) -> str:
    """GET `url` and return its body as text (blocking: a worker thread in the page). As
    natively, an error answer raises urllib's HTTPError (its body readable) and no answer
    at all OSError. Natively `on_slow(SLOW_ANSWER_S, HTTP_TIMEOUT_S)` says a slow answer
    (in the page the request runs on a worker of its own, under the browser's timeout)."""
    if IN_PYODIDE:
        return _page_get_text(url)
    import threading
    import urllib.request

    timer = None
    if on_slow is not None:
        timer = threading.Timer(SLOW_ANSWER_S, on_slow, (SLOW_ANSWER_S, HTTP_TIMEOUT_S))
        timer.daemon = True
        timer.start()
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return response.read().decode("utf-8")
    finally:
        if timer is not None:
            timer.cancel()


def failure_words(exc: BaseException) -> str:
    """Why a read of a URL or file failed, as a person says it ("HTTP 404 Not Found",
    "connection refused", "No such file or directory"), not Python's reprs of urllib's
    errors: the server's word of a shard it cannot read, a trainer's of a server."""
    import http
    import socket
    import urllib.error

    from pynode.core.errors import DaisyError

    if isinstance(exc, urllib.error.HTTPError):
        try:
            phrase = http.HTTPStatus(exc.code).phrase
        except ValueError:
            phrase = str(exc.reason)
        return f"HTTP {exc.code} {phrase}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):
        return "no answer in time (timed out)"
    if isinstance(reason, socket.gaierror):
        return f"its host name does not resolve ({reason.strerror})"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    if isinstance(reason, DaisyError | str):  # already in words (ShardError, ...)
        return str(reason)
    return f"{type(reason).__name__}: {reason}"


def _page_get_text(url: str) -> str:
    """http_get_text in the page: a synchronous XMLHttpRequest (the worker may block), its
    failures in the native forms (a JavaScript NetworkError, say a server gone or a host the
    page's policy refuses, would escape every handler and stop the run unseen)."""
    import io
    from urllib.error import HTTPError

    from js import XMLHttpRequest
    from pyodide.ffi import JsException

    request = XMLHttpRequest.new()
    try:
        request.open("GET", url, False)
        request.send()
    except JsException as exc:
        raise OSError(f"GET {url}: {exc}") from None
    body = str(request.responseText)
    if not 200 <= request.status < 300:
        raise HTTPError(url, int(request.status), str(request.statusText), None,  # type: ignore[arg-type]
                        io.BytesIO(body.encode("utf-8")))
    return body

