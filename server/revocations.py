"""Revoked peer ids, kept on disk so that a restart does not forgive them.

A host that removes or denies a peer revokes that peer's id in its room: its resume
token (which names the id) is refused from then on, by this process and by the next one.
Entries are lines ``<unix time> <room key> <peer id>`` appended to
``data_dir/revoked.txt``; they are forgotten once every token issued before them has
expired (``token_ttl_s``), and the file is rewritten without them at start.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
REVOKED_FILE = "revoked.txt"
MAX_ENTRIES = 1_000_000  # ~100 MB at most; older entries go first


class Revocations:
    """(room key, peer id) pairs that may not come back; ``path`` None keeps them in memory."""

    def __init__(self, path: Path | None, ttl_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[tuple[str, str], float] = {}
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OSError(f"cannot create the state folder {path.parent}: {exc}") from exc
            self._load(path)

    def revoke(self, room: str, peer: str) -> None:
        now = self._clock()
        self._entries.pop((room, peer), None)
        self._entries[(room, peer)] = now
        while len(self._entries) > MAX_ENTRIES:
            self._entries.pop(next(iter(self._entries)))
        if self._path is None:
            return
        try:
            with open(self._path, "a", encoding="ascii") as f:
                f.write(f"{int(now)} {room} {peer}\n")
        except OSError as exc:  # still revoked in this process; say why it may not persist
            log.error("cannot record a revocation in %s: %s", self._path, exc)

    def is_revoked(self, room: str, peer: str) -> bool:
        stamp = self._entries.get((room, peer))
        return stamp is not None and self._clock() - stamp <= self._ttl_s

    def __len__(self) -> int:
        return len(self._entries)

    def _load(self, path: Path) -> None:
        try:
            lines = path.read_text(encoding="ascii", errors="replace").splitlines()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise OSError(f"cannot read revocations {path}: {exc}") from exc
        oldest = self._clock() - self._ttl_s
        for line in lines:
            parts = line.split()
            if len(parts) != 3 or not parts[0].isdigit():
                continue  # a torn last line after a crash
            stamp = float(parts[0])
            if stamp >= oldest:
                self._entries[(parts[1], parts[2])] = stamp
        kept = "".join(f"{int(t)} {r} {p}\n" for (r, p), t in self._entries.items())
        tmp = path.with_suffix(".tmp")
        tmp.write_text(kept, encoding="ascii")
        os.replace(tmp, path)
