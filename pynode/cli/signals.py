"""SIGTERM (kill, timeout, docker stop, systemd) stops a training command as Ctrl-C does.

The same way out: the run stops at its step boundary, --save gets the last agreed state,
and the command says `terminated` and exits 143 (pynode.cli.main; stop_reason in
pynode.cli.report says it on a status line). The handler hands the signal to whatever
SIGINT's handler is (asyncio.run's cancels the run's task), or raises KeyboardInterrupt
where SIGINT is ignored (a background job of a script). It is installed for the command
only and the previous one put back after.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

_received: list[int] = []  # the SIGTERM the command under way received


def terminated() -> int | None:
    """The signal number of the SIGTERM that stopped the command under way (or the last
    one), None where none did."""
    return _received[0] if _received else None


def _on_term(signum: int, frame: Any) -> None:
    _received.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM as Ctrl-C while the block runs (main thread only: elsewhere nothing)."""
    _received.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
