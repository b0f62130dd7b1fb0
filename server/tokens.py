"""Resume tokens: HMAC-signed claims that let a peer reclaim its id (and a host its room).

A token is ``v1.<payload>.<mac>``, both parts base64url; the payload is JSON
``{"r": room key, "p": peer id, "h": host?, "t": issued at}``. The key lives in the server's
data folder (or the config), so tokens survive a restart of the server process: that is
what lets an ongoing mesh re-attach to signaling after a restart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pynode.core.errors import DaisyError

SECRET_FILE = "signaling.key"
MIN_KEY_BYTES = 16  # as the configured secret's 16 characters


class SecretError(DaisyError):
    """The signaling secret cannot be read or created."""


@dataclass(frozen=True)
class ResumeClaim:
    room: str  # room key: a private room's code, or "auto:<digest>"
    peer: str  # the peer id to reclaim
    host: bool  # True if the peer was the room's host


def load_secret(secret: str | None, data_dir: Path) -> bytes:
    """The configured secret, else the one persisted in ``data_dir`` (created on first use).
    SecretError, saying what to do, for a key file that is not a key: one cut short or empty
    (a crash between creating and writing it) would sign tokens anyone can forge."""
    if secret is not None:
        if len(secret) < MIN_KEY_BYTES:
            raise SecretError(f"the signaling secret must be at least {MIN_KEY_BYTES} characters")
        return secret.encode("utf-8")
    if data_dir.exists() and not data_dir.is_dir():
        raise SecretError(f"the server's data folder {data_dir} is a file: give a folder "
                          "(--data-dir; it holds the signaling key, revocations and uploads)")
    path = data_dir / SECRET_FILE
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        fresh = secrets.token_bytes(32)
        # written whole to a file of its own, then linked in place: a second server
        # starting at once reads the first one's key, never a file not yet written
        spare = path.with_name(f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(fresh.hex() + "\n")
            os.link(spare, path)
        finally:
            spare.unlink(missing_ok=True)
        return fresh
    except FileExistsError:
        return _read_key(path)
    except OSError as exc:
        raise SecretError(f"cannot create signaling secret {path}: {exc}") from exc


def _read_key(path: Path) -> bytes:
    """The key in `path` (hex); FileNotFoundError if there is none; SecretError for a file
    that holds no key of at least MIN_KEY_BYTES."""
    fix = ("remove it and start the server again to make a new one (tokens it signed, a "
           "room's resume and a dashboard run's, stop working), or set `secret` in --config")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise  # the caller makes one
    except OSError as exc:
        raise SecretError(f"unreadable signaling secret {path} ({exc.strerror or exc}): "
                          f"{fix}") from exc
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise SecretError(f"signaling secret {path} is no key (not hexadecimal): {fix}") \
            from None
    if len(key) < MIN_KEY_BYTES:
        raise SecretError(f"signaling secret {path} holds {len(key)} bytes, fewer than "
                          f"{MIN_KEY_BYTES} (cut short?): {fix}")
    return key


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    def __init__(
        self, key: bytes, ttl_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._key = key
        self._ttl_s = ttl_s
        self._clock = clock

    def issue(self, room: str, peer: str, host: bool) -> str:
        payload = json.dumps(
            {"r": room, "p": peer, "h": host, "t": int(self._clock())}, separators=(",", ":")
        ).encode("utf-8")
        return f"v1.{_b64(payload)}.{_b64(self._mac(payload))}"

    def verify(self, token: str) -> ResumeClaim | None:
        """The claim of a genuine, unexpired token; None for anything else."""
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != "v1":
            return None
        try:
            payload, mac = _unb64(parts[1]), _unb64(parts[2])
        except ValueError:
            return None
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None
        data = json.loads(payload)
        if not 0 <= self._clock() - data["t"] <= self._ttl_s:
            return None
        return ResumeClaim(room=data["r"], peer=data["p"], host=bool(data["h"]))

    def room_key_for_address(self, address_group: str) -> str:
        """Auto-room key of a public address: stable across restarts, not the address itself."""
        digest = hmac.new(self._key, b"auto-room:" + address_group.encode(), hashlib.sha256)
        return "auto:" + digest.hexdigest()[:24]

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, b"resume:" + payload, hashlib.sha256).digest()
