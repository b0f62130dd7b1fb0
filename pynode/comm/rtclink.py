"""One native peer connection (aiortc) of a NativeMesh: like a Link of the page's mesh.js.

An RTCPeerConnection with two pre-negotiated, ordered, reliable data channels: "data"
(the Python peers' messages, cut into fragments: pynode.comm.fragments) and "ui" (small
text the pages show, the heartbeats and the connectivity scan). Sends queue per link and
are fed to the channel while its bufferedAmount stays below HIGH_WATER, resuming on
`bufferedamountlow`. Also here: aiortc's view of candidates, ICE servers and the
selected pair, and whether this machine has a network WebRTC can use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from pynode.comm.base import CommError
from pynode.comm.fragments import FragmentError, Reassembler, fragment, fragment_count
from pynode.comm.mdns import read_chromium_answers

log = logging.getLogger(__name__)

HIGH_WATER = 4 << 20  # stop feeding a channel above this many buffered bytes
LOW_WATER = 1 << 20  # ... and resume when it drains to this
# The connectivity scan: when a link opens, SCAN_PIECES "scan K N ..." strings of
# SCAN_BYTES go out on its "ui" channel; the last one is answered "scanned BYTES", and
# bytes over the time to the answer is the link's MB/s (one RTT included).
SCAN_PIECES = 8
SCAN_BYTES = 16 * 1024


class Link:
    """One peer connection; lives on the network loop. `mesh` is the NativeMesh it
    belongs to (pynode.comm.native_mesh): its signaling and ICE servers, its `links`, and
    the callbacks a link reports to (_opened, _unreachable, _message, _ui_message, _said_bye,
    _gone)."""

    def __init__(self, mesh: Any, peer: str) -> None:
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
        self.unresolved: list[str] = []  # the tab's mDNS names that did not resolve
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
                for name in self.unresolved:  # the likely cause: said with the failure
                    log.warning("peer %s: its address %s did not resolve by multicast DNS: "
                                "both machines must be on one LAN that passes mDNS (UDP 5353 "
                                "to 224.0.0.251)", self.peer, name)
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
            # Said only if the link then fails: ICE often connects anyway (the tab's checks
            # reach this peer, which learns its address as a peer-reflexive candidate), and
            # a warning beside a working link alarmed users.
            log.debug("peer %s: its address %s did not resolve by multicast DNS",
                      self.peer, candidate.ip)
            self.unresolved.append(candidate.ip)

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
            elif kind == "bye":  # a closing tab's goodbye, ahead of its data channel's queue
                self.mesh._said_bye(self.peer)
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
