"""SIGTERM (kill, timeout, docker stop, systemd) stops a training command as Ctrl-C does.

The same way out: the run stops at its step boundary, --save gets the last agreed state,
and the command says `terminated` and exits 143 (pynode.cli.main; stop_reason in
pynode.cli.report says it on a status line). The handler hands the signal to whatever
SIGINT's handler is (asyncio.run's cancels the run's task). Where SIGINT is ignored (a
background job of a script) asyncio has none: the handler cancels the command's task
itself, as asyncio's would (`run`), rather than raise KeyboardInterrupt in whatever task
was running (logged as "Task exception was never retrieved", with its traceback). It is
installed for the command only and the previous one put back after.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_received: list[int] = []  # the SIGTERM the command under way received
_main: list[asyncio.Task] = []  # the task of the command under way (`run`)


def terminated() -> int | None:
    """The signal number of the SIGTERM that stopped the command under way (or the last
    one), None where none did."""
    return _received[0] if _received else None


def run(command: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(command), a SIGTERM cancelling its task as a Ctrl-C does: one that
    ends it cancelled comes out as KeyboardInterrupt (as asyncio.run's Ctrl-C does)."""
    async def main() -> T:
        _main[:] = [asyncio.current_task()]
        asyncio.get_running_loop().set_exception_handler(not_an_interrupt)
        try:
            return await command
        finally:
            _main.clear()

    started = main()
    try:
        if sys.version_info < (3, 11):  # no asyncio.Runner: its loop is made unguarded
            return asyncio.run(started)
        with asyncio.Runner(loop_factory=whole_loop) as runner:
            return runner.run(started)
    except asyncio.CancelledError:
        if terminated() is None:
            raise
        raise KeyboardInterrupt from None
    finally:  # a Ctrl-C before they ran: no "coroutine ... was never awaited" after it
        started.close()
        command.close()


def whole_loop() -> asyncio.AbstractEventLoop:
    """A new event loop, made with SIGINT held back until it is whole. A Ctrl-C in the
    first moments of a command (CI's test of one, 1 in ~40 tries) met asyncio.run making its
    loop: the half-made loop's __del__ then printed a traceback ("'_UnixSelectorEventLoop'
    object has no attribute '_signal_handlers'") after `interrupted`. Held back, the signal
    comes as the loop is whole, and the runner closes it."""
    if not hasattr(signal, "pthread_sigmask") or \
            threading.current_thread() is not threading.main_thread():
        return asyncio.new_event_loop()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        return asyncio.new_event_loop()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def not_an_interrupt(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's handler of what no task retrieved, less the KeyboardInterrupt that a
    second Ctrl-C raises in whichever task is running (asyncio.run's first cancels the
    command's task; its second raises at once): the command says `interrupted`, and that
    task's traceback ("Task exception was never retrieved", ~60 lines after a `join`
    leader's double Ctrl-C) said nothing more."""
    if isinstance(context.get("exception"), KeyboardInterrupt):
        return
    loop.default_exception_handler(context)


def _on_term(signum: int, frame: Any) -> None:
    _received.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
        return
    task = _main[0] if _main else None
    if task is not None and len(_received) == 1 and not task.done():
        task.cancel()  # as asyncio.run's Ctrl-C handler; a second SIGTERM raises at once
        task.get_loop().call_soon_threadsafe(lambda: None)  # wakes a loop waiting in select
        return
    raise KeyboardInterrupt


SETTLE_S = 0.25  # what a process of a group waits for a signal its group also received


async def settle() -> None:
    """A pause in which a signal the whole process group received (a terminal's Ctrl-C
    reaches every local peer) can stop this command's task first: a local peer that lost
    its hub to that Ctrl-C said `stopped: PeerLost: lost the hub (BrokenPipeError)`, as if
    something had broken, where it was interrupted as the hub was."""
    await asyncio.sleep(SETTLE_S)


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
