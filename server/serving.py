"""``python -m server``'s HTTP server: gevent's WSGI server in one process, guarded.

Room state lives in this process, so there is exactly one. Each connection is a greenlet
(a websocket: its handler, simple-websocket's reader and our writer, three greenlets of a
few KB and one file descriptor), not three OS threads and two descriptors as under
Werkzeug's development server. In front of the app, at accept:

- ``ConnectionGate``: a global budget of open sockets, derived from the process's
  descriptor limit, and a cap per client address. The last ``reserve`` places of the
  budget go only to addresses holding almost nothing, so one address, or a few, cannot
  take the server from everyone else. When the budget is spent, the oldest connection that
  is still sending its request headers is closed to make room (a slowloris socket loses
  its place to a real client, never the other way round).
- ``GuardedHandler``: a request's line and headers must arrive within ``header_timeout_s``
  in total (trickling a byte every few seconds does not extend it); the same deadline
  closes an idle keep-alive connection, and bounds each write of a response (a client
  that stops reading loses its socket). Websockets are not HTTP responses: their dead
  peers are found by the websocket ping (``ws_ping_s``).

Importing this module imports gevent; ``monkey_patch()`` must run before anything else
creates threads, locks or sockets (``server/__main__.py`` calls it first). The tests' in-process
server (Werkzeug, ``server.app.make_threaded_server``) never imports it.
"""

from __future__ import annotations

import errno
import logging
import resource
import socket
import struct
import time
from collections import Counter
from typing import Any

import gevent
from gevent.pywsgi import WSGIHandler, WSGIServer

from server.addresses import address_group

log = logging.getLogger(__name__)
FDS_PER_CONNECTION = 2  # a websocket holds two descriptors while its handshake runs
FD_HEADROOM = 64  # listening socket, log files, shard connections, parquet, the runtime


def monkey_patch() -> None:
    """Make threads greenlets and sockets cooperative; before anything else runs."""
    from gevent import monkey

    monkey.patch_all()


def raise_fd_limit() -> int:
    """Raise the soft descriptor limit to the hard one; return the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def connection_budget(configured: int, fd_limit: int) -> int:
    """``configured`` sockets, or (when 0) as many as the descriptor limit leaves room for."""
    by_fds = max(16, (fd_limit - FD_HEADROOM) // FDS_PER_CONNECTION)
    return min(configured, by_fds) if configured > 0 else by_fds


class HeaderTimeout(OSError, ValueError):
    """The request line and headers did not arrive in time (closes the connection quietly:
    gevent treats an OSError while reading the request line, and a ValueError while
    parsing the headers, as a client problem, never as a server error)."""


class SendTimeout(OSError):
    """A client did not take a piece of its response in time (a slow read): close."""

    def __init__(self) -> None:
        super().__init__(errno.ETIMEDOUT, "the client stopped reading")


class ConnectionGate:
    """Who gets a socket: a global budget, a per-address cap, and room for newcomers.

    Only the server's greenlets call it (one OS thread), so it needs no lock.
    """

    SMALL = 4  # an address holding fewer sockets than this may use the reserve

    def __init__(self, budget: int, per_address: int | None) -> None:
        self.budget = budget
        self.per_address = per_address  # None behind a trusted proxy (all one address)
        self.reserve = max(1, budget // 8)
        self.open = 0
        self.refused = 0
        self.evicted = 0
        self._by_address: Counter[str] = Counter()
        self._reading: dict[Any, float] = {}  # handlers reading request headers -> since

    def admit(self, group: str) -> bool:
        held = self._by_address[group]
        if self.per_address is not None and held >= self.per_address:
            return False
        if self.open >= self.budget - self.reserve and held >= self.SMALL:
            return False
        if self.open >= self.budget and not self._evict_oldest_reader():
            return False
        self.open += 1
        self._by_address[group] += 1
        return True

    def release(self, group: str) -> None:
        self.open -= 1
        self._by_address[group] -= 1
        if self._by_address[group] <= 0:
            del self._by_address[group]

    def reading(self, handler: Any) -> None:
        self._reading[handler] = time.monotonic()

    def done_reading(self, handler: Any) -> None:
        self._reading.pop(handler, None)

    def _evict_oldest_reader(self) -> bool:
        for handler in self._reading:  # insertion order: the oldest first
            self._reading.pop(handler)
            handler.evict()
            self.evicted += 1
            return True
        return False

    def held(self, group: str) -> int:
        return self._by_address[group]


class GuardedHandler(WSGIHandler):
    """gevent's handler with a total deadline on each request's line and headers."""

    server: GuardedServer
    _deadline: gevent.Timeout | None = None
    _evicted = False
    # gevent closes quietly on these; a client that stops reading is one of them.
    ignored_socket_errors = (*WSGIHandler.ignored_socket_errors, errno.ETIMEDOUT)

    def _sendall(self, data: bytes) -> None:
        # Each piece (a file goes out in 8 KiB ones) must leave within the header deadline:
        # a client reading a byte now and then cannot hold its socket for ever.
        with gevent.Timeout(self.server.header_timeout_s, SendTimeout()):
            super()._sendall(data)

    def read_requestline(self) -> str:
        self.server.gate.reading(self)
        self._deadline = gevent.Timeout.start_new(
            self.server.header_timeout_s, HeaderTimeout("request headers too slow"))
        return super().read_requestline()

    def read_request(self, raw_requestline: str) -> Any:
        try:
            return super().read_request(raw_requestline)
        finally:
            self._end_reading()

    def handle_one_request(self) -> Any:
        try:
            result = super().handle_one_request()
        finally:
            self._end_reading()
        if self._evicted:
            return None  # closed to make room: no error response to a socket shut down
        if result is True and self.environ.get("daisychain.upgraded"):
            return None  # the websocket is over: nothing more on this connection
        return result

    def _end_reading(self) -> None:
        if self._deadline is not None:
            self._deadline.close()
            self._deadline = None
        self.server.gate.done_reading(self)

    def evict(self) -> None:
        """Close this connection, still waiting for its headers, to make room for another."""
        self._evicted = True
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass

    def _handle_client_error(self, ex: BaseException) -> Any:
        if isinstance(ex, OSError) and not isinstance(ex, ValueError):
            return None  # the socket failed or was shut down (evicted): just close it
        return super()._handle_client_error(ex)

    def log_error(self, msg: str, *args: Any) -> None:
        log.debug(msg, *args)  # a client's malformed or slow request: not the server's fault

    def log_request(self) -> None:
        pass


class GuardedServer(WSGIServer):
    """gevent's WSGI server behind a ``ConnectionGate``."""

    handler_class = GuardedHandler

    def __init__(self, listener: Any, app: Any, gate: ConnectionGate,
                 header_timeout_s: float) -> None:
        super().__init__(listener, app, log=None, error_log=log)
        self.gate = gate
        self.header_timeout_s = header_timeout_s

    def handle(self, sock: Any, address: Any) -> None:
        group = address_group(str(address[0])) if isinstance(address, tuple) else "local"
        if not self.gate.admit(group):
            self.gate.refused += 1
            _close_now(sock)
            return
        try:
            super().handle(sock, address)
        except OSError as exc:  # the client went away mid-answer: its problem, not ours
            log.debug("connection from %s ended: %r", group, exc)
        finally:
            self.gate.release(group)


def _close_now(sock: Any) -> None:
    """Close a refused socket at once (a reset, so no descriptor lingers in TIME_WAIT)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def make_server(app: Any, cfg: Any) -> GuardedServer:
    """The guarded gevent server of ``app`` on ``cfg.host``/``cfg.port``, bound, not started."""
    fd_limit = raise_fd_limit()
    budget = connection_budget(cfg.max_connections, fd_limit)
    per_address = None if cfg.trust_proxy_header else cfg.max_conns_per_address
    gate = ConnectionGate(budget, per_address)
    server = GuardedServer((cfg.host, cfg.port), app, gate, cfg.header_timeout_s)
    server.init_socket()
    log.info("serving with gevent: %d sockets at most (descriptor limit %d), %s per address",
             budget, fd_limit, per_address or "any")
    app.extensions["daisychain.gate"] = gate
    return server
