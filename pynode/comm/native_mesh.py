"""A native peer's WebRTC mesh (aiortc): the same links, channels and framing as the page's.

Like server/pyodide_app/mesh.js: one RTCPeerConnection per pair, offered by the peer with the
smaller id, with two pre-negotiated, ordered, reliable data channels, "data" (id 0: the
Python peers' messages, cut into 48 KiB fragments with the 16-byte header of
server/pyodide_app/fragments.js) and "ui" (id 1: small JSON the pages show). Sends queue per link
and are fed to the channel while its bufferedAmount stays below HIGH_WATER, resuming on
`bufferedamountlow`. ICE servers: the server's `rtcConfig` (sent once approved) plus
`--ice-server`; without either, host candidates only (docs/NETWORKS.md). A browser names its
host candidates `NAME.local`; aioice resolves them by multicast DNS (pynode/comm/mdns.py
makes Chromium's answers readable to it).

The WebRTC stack and the signaling client run on their own event loop in a daemon thread
(`NetThread`), so ICE consent checks, SCTP acknowledgements and websocket pings go on while
the training loop computes a step. `NativeMesh` is the training loop's side of it: the
`Mesh` of pynode.comm.mesh, its events handed over thread-safely, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from pynode.comm.base import CommError
from pynode.comm.mdns import read_chromium_answers
from pynode.comm.mesh import Mesh
from pynode.comm.signaling import SignalingClient

log = logging.getLogger(__name__)

FRAGMENT_BYTES = 48 * 1024
HEADER = struct.Struct("<IIII")  # message id, fragment index, fragment count, message bytes
MAX_MESSAGE_BYTES = 1 << 30
HIGH_WATER = 4 << 20  # stop feeding a channel above this many buffered bytes
LOW_WATER = 1 << 20  # ... and resume when it drains to this
# After (re)joining signaling, e.g. across a server restart, rosters refill as peers come
# back; for this long a peer missing from them keeps its link. Afterwards the roster rules.
ROSTER_GRACE_S = 30.0
# Heartbeats (mesh.js has the same): every open link sends "beat T" on its "ui" channel each
# BEAT_S (T: the sender's clock in ms), answered by "echo T", which gives the link's RTT; a
# link that brought nothing at all for SILENT_S is closed, so the collective leaves a
# dead, frozen or cut-off peer out within seconds instead of at its step deadline (30 s).
# They come from the network thread (a tab's main thread), which a step's compute does not
# block; a training loop hung inside a live peer is still caught by the deadline.
BEAT_S = 0.5
SILENT_S = 3.0
LATE_S = 0.5  # a beat this much later than BEAT_S: this side stalled, not the others
SHARE_EVERY = 4  # beats between two {"links": [...]} rows to every peer (the matrix)
# The connectivity scan: when a link opens, SCAN_PIECES "scan K N ..." strings of
# SCAN_BYTES go out on its "ui" channel; the last one is answered "scanned BYTES", and
# bytes over the time to the answer is the link's MB/s (one RTT included).
SCAN_PIECES = 8
SCAN_BYTES = 16 * 1024


class FragmentError(CommError):
    """A fragment stream an ordered, reliable channel cannot produce: the link is broken."""


# ------------------------------------------------------------------------- framing
def fragment_count(total: int) -> int:
    return max(1, -(-total // FRAGMENT_BYTES))


def fragment(message: bytes, msg_id: int, index: int) -> bytes:
    """Fragment `index` of `message`: header + its slice (fragments.js `fragment`)."""
    total = len(message)
    start = index * FRAGMENT_BYTES
    body = message[start : start + FRAGMENT_BYTES]
    return HEADER.pack(msg_id & 0xFFFFFFFF, index, fragment_count(total), total) + body


class Reassembler:
    """Collects the fragments of one message at a time (fragments.js `Reassembler`)."""

    def __init__(self, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._current: tuple[int, int, int] | None = None  # (id, count, total)
        self._next = 0
        self._bytes = bytearray()

    def push(self, data: bytes) -> bytes | None:
        """One fragment in; the whole message when complete, else None. FragmentError on
        anything out of order, oversized or inconsistent."""
        if len(data) < HEADER.size:
            raise FragmentError("fragment shorter than its header")
        msg_id, index, count, total = HEADER.unpack_from(data)
        body = memoryview(data)[HEADER.size :]
        if index == 0:
            if self._current is not None:
                raise FragmentError(f"message {msg_id} began inside message {self._current[0]}")
            if total > self.max_bytes:
                raise FragmentError(f"message of {total} bytes exceeds {self.max_bytes}")
            if count != fragment_count(total):
                raise FragmentError(f"message {msg_id}: {count} fragments cannot hold {total} "
                                    "bytes")
            self._current, self._next, self._bytes = (msg_id, count, total), 0, bytearray()
        if self._current != (msg_id, count, total) or index != self._next:
            raise FragmentError(f"unexpected fragment {index}/{count} of message {msg_id}")
        if len(body) != min(FRAGMENT_BYTES, total - index * FRAGMENT_BYTES):
            raise FragmentError(f"fragment {index} of message {msg_id} has {len(body)} bytes")
        self._bytes += body
        self._next += 1
        if self._next < count:
            return None
        self._current = None
        whole, self._bytes = bytes(self._bytes), bytearray()
        return whole


# ------------------------------------------------------------------------- the thread
class NetThread:
    """An event loop in a daemon thread for aiortc and signaling."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="pynode-net",
                                        daemon=True)
        self._thread.start()

    def call(self, fn: Any, *args: Any) -> None:
        """Run `fn(*args)` on the network loop soon (from any thread)."""
        self.loop.call_soon_threadsafe(fn, *args)

    async def run(self, coro: Coroutine) -> Any:
        """Await `coro` on the network loop from another loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


# ------------------------------------------------------------------------- one link
class _Link:
    """One peer connection; lives on the network loop."""

    def __init__(self, mesh: NativeMesh, peer: str) -> None:
        from aiortc import RTCPeerConnection

        read_chromium_answers()
        self.mesh, self.peer = mesh, peer
        self.pc = RTCPeerConnection(rtc_configuration(
            getattr(mesh.signaling, "rtc_config", None) or {}, mesh.ice_servers))
        self.data = self.pc.createDataChannel("data", negotiated=True, id=0, ordered=True)
        self.ui = self.pc.createDataChannel("ui", negotiated=True, id=1, ordered=True)
        self.data.bufferedAmountLowThreshold = LOW_WATER
        self.queue: deque[list[Any]] = deque()  # [message bytes, id, next fragment]
        self.next_id = 1
        self.reassembler = Reassembler()
        self.pending_ice: list[Any] = []
        self.candidates_ended = False
        self.is_open = self.is_gone = False
        self.heard = 0.0  # network loop time of the last message on either channel
        self.rtt_ms: float | None = None  # the last heartbeat's round trip
        self.mbps: float | None = None  # the scan's MB/s
        self.scan_started: float | None = None
        self.scan_received = 0  # bytes of the other side's scan so far
        self._wire()

    def _wire(self) -> None:
        pc, data, ui = self.pc, self.data, self.ui

        @pc.on("connectionstatechange")
        def _state() -> None:
            log.debug("peer %s: connection %s", self.peer, pc.connectionState)
            if pc.connectionState == "failed" and not self.is_open:
                self.mesh._unreachable(self)
            if pc.connectionState in ("failed", "closed"):
                self.close()

        def maybe_open() -> None:
            if not self.is_open and data.readyState == "open" and ui.readyState == "open":
                self.is_open = True
                self.heard = asyncio.get_running_loop().time()
                self.scan()
                log.debug("peer %s: data channels open", self.peer)
                self.mesh._opened(self.peer)
                self.pump()

        data.on("open", maybe_open)
        ui.on("open", maybe_open)
        data.on("close", self.close)
        ui.on("close", self.close)
        data.on("bufferedamountlow", self.pump)
        data.on("message", self.receive)
        ui.on("message", self.receive_ui)

    async def offer(self) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        self.mesh.signaling.send("offer", to=self.peer, sdp=self.pc.localDescription.sdp)

    async def on_offer(self, sdp: str) -> None:
        from aiortc import RTCSessionDescription

        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        self.mesh.signaling.send("answer", to=self.peer, sdp=self.pc.localDescription.sdp)
        await self._flush_ice()

    async def on_answer(self, sdp: str) -> None:
        from aiortc import RTCSessionDescription

        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
        await self._flush_ice()

    async def on_ice(self, frame: dict[str, Any]) -> None:
        candidate = _candidate(frame)
        if candidate is False or (candidate is None and self.candidates_ended):
            return  # a kind aiortc cannot use (TCP, unparsable), or a repeated end
        if candidate is None:
            self.candidates_ended = True
        # Held until both descriptions are set: aioice drops the components for which
        # end-of-candidates brought no candidate (one mDNS name that did not resolve) and
        # then gathers no local candidate for them, so the answer would carry none and ICE
        # would never start, nor fail.
        if self.pc.remoteDescription is None or self.pc.localDescription is None:
            self.pending_ice.append(candidate)
        else:
            await self._add_ice(candidate)

    async def _flush_ice(self) -> None:
        pending, self.pending_ice = self.pending_ice, []
        for candidate in pending:
            await self._add_ice(candidate)

    async def _add_ice(self, candidate: Any) -> None:
        """Hand `candidate` to aiortc; a browser's `NAME.local` is resolved by aioice over
        multicast DNS first, and one that did not resolve is dropped: say so."""
        await self.pc.addIceCandidate(candidate)
        if candidate is None or not candidate.ip.endswith(".local") or self.pc.sctp is None:
            return
        known = self.pc.sctp.transport.transport.getRemoteCandidates()
        if not any(c.ip == candidate.ip for c in known):
            log.warning("peer %s: its address %s did not resolve by multicast DNS: both "
                        "machines must be on one LAN that passes mDNS (UDP 5353 to "
                        "224.0.0.251)", self.peer, candidate.ip)

    def send(self, message: bytes) -> None:
        self.queue.append([message, self.next_id, 0])
        self.next_id = (self.next_id + 1) & 0xFFFFFFFF
        self.pump()

    def pump(self) -> None:
        """Feed queued fragments while the channel's buffer is below HIGH_WATER."""
        data = self.data
        while self.queue and data.readyState == "open" and data.bufferedAmount < HIGH_WATER:
            entry = self.queue[0]
            message, msg_id, index = entry
            data.send(fragment(message, msg_id, index))
            entry[2] = index + 1
            if entry[2] >= fragment_count(len(message)):
                self.queue.popleft()

    def receive_ui(self, text: str | bytes) -> None:
        now = self.heard = asyncio.get_running_loop().time()
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        kind, _, rest = text.partition(" ")
        with contextlib.suppress(ValueError):
            if kind == "beat":
                self.send_ui(f"echo {rest}")
            elif kind == "echo":
                self.rtt_ms = round(now * 1000 - float(rest), 2)
            elif kind == "scan":
                self.scan_received += len(text)
                index, count, _ = rest.split(" ", 2)
                if index == count:
                    self.send_ui(f"scanned {self.scan_received}")
                    self.scan_received = 0
            elif kind == "scanned" and self.scan_started is not None:
                self.mbps = round(int(rest) / 1e6 / max(now - self.scan_started, 1e-6), 2)
                self.scan_started = None
            else:
                self.mesh._ui_message(self.peer, text)

    def scan(self) -> None:
        """Send the connectivity scan's pieces (see SCAN_PIECES)."""
        self.scan_started = asyncio.get_running_loop().time()
        for index in range(1, SCAN_PIECES + 1):
            head = f"scan {index} {SCAN_PIECES} "
            self.send_ui(head + "x" * (SCAN_BYTES - len(head)))

    def beat(self) -> None:
        self.send_ui(f"beat {asyncio.get_running_loop().time() * 1000:.3f}")

    def receive(self, data: bytes | str) -> None:
        self.heard = asyncio.get_running_loop().time()
        if isinstance(data, str):
            data = data.encode()
        try:
            whole = self.reassembler.push(data)
        except FragmentError as exc:
            log.warning("peer %s: broken data channel: %s", self.peer, exc)
            self.close()
            return
        if whole is not None:
            self.mesh._message(self.peer, whole)

    def route(self) -> dict[str, Any]:
        """This link as the connectivity matrix shows it (like mesh.js `Link.route`):
        {peer, state, local, remote, localAddress, remoteAddress, rttMs, mbps}: the candidate
        types and addresses ("ip:port") of the selected pair, the last heartbeat's round trip
        and the connectivity scan's MB/s (None until measured). A relayed end learned from a check
        before its candidate was signalled reads `prflx` (its address is the relay's)."""
        local = remote = local_address = remote_address = None
        pair = _selected_pair(self.pc)
        if pair is not None:
            local, remote = pair.local_candidate.type, pair.remote_candidate.type
            local_address = "{}:{}".format(*pair.local_addr)
            remote_address = "{}:{}".format(*pair.remote_addr)
        return {"peer": self.peer, "state": self.pc.connectionState, "local": local,
                "remote": remote, "localAddress": local_address,
                "remoteAddress": remote_address, "rttMs": self.rtt_ms,
                "mbps": self.mbps}

    def send_ui(self, text: str) -> None:
        if self.ui.readyState == "open":
            self.ui.send(text)

    def close(self) -> None:
        if self.is_gone:
            return
        self.is_gone = True
        log.debug("peer %s: link closed", self.peer)
        self.queue.clear()
        asyncio.ensure_future(self.pc.close())
        if self.mesh.links.get(self.peer) is self:
            del self.mesh.links[self.peer]
        if self.is_open:
            self.mesh._gone(self.peer)


def matrix_row(a: str, route: dict[str, Any]) -> dict[str, Any]:
    """One direction of the connectivity matrix from `a`'s route to one peer."""
    local, remote = route.get("local"), route.get("remote")
    return {"a": a, "b": route["peer"], "state": route.get("state"), "local": local,
            "remote": remote, "candidate": f"{local} -> {remote}" if local and remote else None,
            "localAddress": route.get("localAddress"), "remoteAddress": route.get("remoteAddress"),
            "rtt_ms": route.get("rttMs"), "mbps": route.get("mbps")}


def _selected_pair(pc: Any) -> Any:
    """aioice's nominated candidate pair of `pc` (component 1), or None before ICE chose
    one. aiortc has no getStats entry for it, so this reads aioice's connection."""
    sctp = pc.sctp
    connection = getattr(sctp.transport.transport, "_connection", None) if sctp else None
    nominated = getattr(connection, "_nominated", None) or {}
    return nominated.get(1)


def _candidate(frame: dict[str, Any]) -> Any:
    """The aiortc candidate of an `ice` frame; None marks the end of candidates, False a
    candidate to skip."""
    from aiortc.sdp import candidate_from_sdp

    text = frame.get("candidate") or ""
    if not text:
        return None
    try:
        candidate = candidate_from_sdp(text.split(":", 1)[1] if text.startswith("candidate:")
                                       else text)
    except (AssertionError, IndexError, ValueError):
        return False
    if candidate.protocol.lower() != "udp":
        return False
    candidate.sdpMid = frame.get("sdpMid")
    candidate.sdpMLineIndex = frame.get("sdpMLineIndex")
    return candidate


class NoNetworkError(CommError):
    """This machine has no interface WebRTC can use (only loopback)."""


def require_network() -> None:
    """NoNetworkError unless aioice would find a host address to gather candidates from:
    WebRTC gathers none on loopback, so peers there would wait for each other forever."""
    from aioice.ice import get_host_addresses

    if not get_host_addresses(use_ipv4=True, use_ipv6=True):
        raise NoNetworkError(
            "WebRTC needs a network interface other than loopback (it gathers no loopback "
            "candidates), and this machine has none up: connect it to a network "
            "(docs/NETWORKS.md)")


def rtc_configuration(server: dict[str, Any], own_urls: Sequence[str] = ()) -> Any:
    """aiortc's RTCConfiguration from the server's `rtcConfig` (its ICE servers, with TURN
    credentials, and the relay-only switch) plus this peer's own `--ice-server` URLs."""
    from aiortc import RTCConfiguration, RTCIceServer

    servers = [RTCIceServer(urls=s["urls"], username=s.get("username"),
                            credential=s.get("credential"))
               for s in server.get("iceServers") or () if isinstance(s, dict) and s.get("urls")]
    servers += [RTCIceServer(urls=u) for u in own_urls]
    if server.get("iceTransportPolicy") != "relay":
        return RTCConfiguration(iceServers=servers)
    try:
        from aiortc.rtcconfiguration import RTCIceTransportPolicy  # in aiortc 1.16
    except ImportError:
        raise CommError("the server asks for relay-only ICE, which this aiortc cannot do "
                        "(no RTCIceTransportPolicy): pip install -U aiortc") from None
    return RTCConfiguration(iceServers=servers, iceTransportPolicy=RTCIceTransportPolicy.RELAY)


# ------------------------------------------------------------------------- the mesh
class NativeMesh(Mesh):
    """Data channels to every approved peer of the room, as the training loop sees them.

    Build it on the training loop before `signaling` starts, so that no offer finds it
    missing; it connects to approved peers from every roster (the smaller id offers) and
    answers their offers. `ui` holds each page's last message on the "ui" channel.
    `on_link(route)` (on the training loop) hears of every link that opens, and of every one
    that failed before it opened (ICE found no working pair: `route["state"] == "failed"`),
    with its `_Link.route()`.
    """

    def __init__(self, signaling: SignalingClient, net: NetThread,
                 ice_servers: Sequence[str] = (),
                 on_link: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.signaling, self.net, self.ice_servers = signaling, net, tuple(ice_servers)
        self.on_link = on_link
        self.links: dict[str, _Link] = {}  # network loop only
        self.ui: dict[str, dict[str, Any]] = {}
        self.sent_bytes = 0
        self.received_bytes = 0  # whole messages from the data channels (network loop adds)
        self._shown = ""  # the last `show`, as JSON
        self._open: frozenset[str] = frozenset()
        self._joined_at = float("-inf")  # network loop time of the last `joined`
        self._prune_timer: asyncio.TimerHandle | None = None
        self._beating: asyncio.Future | None = None  # _beat_forever while a link is open
        self._main = asyncio.get_running_loop()
        self._events: asyncio.Queue[tuple[str, bytes | None]] = asyncio.Queue()
        net.call(self._attach)

    # ----------------------------------------------------------------- Mesh
    @property
    def self_id(self) -> str:  # type: ignore[override]
        """The id signaling assigned ("" until the server answered the join)."""
        return self.signaling.peer_id or ""

    @property
    def peers(self) -> frozenset[str]:
        return self._open

    def send(self, peer: str, data: bytes) -> None:
        if peer in self._open:
            self.sent_bytes += len(data)
            self.net.call(self._send_net, peer, bytes(data))

    async def recv(self) -> tuple[str, bytes | None]:
        return await self._events.get()

    def show(self, state: dict[str, Any]) -> None:
        """What the pages' peer tables show for this peer ({state, step, loss, hash, probe,
        leader, run, error}): sent on the "ui" channel now and to every peer that opens."""
        self.net.call(self._show_net, json.dumps(state, separators=(",", ":")))

    async def flush(self, timeout: float = 5.0) -> None:
        """Wait (at most `timeout`) until every queued message went to the wire."""
        await self.net.run(self._flush_net(timeout))

    async def routes(self) -> list[dict[str, Any]]:
        """Every link's route (see `_Link.route`), in peer order."""
        return await self.net.run(self._routes_net())

    async def matrix(self) -> list[dict[str, Any]]:
        """The connectivity matrix as far as this peer knows it: its own links, measured
        now, and the rows the other peers last shared; one per direction, {a, b, state,
        local, remote, candidate, localAddress, remoteAddress, rtt_ms, mbps} as `a` measured
        its link to `b` (the page's `status().links` has the same rows)."""
        rows = [matrix_row(self.self_id, r) for r in await self.routes()]
        for peer, shown in sorted(self.ui.items()):
            for r in shown.get("links") or ():
                if isinstance(r, dict) and r.get("peer"):
                    rows.append(matrix_row(peer, r))
        return rows

    async def close(self) -> None:
        """Close every link (the others see this peer gone at once)."""
        await self.net.run(self._close_net())

    # ----------------------------------------------------------------- network loop
    def _attach(self) -> None:
        for kind in ("offer", "answer", "ice"):
            self.signaling.on(kind, self._on_signal)
        self.signaling.on("roster", lambda _frame: self._connect_roster())
        self.signaling.on("joined", lambda _frame: self._rejoined())
        if self.signaling.peer_id:
            self._rejoined()
        self._connect_roster()

    def _rejoined(self) -> None:
        self._joined_at = asyncio.get_running_loop().time()

    def _connect_roster(self) -> None:
        """Connect to every approved peer in the roster (the smaller id offers), and drop
        the links of peers that are not on it (removed by the host, or gone)."""
        if not (self.signaling.approved and self.self_id):
            return
        for entry in self.signaling.roster:
            peer = entry.get("id")
            if entry.get("state") != "approved" or peer == self.self_id or peer in self.links:
                continue
            if self.self_id < peer:
                link = self.links[peer] = _Link(self, peer)
                self._guard(link, link.offer())
        self._prune_links()

    def _prune_links(self) -> None:
        """Close every link to a peer the roster does not list as approved. Within
        ROSTER_GRACE_S of (re)joining signaling the roster may still be refilling after a
        server restart (the channels never touch the server and carry on meanwhile), so
        the check waits until then."""
        loop = asyncio.get_running_loop()
        wait = self._joined_at + ROSTER_GRACE_S - loop.time()
        if wait > 0:
            if self._prune_timer is None:
                self._prune_timer = loop.call_later(wait, self._prune_later)
            return
        if not (self.signaling.approved and self.signaling.connected):
            return  # no roster to go by: keep what we have
        approved = {e.get("id") for e in self.signaling.roster if e.get("state") == "approved"}
        for peer, link in list(self.links.items()):
            if peer not in approved:
                log.info("peer %s: not on the approved roster; link closed", peer)
                link.close()

    def _prune_later(self) -> None:
        self._prune_timer = None
        self._prune_links()

    def _on_signal(self, frame: dict[str, Any]) -> None:
        kind, peer = frame.get("type"), frame.get("from")
        if not isinstance(peer, str) or not self.self_id:
            return
        link = self.links.get(peer)
        if kind == "offer":
            if link is not None:
                link.close()  # the other side restarted: start over
            link = self.links[peer] = _Link(self, peer)
            self._guard(link, link.on_offer(str(frame.get("sdp", ""))))
        elif link is not None and kind == "answer":
            self._guard(link, link.on_answer(str(frame.get("sdp", ""))))
        elif link is not None and kind == "ice":
            self._guard(link, link.on_ice(frame))

    def _guard(self, link: _Link, step: Coroutine) -> None:
        async def guarded() -> None:
            try:
                await step
            except Exception as exc:  # a failed negotiation costs this link only
                log.warning("peer %s: WebRTC: %s: %s", link.peer, type(exc).__name__, exc)
                link.close()
        asyncio.ensure_future(guarded())

    def _send_net(self, peer: str, data: bytes) -> None:
        link = self.links.get(peer)
        if link is not None and link.is_open:
            link.send(data)

    def _show_net(self, text: str) -> None:
        self._shown = text
        for link in list(self.links.values()):
            if link.is_open:
                link.send_ui(text)

    def _ui_message(self, peer: str, text: str | bytes) -> None:
        with contextlib.suppress(ValueError, TypeError):
            message = json.loads(text)
            if isinstance(message, dict):
                self.ui[peer] = {**self.ui.get(peer, {}), **message}

    def _opened(self, peer: str) -> None:
        self._open = self._open | {peer}
        if self._beating is None:
            self._beating = asyncio.ensure_future(self._beat_forever())
        link = self.links.get(peer)
        if link is not None and self._shown:
            link.send_ui(self._shown)
        if link is not None and self.on_link is not None:
            self._main.call_soon_threadsafe(self.on_link, link.route())
        self._main.call_soon_threadsafe(self._events.put_nowait, (peer, b""))

    def _unreachable(self, link: _Link) -> None:
        if self.on_link is not None:
            self._main.call_soon_threadsafe(self.on_link, link.route())

    def _message(self, peer: str, data: bytes) -> None:
        if data:  # an empty message would read as "reachable"; the page drops them too
            self.received_bytes += len(data)
            self._main.call_soon_threadsafe(self._events.put_nowait, (peer, data))

    def _gone(self, peer: str) -> None:
        self._open = self._open - {peer}
        self.ui.pop(peer, None)
        self._main.call_soon_threadsafe(self._events.put_nowait, (peer, None))

    async def _flush_net(self, timeout: float) -> None:
        until = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < until and any(
            link.queue or link.data.bufferedAmount for link in self.links.values()
        ):
            await asyncio.sleep(0.02)

    async def _routes_net(self) -> list[dict[str, Any]]:
        return [self.links[peer].route() for peer in sorted(self.links)]

    async def _beat_forever(self) -> None:
        loop = asyncio.get_running_loop()
        beats, last = 0, loop.time()
        while any(link.is_open for link in self.links.values()):
            await asyncio.sleep(BEAT_S)
            beats += 1
            now = loop.time()
            if now - last > BEAT_S + LATE_S:
                # This thread itself did not run (an overloaded machine, a suspended
                # process): what it did not read says nothing about the others.
                for link in self.links.values():
                    link.heard = max(link.heard, now - BEAT_S)
            last = now
            if beats % SHARE_EVERY == 0:
                row = json.dumps({"links": [self.links[p].route() for p in sorted(self.links)]})
                for link in self.links.values():
                    link.send_ui(row)
            for link in list(self.links.values()):
                if not link.is_open:
                    continue
                if now - link.heard > SILENT_S:
                    log.warning("peer %s: nothing heard for %.1f s (no heartbeat); left out",
                                link.peer, now - link.heard)
                    link.close()
                else:
                    link.beat()
        self._beating = None

    async def _close_net(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
        links = list(self.links.values())
        for link in links:
            link.close()
        await asyncio.gather(*(link.pc.close() for link in links), return_exceptions=True)
