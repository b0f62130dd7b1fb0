"""The server's signaling protocol from a native peer: join a room, wait for approval, relay
WebRTC offers/answers/ICE, follow the roster (docs/SERVER.md, server/protocol.py).

It mirrors the page's server/pyodide_app/signaling.js: every server frame is handed to the
listeners of its type (`on("roster", fn)`), and a dropped socket is reopened with the resume
token of `joined`, so this peer keeps its id (and its role) across a server restart or a
network blip. The data channels never touch the server, so training goes on meanwhile.
Native only (the `websockets` package); all of it runs on one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import re
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from pynode.addresses import only_this_machine
from pynode.core.errors import DaisyError

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
RECONNECT_S = (0.5, 1.0, 2.0, 5.0)  # waits before successive reconnects, then the last again
FINAL_CLOSE_CODES = frozenset({4403, 4409})  # denied/removed, replaced: never reconnect
OPEN_TIMEOUT_S = 10.0

Listener = Callable[[dict[str, Any]], None]


class SignalingError(DaisyError):
    """The server cannot be reached, or refused this peer (declined, removed, bad room)."""


# A room code as the server takes them (22 characters of this alphabet; server/protocol.py's
# CODE_PATTERN, which a test keeps equal to this).
ROOM_CODE = re.compile(r"[A-Za-z0-9_-]{22}")


def check_room_code(code: str) -> str:
    """`code` if it has a room code's form; SignalingError otherwise, said here rather than
    after the unit checks and the server's refusal (a well-formed code that is no room's is
    told only as a wait: the server answers it as a room whose host has not decided)."""
    if not ROOM_CODE.fullmatch(code):
        raise SignalingError(f"--room {code!r} is not a room code: a code is the 22 letters, "
                             "digits, - and _ after ?room= in the host's link")
    return code


def split_link(server: str) -> tuple[str, str | None]:
    """(server address, room code or None) of a --server given as the server's address or
    as a room's share link (http://HOST:PORT/?room=CODE, what a host prints and a page
    shows): its room was dropped, and the peer joined the automatic room instead."""
    parts = urlsplit(server.strip())
    query = parse_qs(parts.query, keep_blank_values=True)
    if not query and not parts.fragment:
        return server, None
    rooms = query.pop("room", [])
    if query or parts.fragment or len(rooms) != 1:
        raise SignalingError(f"--server takes the server's address, http://HOST:PORT, or a "
                             f"room's link, http://HOST:PORT/?room=CODE; got {server!r}")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")), \
        check_room_code(rooms[0])


def ws_url(server: str) -> str:
    """The /ws address of a server given as http(s)://HOST:PORT (or already ws(s)://.../ws)."""
    parts = urlsplit(server.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise SignalingError(f"--server must look like http://HOST:PORT, got {server!r}")
    try:
        (parts.hostname or "").encode("idna")  # what the name lookup would refuse later
    except UnicodeError:
        raise SignalingError(f"--server {server!r}: {parts.hostname!r} is not a host name "
                             "(labels of 1-63 letters, digits and hyphens)") from None
    path = parts.path.rstrip("/")
    if not path.endswith("/ws"):
        path += "/ws"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


# What start()'s timeout says the connection was still waiting for.
WAITING_HINTS = {
    "name": (" (the server's name did not resolve in that time: no name server answers "
             "here? give the server's address instead, e.g. http://10.0.0.5:8000)"),
    "connect": (" (the connection was neither refused nor answered: a firewall dropping the "
                "port, a machine that is off, or something there that is not a DaisyChain "
                "server?)"),
    "join": " (the connection opened, but the server did not answer the join)",
}


def unreachable_hint(exc: BaseException, url: str = "") -> str:
    """What a refused or unnamed server address most often means, for its error line."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if isinstance(exc, OSError) and only_this_machine(host):
        # most often the server was never started here; the copied link comes second
        port = f" --port {parts.port}" if parts.port else ""
        return (f" (nothing answers at {host}, this machine itself: is the server running "
                f"here? `python -m server{port}` starts it. Or a link copied from a page "
                "opened at localhost on another machine: it names that machine only there; "
                "ask for the link of the page opened at its network address)")
    if isinstance(exc, ConnectionRefusedError):
        return (" (nothing listens there: is the server running, on that port and address? "
                "`python -m server` listens on 127.0.0.1, this machine only, unless given "
                "--host 0.0.0.0)")
    if isinstance(exc, socket.gaierror):
        return " (that name does not resolve here: give the server's address, e.g. 10.0.0.5)"
    return ""


class SignalingClient:
    """One peer's websocket to the server. `await start()` once, then `send` and listen.

    State kept from the frames, as the page keeps it: `peer_id`, `room` (code, None for an
    automatic room), `role` ("host"/"member"), `approved`, `roster` (the last peer list),
    `rtc_config` (the server's ICE servers, sent once approved).
    `closed_reason` is set once the server turned this peer away for good.
    """

    def __init__(self, server: str, *, room: str | None = None, create: bool = False) -> None:
        self.url = ws_url(server)
        self.room, self.create = room, create
        self.token: str | None = None
        self.peer_id: str | None = None
        self.role: str | None = None
        self.approved = False
        self.roster: list[dict[str, Any]] = []
        self.removed: set[str] = set()  # peers a roster said the host removed
        # The server's ICE servers (TURN credentials included) once approved: the fields
        # iceServers / iceTransportPolicy of an RTCConfiguration (docs/NETWORKS.md).
        self.rtc_config: dict[str, Any] = {}
        self.closed_reason: str | None = None
        self.connected = False
        self._listeners: dict[str, list[Listener]] = {}
        self._outbox: asyncio.Queue[str] | None = None
        self._task: asyncio.Task | None = None
        self.closing = False  # close() was called: no more reconnects
        self._waiting = ""  # what the connection waits for now: start's timeout names it
        self._last_failure = ""  # why the last connection attempt failed, if one did

    # ----------------------------------------------------------------- listeners
    def on(self, kind: str, listener: Listener) -> None:
        """Call `listener(frame)` for every server frame of type `kind` (after this client
        updated its own state). "socket" {open: bool, code, reason} reports the connection."""
        self._listeners.setdefault(kind, []).append(listener)

    def _dispatch(self, kind: str, frame: dict[str, Any]) -> None:
        for listener in list(self._listeners.get(kind, ())):
            try:
                listener(frame)
            except Exception:  # one listener's bug must not cost the connection
                log.exception("signaling: %s listener failed", kind)

    # ----------------------------------------------------------------- connection
    async def start(self, timeout: float = OPEN_TIMEOUT_S) -> dict[str, Any]:
        """Connect and join (or create) the room; returns the `joined` frame.

        SignalingError if the server cannot be reached within `timeout` or refuses the join.
        """
        if self._task is not None:
            raise SignalingError("this signaling client is already started")
        joined: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        def first(frame: dict[str, Any]) -> None:
            if not joined.done():
                joined.set_result(frame)

        def refused(frame: dict[str, Any]) -> None:
            if not joined.done() and frame.get("type") in ("error", "denied", "removed"):
                text = frame.get("message") or frame.get("reason") or frame.get("code")
                joined.set_exception(SignalingError(f"the server refused to join: {text}"))

        self.on("joined", first)
        for kind in ("error", "denied", "removed"):
            self.on(kind, refused)
        self._task = asyncio.ensure_future(self._run(joined))
        try:
            return await asyncio.wait_for(asyncio.shield(joined), timeout)
        except asyncio.TimeoutError:
            waiting, failure = self._waiting, self._last_failure
            await self.close()
            if waiting:
                hint = WAITING_HINTS[waiting]
            else:  # between attempts: what the last one met
                hint = f" (the last try: {failure})" if failure else ""
            raise SignalingError(f"no answer from {self.url} within {timeout:g} s{hint}") \
                from None
        except SignalingError:
            await self.close()
            raise

    async def _run(self, joined: asyncio.Future) -> None:
        attempt = 0
        while not self.closing:
            code, reason = await self._session()
            if self.closing or code in FINAL_CLOSE_CODES:
                break
            if not joined.done() and self.token is None and attempt >= len(RECONNECT_S):
                joined.set_exception(SignalingError(f"cannot reach {self.url}: {reason}"))
                break
            wait = RECONNECT_S[min(attempt, len(RECONNECT_S) - 1)]
            attempt = 0 if self.connected else attempt + 1
            self.connected = False
            await asyncio.sleep(wait)

    async def _resolve(self) -> None:
        """Look the server's name up first (an address needs no lookup), so that a name no
        name server answers for reads as that, not as a server that does not answer."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        try:
            ipaddress.ip_address(host)
            return
        except ValueError:
            pass
        self._waiting = "name"
        await asyncio.get_running_loop().getaddrinfo(host, parts.port, type=socket.SOCK_STREAM)

    async def _session(self) -> tuple[int | None, str]:
        """One websocket's life: join, read frames until it closes; (close code, reason)."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        try:
            await self._resolve()
            self._waiting = "connect"
            ws = await connect(self.url, proxy=None, compression=None,
                               open_timeout=OPEN_TIMEOUT_S, max_size=2**20)
        except (OSError, UnicodeError, InvalidHandshake, asyncio.TimeoutError) as exc:
            self._waiting = ""
            what = ("connection refused" if isinstance(exc, ConnectionRefusedError)
                    else f"{type(exc).__name__}: {exc}")  # not "Connect call failed (...)"
            self._last_failure = f"{what}{unreachable_hint(exc, self.url)}"
            return None, self._last_failure
        self._waiting = "join"
        self._outbox = asyncio.Queue()
        writer = asyncio.ensure_future(self._write(ws, self._outbox))
        self.connected = True
        self._dispatch("socket", {"type": "socket", "open": True})
        if self.create and self.token is None:
            self.send("create")
        else:
            self.send("join", **self._join_fields())
        code, reason = None, "closed"
        try:
            async for raw in ws:
                self._on_frame(raw)
        except ConnectionClosed:
            pass
        finally:
            writer.cancel()
            self._outbox = None
            with contextlib.suppress(Exception):
                await ws.close()
            if ws.close_code is not None:
                code, reason = ws.close_code, ws.close_reason or ""
        self._dispatch("socket", {"type": "socket", "open": False, "code": code,
                                  "reason": reason})
        self._waiting = ""
        self._last_failure = (f"the server closed the socket ({code} {reason})".strip()
                              if code is not None else "the socket closed")
        return code, reason

    async def _write(self, ws: Any, outbox: asyncio.Queue[str]) -> None:
        from websockets.exceptions import ConnectionClosed

        with contextlib.suppress(ConnectionClosed, asyncio.CancelledError):
            while True:
                await ws.send(await outbox.get())

    def _join_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if self.room:
            fields["room"] = self.room
        if self.token:
            fields["token"] = self.token
        return fields

    def _on_frame(self, raw: str | bytes) -> None:
        try:
            frame = json.loads(raw)
        except (TypeError, ValueError):
            return
        if not isinstance(frame, dict) or frame.get("v") != PROTOCOL_VERSION:
            return
        kind = frame.get("type")
        if not isinstance(kind, str):
            return
        if kind == "joined":
            self.token, self.peer_id = frame.get("token"), frame.get("peer")
            self.role, self.approved = frame.get("role"), frame.get("state") == "approved"
            if frame.get("room"):
                self.room = frame["room"]
            if isinstance(frame.get("rtcConfig"), dict):
                self.rtc_config = frame["rtcConfig"]
        elif kind == "approved":
            self.approved = True
            if isinstance(frame.get("rtcConfig"), dict):
                self.rtc_config = frame["rtcConfig"]
        elif kind == "roster":
            self.roster = list(frame.get("peers") or [])
            removed = frame.get("removed")
            if isinstance(removed, list):
                self.removed.update(p for p in removed if isinstance(p, str))
            me = next((p for p in self.roster if p.get("id") == self.peer_id), None)
            if me is not None:
                self.role, self.approved = me.get("role"), me.get("state") == "approved"
        elif kind in ("denied", "removed"):
            self.closed_reason = frame.get("reason") or kind
        self._dispatch(kind, frame)

    def send(self, kind: str, **fields: Any) -> bool:
        """Queue a client frame; False (nothing sent) while the socket is down."""
        if self._outbox is None:
            return False
        self._outbox.put_nowait(json.dumps({"v": PROTOCOL_VERSION, "type": kind, **fields},
                                           separators=(",", ":")))
        return True

    async def close(self) -> None:
        """Say `leave` (when in a room) and stop reconnecting. Safe to call twice."""
        self.closing = True
        if self._outbox is not None and self.peer_id is not None:
            self.send("leave")
            await asyncio.sleep(0.05)  # let the writer hand `leave` to the socket
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
