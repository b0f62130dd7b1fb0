"""A native peer's WebRTC mesh (aiortc): the same links, channels and framing as the page's.

Like server/pyodide_app/mesh.js: one RTCPeerConnection per pair, offered by the peer with the
smaller id (pynode/comm/rtclink.py: its two data channels, "data" with the fragments of
pynode/comm/fragments.py and "ui"). ICE servers: the server's `rtcConfig` (sent once
approved) plus `--ice-server`; without either, host candidates only (docs/NETWORKS.md). A
browser names its host candidates `NAME.local`; aioice resolves them by multicast DNS
(pynode/comm/mdns.py makes Chromium's answers readable to it).

The WebRTC stack and the signaling client run on their own event loop in a daemon thread
(`NetThread`), so ICE consent checks, SCTP acknowledgements and websocket pings go on while
the training loop computes a step. `NativeMesh` is the training loop's side of it: the
`Mesh` of pynode.comm.mesh, its events handed over thread-safely, in order; it keeps the
links to the approved roster and closes one that falls silent (the heartbeats below).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from pynode.comm.mesh import Mesh
from pynode.comm.rtclink import Link, matrix_row
from pynode.comm.signaling import SignalingClient

log = logging.getLogger(__name__)

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


# ------------------------------------------------------------------------- the thread

def gone_text(present: bool, removed: bool = False) -> str:
    """Why a link to a peer is closed when the roster no longer lists it as approved: the
    host removed it (a roster said so), it left the room (closed or lost), or it is there
    unapproved."""
    if removed:
        return "removed by the host"
    return "no longer approved by the host" if present else "left the room"

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


# ------------------------------------------------------------------------- the mesh
class NativeMesh(Mesh):
    """Data channels to every approved peer of the room, as the training loop sees them.

    Build it on the training loop before `signaling` starts, so that no offer finds it
    missing; it connects to approved peers from every roster (the smaller id offers) and
    answers their offers. `ui` holds each page's last message on the "ui" channel.
    `on_link(route)` (on the training loop) hears of every link that opens, and of every one
    that failed before it opened (ICE found no working pair: `route["state"] == "failed"`),
    with its `Link.route()`.
    """

    def __init__(self, signaling: SignalingClient, net: NetThread,
                 ice_servers: Sequence[str] = (),
                 on_link: Callable[[dict[str, Any]], None] | None = None,
                 goodbye: bytes = b"") -> None:
        self.signaling, self.net, self.ice_servers = signaling, net, tuple(ice_servers)
        self.on_link = on_link
        # what a peer's "bye" on its ui channel delivers as that peer's message (the room
        # protocol's goodbye): a closing tab's, ahead of a large message still queued on its
        # data channel, which the tab closes before it is sent
        self.goodbye = goodbye
        self.links: dict[str, Link] = {}  # network loop only
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
        """Every link's route (see `Link.route`), in peer order."""
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
                link = self.links[peer] = Link(self, peer)
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
        present = {e.get("id") for e in self.signaling.roster}
        for peer, link in list(self.links.items()):
            if peer not in approved:
                log.info("peer %s: %s; link closed", peer,
                         gone_text(peer in present, peer in self.signaling.removed))
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
            link = self.links[peer] = Link(self, peer)
            self._guard(link, link.on_offer(str(frame.get("sdp", ""))))
        elif link is not None and kind == "answer":
            self._guard(link, link.on_answer(str(frame.get("sdp", ""))))
        elif link is not None and kind == "ice":
            self._guard(link, link.on_ice(frame))

    def _guard(self, link: Link, step: Coroutine) -> None:
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

    def _said_bye(self, peer: str) -> None:
        if self.goodbye:
            self._message(peer, self.goodbye)

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

    def _unreachable(self, link: Link) -> None:
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
