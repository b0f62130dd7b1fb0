"""ICE servers for approved peers: STUN/TURN URLs plus short-lived TURN credentials.

TURN credentials follow coturn's shared-secret REST scheme (``use-auth-secret`` with
``static-auth-secret``): username ``"<expiry unix time>:<peer id>"``, credential
``base64(HMAC-SHA1(secret, username))``. coturn checks them with the same secret and refuses
them once the expiry has passed, so nothing is stored and a leaked credential dies on its own.
The rooms hand these out only to approved peers (docs/NETWORKS.md); they are never logged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any

ICE_SCHEMES = ("stun:", "stuns:", "turn:", "turns:")
TURN_SCHEMES = ("turn:", "turns:")


def turn_credential(secret: str, username: str) -> str:
    """coturn's REST-API password of ``username``: base64(HMAC-SHA1(secret, username))."""
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


class IceIssuer:
    """The ``rtcConfig`` of one approved peer: ``{iceServers, iceTransportPolicy}``, the
    fields of the browser's RTCConfiguration (and aiortc's), so clients pass it on as is."""

    def __init__(self, urls: tuple[str, ...], turn_secret: str | None, ttl_s: int,
                 relay_only: bool = False, clock: Callable[[], float] = time.time) -> None:
        self.stun = [u for u in urls if not u.startswith(TURN_SCHEMES)]
        self.turn = [u for u in urls if u.startswith(TURN_SCHEMES)]
        self._secret, self._ttl_s, self._clock = turn_secret, ttl_s, clock
        self.relay_only = relay_only

    @property
    def configured(self) -> bool:
        return bool(self.stun or self.turn or self.relay_only)

    def rtc_config(self, peer_id: str) -> dict[str, Any]:
        servers: list[dict[str, Any]] = []
        if self.stun:
            servers.append({"urls": list(self.stun)})
        if self.turn and self._secret is not None:
            username = f"{int(self._clock()) + self._ttl_s}:{peer_id}"
            servers.append({"urls": list(self.turn), "username": username,
                            "credential": turn_credential(self._secret, username)})
        return {"iceServers": servers,
                "iceTransportPolicy": "relay" if self.relay_only else "all"}
