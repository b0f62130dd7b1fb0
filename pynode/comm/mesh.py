"""Meshes: whole messages between peers named by id, ordered and reliable per pair.

The page's mesh is WebRTC data channels driven by the JS bridge (pynode.browser.JsMesh),
a native one will be aiortc, and `MemoryNetwork` is the real in-process one tests use.
`MeshRouter` splits one mesh into channels by a tag byte, so the run protocol
(pynode.run.protocol) and the collective (pynode.comm.webrtc) share the same connections.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod

from pynode.comm.base import CollectiveUsageError

log = logging.getLogger(__name__)


class Mesh(ABC):
    """Whole messages between peers named by id, ordered and reliable per pair."""

    self_id: str

    @property
    @abstractmethod
    def peers(self) -> frozenset[str]:
        """Peers reachable now."""

    @abstractmethod
    def send(self, peer: str, data: bytes) -> None:
        """Queue `data` for `peer` (never blocks); dropped if `peer` is gone."""

    @abstractmethod
    async def recv(self) -> tuple[str, bytes | None]:
        """The next (peer, message). Two events are not messages (every message starts with
        its channel's tag byte, so neither is ambiguous): b"" when `peer` became reachable,
        None when it is gone for good."""


class MemoryNetwork:
    """An in-process mesh for tests: `join(id)` gives a peer's end, `cut(id)` kills it."""

    def __init__(self) -> None:
        self.ends: dict[str, MemoryMesh] = {}

    def join(self, peer_id: str) -> MemoryMesh:
        end = MemoryMesh(self, peer_id)
        for other in self.ends.values():
            other.inbox.put_nowait((peer_id, b""))
            end.inbox.put_nowait((other.self_id, b""))
        self.ends[peer_id] = end
        return end

    def cut(self, peer_id: str) -> None:
        """As if the tab closed: every other end sees `peer_id` gone, it sees them gone."""
        end = self.ends.pop(peer_id, None)
        if end is None:
            return
        for other in self.ends.values():
            other.inbox.put_nowait((peer_id, None))
            end.inbox.put_nowait((other.self_id, None))


class MemoryMesh(Mesh):
    def __init__(self, network: MemoryNetwork, peer_id: str) -> None:
        self.self_id = peer_id
        self.network = network
        self.inbox: asyncio.Queue[tuple[str, bytes | None]] = asyncio.Queue()
        self.sent_bytes = 0
        self.sent_messages = 0

    @property
    def peers(self) -> frozenset[str]:
        if self.self_id not in self.network.ends:
            return frozenset()
        return frozenset(self.network.ends) - {self.self_id}

    def send(self, peer: str, data: bytes) -> None:
        target = self.network.ends.get(peer)
        if target is not None and self.self_id in self.network.ends:
            self.sent_bytes += len(data)
            self.sent_messages += 1
            target.inbox.put_nowait((self.self_id, bytes(data)))

    async def recv(self) -> tuple[str, bytes | None]:
        return await self.inbox.get()


class MeshRouter:
    """Splits one mesh into channels by the first byte of each message (its tag).

    A channel's messages start with its tag, which the channel neither adds nor strips, so
    a large message is never copied. Gone events reach every channel.
    """

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        self._channels: dict[bytes, MeshChannel] = {}
        self._task: asyncio.Task | None = None

    def channel(self, tag: bytes) -> MeshChannel:
        if len(tag) != 1:
            raise CollectiveUsageError(f"a channel tag is one byte, got {tag!r}")
        if tag not in self._channels:
            self._channels[tag] = MeshChannel(self.mesh, tag)
        return self._channels[tag]

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            await self._pump_forever()
        except asyncio.CancelledError:
            pass  # stopped; ending normally keeps Pyodide's loop from reporting the cancel

    async def _pump_forever(self) -> None:
        while True:
            peer, data = await self.mesh.recv()
            if not data:  # reachable / gone: every channel hears it
                for chan in self._channels.values():
                    chan.inbox.put_nowait((peer, data))
                continue
            chan = self._channels.get(bytes(data[:1]))
            if chan is None:
                log.warning("mesh: dropped a message with unknown tag %r from %s", data[:1], peer)
            else:
                chan.inbox.put_nowait((peer, data))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


class MeshChannel(Mesh):
    def __init__(self, mesh: Mesh, tag: bytes) -> None:
        self.mesh, self.tag, self.self_id = mesh, tag, mesh.self_id
        self.inbox: asyncio.Queue[tuple[str, bytes | None]] = asyncio.Queue()

    @property
    def peers(self) -> frozenset[str]:
        return self.mesh.peers

    def send(self, peer: str, data: bytes) -> None:
        if data[:1] != self.tag:
            raise CollectiveUsageError(f"channel {self.tag!r}: a message must start with its tag")
        self.mesh.send(peer, data)

    async def recv(self) -> tuple[str, bytes | None]:
        return await self.inbox.get()

    def drain(self) -> None:
        """Forget queued messages (a new group starts on this channel)."""
        while not self.inbox.empty():
            self.inbox.get_nowait()
