"""A private network namespace for browser tests: WebRTC between tabs with no traffic outside.

Chromium gathers no ICE candidates on loopback, so tabs on one machine only connect over a
real interface. `PrivateNet` makes a namespace with loopback up, a veth pair, 10.77.0.1/24
on one end and a default route through it (Chromium picks its candidate address by
routing towards a public address). The server and the browser run inside it; this test
process stays outside and talks to the browser over Playwright's pipe.

Multicast works as on a LAN: the default route takes mDNS (224.0.0.251) out of the veth and
the kernel loops a copy back to every socket in the namespace that joined the group, so the
`NAME.local` host candidates of a default Chromium resolve, for tabs and native peers alike.

    with PrivateNet() as net:
        net.popen([sys.executable, "-m", "server", "--host", net.address])
        chromium = net.wrapper(tmp_path / "chromium", shutil.which("chromium"))

`SeparateNets` puts peers on networks that reach only a hub (the server, a TURN server).

Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2; `NetnsUnavailable` says why not.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ADDRESS = "10.77.0.1"


class NetnsUnavailable(RuntimeError):
    """This machine or user cannot build a private network namespace."""


class PrivateNet:
    def __init__(self) -> None:
        token = secrets.token_hex(3)
        self.name = f"dc-e2e-{token}"
        self.address = ADDRESS
        self._procs: list[subprocess.Popen] = []
        self._made = False

    def __enter__(self) -> PrivateNet:
        if not sys.platform.startswith("linux"):
            raise NetnsUnavailable("network namespaces are Linux-only")
        if shutil.which("ip") is None:
            raise NetnsUnavailable("`ip` (iproute2) is not installed")
        if os.geteuid() != 0:
            raise NetnsUnavailable("building a network namespace needs root")
        try:
            _ip("netns", "add", self.name)
            self._made = True
            ns = ("-n", self.name)
            _ip(*ns, "link", "set", "lo", "up")
            _ip(*ns, "link", "add", "dce0", "type", "veth", "peer", "name", "dce1")
            _ip(*ns, "addr", "add", f"{ADDRESS}/24", "dev", "dce0")
            _ip(*ns, "link", "set", "dce0", "up")
            _ip(*ns, "link", "set", "dce1", "up")
            _ip(*ns, "route", "add", "default", "dev", "dce0")
        except NetnsUnavailable:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` wrapped to run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def popen(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen:
        proc = subprocess.Popen(self.command(argv), **kw)
        self._procs.append(proc)
        return proc

    def wrapper(self, path: Path, program: str) -> Path:
        """An executable at `path` that runs `program` with its arguments inside the namespace
        (what Playwright launches as the browser; the pipes it talks over are inherited)."""
        return _wrapper(path, self.name, program)

    def close(self) -> None:
        _kill(self._procs)
        if self._made:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
            self._made = False

    def exists(self) -> bool:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        return any(line.split()[0] == self.name for line in listed.splitlines() if line.strip())


def _wrapper(path: Path, namespace: str, program: str) -> Path:
    """An executable at `path` that runs `program` with its arguments in `namespace`."""
    path.write_text(f"#!/bin/sh\nexec ip netns exec {shlex.quote(namespace)} "
                    f"{shlex.quote(program)} \"$@\"\n")
    path.chmod(0o755)
    return path


def _kill(procs: list[subprocess.Popen]) -> None:
    """Kill and reap every process of `procs` still running; empty it."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    procs.clear()


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


HUB = "10.78.0.1"  # the server's and the TURN server's address, reached from every spoke


class SeparateNets:
    """Peers on networks that cannot reach each other, only a hub (the server and TURN).

    A hub namespace holds HUB on its loopback and one veth per spoke namespace: spoke i is
    10.78.i.2/24 with its default route through the hub's 10.78.i.1. The hub never forwards
    (`net.ipv4.ip_forward=0`), so a packet from one spoke to another is dropped there, and
    no multicast crosses it: WebRTC between spokes works only through a relay on the hub,
    as between two homes behind NATs that let nothing in.

        with SeparateNets(3) as nets:
            nets.popen(None, ["turnserver", ...])          # None: in the hub
            chromium = nets.wrapper(0, tmp_path / "chromium0", shutil.which("chromium"))
    """

    def __init__(self, spokes: int) -> None:
        token = secrets.token_hex(3)
        self.hub = f"dc-hub-{token}"
        self.spokes = [f"dc-{token}-{i}" for i in range(spokes)]
        self.address = [f"10.78.{i + 1}.2" for i in range(spokes)]
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []

    def __enter__(self) -> SeparateNets:
        if not sys.platform.startswith("linux"):
            raise NetnsUnavailable("network namespaces are Linux-only")
        if shutil.which("ip") is None:
            raise NetnsUnavailable("`ip` (iproute2) is not installed")
        if os.geteuid() != 0:
            raise NetnsUnavailable("building a network namespace needs root")
        try:
            self._build()
        except NetnsUnavailable:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _build(self) -> None:
        for name in (self.hub, *self.spokes):
            _ip("netns", "add", name)
            self._made.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", self.hub, "addr", "add", f"{HUB}/32", "dev", "lo")
        for i, spoke in enumerate(self.spokes):
            gateway = f"10.78.{i + 1}.1"
            _ip("-n", self.hub, "link", "add", f"spoke{i}", "type", "veth", "peer", "name",
                "eth0", "netns", spoke)
            _ip("-n", self.hub, "addr", "add", f"{gateway}/24", "dev", f"spoke{i}")
            _ip("-n", self.hub, "link", "set", f"spoke{i}", "up")
            _ip("-n", spoke, "addr", "add", f"{self.address[i]}/24", "dev", "eth0")
            _ip("-n", spoke, "link", "set", "eth0", "up")
            _ip("-n", spoke, "route", "add", "default", "via", gateway)
        done = subprocess.run(self.command(None, ["sysctl", "-qw", "net.ipv4.ip_forward=0"]),
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise NetnsUnavailable(f"the hub would forward between spokes: {done.stderr}")

    def command(self, spoke: int | None, argv: Sequence[str]) -> list[str]:
        """`argv` wrapped to run in spoke `spoke` (None: the hub)."""
        name = self.hub if spoke is None else self.spokes[spoke]
        return ["ip", "netns", "exec", name, *argv]

    def popen(self, spoke: int | None, argv: Sequence[str], **kw: Any) -> subprocess.Popen:
        proc = subprocess.Popen(self.command(spoke, argv), **kw)
        self._procs.append(proc)
        return proc

    def wrapper(self, spoke: int, path: Path, program: str) -> Path:
        """An executable at `path` that runs `program` in spoke `spoke` (see PrivateNet)."""
        return _wrapper(path, self.spokes[spoke], program)

    def close(self) -> None:
        _kill(self._procs)
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._made.clear()
