"""Transports behind one collective interface, picked by name.

base.py       Collective, ReduceResult, PeerLost and the checks every transport shares
wire.py       frame header of the star protocol; the one codec of structured messages
blocks.py     the int64 codec's bit-packed blocks for a loopback group (numpy form)
star.py       what a hub computes from its members' frames (pure)
streams.py    asyncio stream links (native only)
loopback.py   processes on one machine in a star around rank 0
gloo.py       torch.distributed gloo across machines (torch imported lazily)
mesh.py       Mesh: whole messages between peer ids (WebRTC in the page, in-memory in tests)
webrtc.py     a Collective over a Mesh: reduce-scatter + all-gather, leader-committed members
native_mesh.py  the Mesh of a native peer: aiortc data channels + the server's signaling
rtclink.py    one aiortc peer connection of it (channels, ICE, heartbeats' replies)
fragments.py  the data channel's fragments, the same as the page's fragments.js
mdns.py       Chromium's mDNS answers made readable to aioice (a tab's .local candidate)
signaling.py  the client of the server's signaling websocket (native peers)
bridge.py     a gloo cluster that takes part in a room through its rank 0

Transports know nothing of training: the run layer (pynode.run) drives them.
"""

from __future__ import annotations

import importlib
from typing import Any

from pynode.comm.base import (
    Collective,
    CollectiveUsageError,
    CommError,
    PeerLost,
    ReduceResult,
    check_headroom,
)

__all__ = [
    "Collective",
    "CollectiveUsageError",
    "CommError",
    "PeerLost",
    "ReduceResult",
    "check_headroom",
    "make_collective",
    "transport_names",
]

# Each module defines `async def connect(**kw) -> Collective`; imported only when picked,
# so torch (gloo) and the browser bridge (webrtc) load only where they are used.
_TRANSPORTS = {
    "loopback": "pynode.comm.loopback",
    "gloo": "pynode.comm.gloo",
    "webrtc": "pynode.comm.webrtc",
}


def transport_names() -> tuple[str, ...]:
    return tuple(sorted(_TRANSPORTS))


async def make_collective(name: str, **kw: Any) -> Collective:
    """Connect the transport called `name`; `kw` are that module's `connect` arguments."""
    if name not in _TRANSPORTS:
        raise CollectiveUsageError(
            f"unknown transport {name!r}; known: {', '.join(transport_names())}"
        )
    module = importlib.import_module(_TRANSPORTS[name])
    return await module.connect(**kw)
