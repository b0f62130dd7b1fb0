"""The /ws endpoint: one Connection per websocket, feeding validated frames to the rooms.

Each connection has a reader (the request thread: receive, budget, validate, act) and a
writer thread draining a bounded outbound queue, so relaying to a slow peer never blocks
the sender or anyone else; a peer whose queue overflows is cut off.
"""

from __future__ import annotations

import base64
import binascii
import logging
import queue
import socket
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify, request
from flask_sock import Sock
from simple_websocket import ConnectionClosed
from wsproto.utilities import LocalProtocolError

from server.addresses import address_group, client_address
from server.config import ServerConfig
from server.protocol import (
    CLIENT_SCHEMAS,
    PENDING_TYPES,
    UNJOINED_TYPES,
    ProtocolError,
    encode,
    error_frame,
    parse_frame,
)
from server.ratelimit import TokenBucket
from server.rooms import Rooms, room_label

log = logging.getLogger(__name__)

bp = Blueprint("signaling", __name__)
sock = Sock()
EXTENSION = "daisychain.signaling"
STRIKE_REFILL_S = 5.0  # one rejected frame is forgiven every this many seconds
POLICY_VIOLATION = 1008
_CLOSE = object()


@dataclass
class SignalingState:
    config: ServerConfig
    rooms: Rooms
    sockets: AddressCounter


class AddressCounter:
    """Open signaling sockets per client address, capped (thread-safe)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()

    def take(self, group: str) -> bool:
        with self._lock:
            if self._held[group] >= self.cap:
                return False
            self._held[group] += 1
            return True

    def give_back(self, group: str) -> None:
        with self._lock:
            self._held[group] -= 1
            if self._held[group] <= 0:
                del self._held[group]


@bp.before_app_request
def admit_socket() -> Response | None:
    """Refuse /ws before the handshake: a foreign Origin (403) or one socket too many (429)."""
    if request.path != "/ws":
        return None
    state: SignalingState = current_app.extensions[EXTENSION]
    cfg = state.config
    if not origin_allowed(request.headers.get("Origin"), request.host, cfg.allowed_origins):
        return _refusal(403, "forbidden_origin", "pages of other sites may not use this server")
    problem = handshake_problem(request.headers)
    if problem is not None:  # refused here, not as a failed handshake (a 500 and a traceback)
        return _refusal(400, "bad_handshake", problem)
    group = address_group(client_address(request.environ, cfg.trust_proxy_header,
                                         cfg.proxy_hops))
    if not state.sockets.take(group):
        return _refusal(429, "too_many_sockets", "too many connections from your address")
    g.signaling_group = group
    return None


@bp.teardown_app_request
def release_socket(_exc: BaseException | None) -> None:
    group = g.pop("signaling_group", None)
    if group is not None:
        current_app.extensions[EXTENSION].sockets.give_back(group)


def origin_allowed(origin: str | None, host: str, allowed: tuple[str, ...]) -> bool:
    """May a page of ``origin`` open a socket to the server reached as ``host``?

    No Origin header: a native client (browsers always send one on websockets), let in;
    Origin is what protects a person's browser from other sites, not an access control.
    """
    if origin is None or "*" in allowed:
        return True
    origin = origin.strip().lower().rstrip("/")
    if allowed:
        return origin in {o.lower().rstrip("/") for o in allowed}
    scheme, sep, rest = origin.partition("://")
    return bool(sep) and scheme in ("http", "https") and rest == host.lower()


def handshake_problem(headers: Any) -> str | None:
    """What makes this request not a websocket handshake (RFC 6455 4.2.1), or None."""
    if headers.get("Upgrade", "").strip().lower() != "websocket":
        return "/ws takes websocket upgrades only"
    tokens = {t.strip().lower() for t in headers.get("Connection", "").split(",")}
    if "upgrade" not in tokens:
        return "Connection must include Upgrade"
    if headers.get("Sec-WebSocket-Version", "").strip() != "13":
        return "Sec-WebSocket-Version must be 13"
    try:
        key = base64.b64decode(headers.get("Sec-WebSocket-Key", "").strip(), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 16:
        return "Sec-WebSocket-Key must be 16 bytes in base64"
    return None


def _refusal(status: int, code: str, message: str) -> Response:
    response = jsonify(error=code, message=message)
    response.status_code = status
    response.headers["Cache-Control"] = "no-store"
    return response


@sock.route("/ws", bp=bp)
def signaling_socket(ws: Any) -> None:
    state: SignalingState = current_app.extensions[EXTENSION]
    request.environ["daisychain.upgraded"] = True
    if ws.mode == "gevent":
        _close_handshake_socket(request.environ)
    Connection(ws, state, g.signaling_group).run()


def _close_handshake_socket(environ: dict[str, Any]) -> None:
    # simple-websocket runs the websocket on a dup of gevent's socket; the original would
    # idle for the whole session as a second descriptor. gevent's handler ends the
    # connection after an upgraded request (server.serving), so it never reads it again.
    try:
        rfile = environ["wsgi.input"]  # found as simple-websocket finds it
        if not hasattr(rfile, "raw"):
            rfile = rfile.rfile
        raw_sock = rfile.raw._sock
        rfile.close()
        raw_sock.close()
    except (AttributeError, KeyError, OSError) as exc:
        log.warning("handshake socket not closed: %r", exc)


class Connection:
    """One peer's websocket: a ``PeerLink`` for the rooms plus its own read loop."""

    def __init__(self, ws: Any, state: SignalingState, group: str) -> None:
        cfg = state.config
        self._ws = ws
        self._rooms = state.rooms
        self._cfg = cfg
        self._group = group
        self._outbox: queue.Queue[Any] = queue.Queue(maxsize=cfg.send_queue)
        self._queued_bytes = 0  # text characters in the outbox (frames are ASCII JSON)
        self._queued_lock = threading.Lock()
        self._closing = threading.Event()
        self._frames = TokenBucket(cfg.rate_per_s, cfg.rate_burst)
        self._bytes = TokenBucket(cfg.bytes_per_s, max(4 * cfg.bytes_per_s, cfg.hard_frame_bytes))
        self._strikes = TokenBucket(1 / STRIKE_REFILL_S, cfg.max_strikes)
        self.peer_id: str | None = None
        try:  # signaling frames are small and latency-bound: no Nagle delay
            ws.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, AttributeError):
            pass

    # --------------------------------------------------------------- PeerLink
    def deliver(self, frame: str) -> None:
        if self._closing.is_set():
            return
        with self._queued_lock:
            over = self._queued_bytes + len(frame) > self._cfg.send_queue_bytes
            if not over:
                self._queued_bytes += len(frame)
        try:
            if over:
                raise queue.Full
            self._outbox.put_nowait(frame)
        except queue.Full:
            log.info("peer %s cut off: its send queue is full", self.peer_id)
            self._closing.set()
            self._force_close()

    def close(self, code: int, reason: str) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        try:
            self._outbox.put_nowait((_CLOSE, code, reason))
        except queue.Full:
            self._force_close()

    # --------------------------------------------------------------- loops
    def run(self) -> None:
        writer = threading.Thread(target=self._write_loop, name="ws-writer", daemon=True)
        writer.start()
        try:
            while not self._closing.is_set():
                raw = self._ws.receive(timeout=5.0)
                if raw is not None and not self._closing.is_set():
                    self._on_frame(raw)
        except ConnectionClosed:
            pass
        finally:
            if self.peer_id is not None:
                self._rooms.leave(self.peer_id, self)
            self._closing.set()
            try:
                self._outbox.put_nowait((_CLOSE, 1000, "bye"))
            except queue.Full:  # the writer is stuck sending: unstick it
                self._force_close()
            writer.join(timeout=5.0)
            self._end_stream()

    def _write_loop(self) -> None:
        try:
            while True:
                item = self._outbox.get()
                if isinstance(item, tuple) and item[0] is _CLOSE:
                    self._ws.close(reason=item[1], message=item[2])
                    return
                with self._queued_lock:
                    self._queued_bytes -= len(item)
                self._ws.send(item)
        except (ConnectionClosed, OSError, LocalProtocolError):  # closed under us
            self._closing.set()

    def _end_stream(self) -> None:
        # Werkzeug writes an HTTP response once the handler returns; on an upgraded socket
        # that would reach the client as garbage after our close frame. Ending our sending
        # side first makes that write fail quietly instead.
        try:
            self._ws.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _force_close(self) -> None:
        try:
            self._ws.sock.shutdown(socket.SHUT_RDWR)  # wakes both loops; the socket is done
        except OSError:
            pass

    # --------------------------------------------------------------- frames
    def _on_frame(self, raw: str | bytes) -> None:
        size = len(raw)
        if not self._frames.take() or not self._bytes.take(min(size, self._bytes.burst)):
            self._reject(ProtocolError("rate_limited", "slow down"), None)
            return
        msg: dict[str, Any] | None = None
        try:
            msg = parse_frame(raw, self._cfg.max_frame_bytes)
            self._dispatch(msg)
        except ProtocolError as exc:
            self._reject(exc, msg["type"] if msg is not None else None)
        except Exception:  # a bug must cost this frame, never the server or the room
            log.exception("signaling frame from %s failed", self.peer_id)
            self._reject(ProtocolError("internal", "the server could not handle that"), None)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == "ping":
            self.deliver(encode("pong", **({"t": msg["t"]} if "t" in msg else {})))
        elif self.peer_id is None:
            if kind not in UNJOINED_TYPES:
                raise ProtocolError("not_joined", "join a room first")
            try:
                if kind == "create":
                    self.peer_id = self._rooms.create(self, self._group)
                else:
                    self.peer_id = self._rooms.join(self, self._group, msg.get("room"),
                                                    msg.get("token"), msg.get("fresh", False))
            except ProtocolError as exc:  # the operator hears why a room stayed empty
                what = "create a room" if kind == "create" else \
                    f"join {room_label(msg['room'], True)}" if msg.get("room") else "join"
                self._rooms.note(self._group, "a peer from %s could not %s: %s (%s)",
                                 self._group, what, exc.message, exc.code)
                raise
        elif kind in UNJOINED_TYPES:
            raise ProtocolError("already_joined", "this connection is already in a room")
        elif kind == "leave":
            self._rooms.leave(self.peer_id, self)
            self.deliver(encode("left", peer=self.peer_id))
            self.close(1000, "left")
        elif kind not in PENDING_TYPES:
            self._rooms.handle(self.peer_id, self, msg)

    def _reject(self, exc: ProtocolError, ref: str | None) -> None:
        if not self._strikes.take():
            self.deliver(error_frame("abuse", "too many refused frames; closing"))
            self.close(POLICY_VIOLATION, "too many refused frames")
            return
        known = ref if ref in CLIENT_SCHEMAS else None
        self.deliver(error_frame(exc.code, exc.message, known))
