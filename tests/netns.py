"""Two private "hosts" for network tests: network namespaces joined by a veth pair.

    with private_network() as net:            # skips where namespaces are not permitted
        proc = net.popen("a", [sys.executable, "server.py"])   # inside host a, 10.77.0.1
        net.run("b", ["ping", "-c1", net.address["a"]])          # inside host b, 10.77.0.2

Each use creates fresh namespaces with unique names (tests run in parallel on one
machine), so the fixed 10.77.0.0/24 addresses never meet anything outside them.
Processes started through the pair are killed and the namespaces deleted on exit,
also when the test fails. Needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN) and iproute2;
CI runs as root, so under CI=true a missing capability fails instead of skipping.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

SUBNET = "10.77.0"
SIDES = ("a", "b")


class NetnsUnavailable(RuntimeError):
    """This machine or user cannot build private network namespaces."""


class NetnsPair:
    """Namespaces `a` and `b`, addresses 10.77.0.1/24 and 10.77.0.2/24 on a veth pair."""

    def __init__(self) -> None:
        token = secrets.token_hex(3)
        self.name = {side: f"dc-{token}-{side}" for side in SIDES}  # namespace names
        self.ifname = {side: f"dcv{token}{side}" for side in SIDES}  # at most 15 chars
        self.address = {side: f"{SUBNET}.{i}" for i, side in enumerate(SIDES, start=1)}
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []

    def __enter__(self) -> NetnsPair:
        if not sys.platform.startswith("linux"):
            raise NetnsUnavailable("network namespaces are Linux-only")
        if shutil.which("ip") is None:
            raise NetnsUnavailable("`ip` (iproute2) is not installed")
        try:
            self._build()
        except NetnsUnavailable:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _build(self) -> None:
        for side in SIDES:
            _ip("netns", "add", self.name[side])
            self._made.append(self.name[side])
        a, b = self.ifname["a"], self.ifname["b"]
        _ip("link", "add", a, "type", "veth", "peer", "name", b)
        for side in SIDES:
            ns, dev = self.name[side], self.ifname[side]
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{self.address[side]}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def command(self, side: str, argv: Sequence[str]) -> list[str]:
        """`argv` wrapped to run inside namespace `side`."""
        return ["ip", "netns", "exec", self.name[side], *argv]

    def popen(self, side: str, argv: Sequence[str], **kw: Any) -> subprocess.Popen:
        proc = subprocess.Popen(self.command(side, argv), **kw)
        self._procs.append(proc)
        return proc

    def run(self, side: str, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess:
        kw.setdefault("timeout", 60)
        return subprocess.run(self.command(side, argv), **kw)

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._procs.clear()
        # Deleting a namespace deletes the veth end inside it; the root-namespace
        # delete only matters if building stopped before the ends were moved.
        subprocess.run(["ip", "link", "del", self.ifname["a"]], capture_output=True)
        for name in self._made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._made.clear()

    def exists(self) -> bool:
        """Whether any namespace of this pair is still present (for cleanup checks)."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return any(name in listed.split() for name in self.name.values())


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


@contextmanager
def private_network() -> Iterator[NetnsPair]:
    """A NetnsPair for a pytest test; skips if unavailable, fails instead under CI=true."""
    import pytest

    pair = NetnsPair()
    try:
        pair.__enter__()
    except NetnsUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs as root and must build network namespaces: {exc}")
        pytest.skip(f"network namespaces unavailable here: {exc}")
    try:
        yield pair
    finally:
        pair.close()
