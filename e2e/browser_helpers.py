"""What the browser tests share: tabs in their own contexts, waiting on `daisychain.status()`."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from pynode.bench.browser import CHROMIUM_FLAGS as BENCH_FLAGS

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "artifacts" / "e2e"
CHROMIUM_FLAGS = [
    *BENCH_FLAGS,
]  # WebRTC privacy as users have it: host candidates hidden behind mDNS names (NAME.local)
BOOT_TIMEOUT_MS = 180_000  # Pyodide + numpy + checks per tab, several tabs on 2 shared cores


def missing_browser_parts() -> str | None:
    """Why the browser tests cannot run here (playwright, chromium, the runtime), or None."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed"
    if shutil.which("chromium") is None:
        return "Debian's chromium is not installed (apt-get install chromium)"
    from server.runtime import RuntimeMissingError, runtime_dir

    try:
        runtime_dir()
    except RuntimeMissingError as exc:
        return str(exc)
    return None


class Tabs:
    """Opens pages, each in a fresh context, and keeps their console for failure reports."""

    def __init__(self, browser: Any, base: str, name: str) -> None:
        self.browser, self.base, self.name = browser, base, name
        self.contexts: list[Any] = []
        self.console: list[str] = []

    def open(self, query: str) -> Any:
        context = self.browser.new_context(viewport={"width": 1280, "height": 1100})
        self.contexts.append(context)
        page = context.new_page()
        n = len(self.contexts)
        page.on("console", lambda m: self.console.append(f"[tab {n}] {m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.console.append(f"[tab {n}] page error: {e}"))
        page.goto(f"{self.base}/{query}")
        page.wait_for_function("() => window.daisychain && daisychain.status().peerId",
                               timeout=30_000)
        return page

    def shot(self, page: Any, label: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{self.name}-{label}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        for context in self.contexts:
            context.close()


def status(page: Any) -> dict:
    return page.evaluate("() => daisychain.status()")


def wait(page: Any, predicate: str, timeout_ms: int = 60_000, arg: Any = None) -> None:
    """Wait until `predicate` (a JS function of (status, arg)) is true on `page`."""
    page.wait_for_function(f"(arg) => ({predicate})(daisychain.status(), arg)", arg=arg,
                           timeout=timeout_ms)


def wait_booted(*pages: Any) -> None:
    for page in pages:
        wait(page, "s => ['ready', 'failed'].includes(s.state)", BOOT_TIMEOUT_MS)


def wait_trainable(host: Any, peer_ids: list[str]) -> None:
    """Until the host's Python greeted every peer in `peer_ids` (a run can include them)."""
    wait(host, "(s, ids) => ids.every(id => s.peers.some(p => p.id === id && p.trainable))",
         60_000, peer_ids)


def open_room(tabs: Tabs, *queries: str) -> tuple:
    """The host's tab plus one tab per query (appended to ?room=CODE), each joined."""
    host = tabs.open("?create=1")
    room = status(host)["room"]
    others = [tabs.open(f"?room={room}{q}") for q in queries]
    return host, others


def approve(host: Any, *pages: Any) -> None:
    """The host approves each tab once its roster lists it (the join reaches the host's
    tab through the server, after the joiner already knows its own id)."""
    for page in pages:
        approve_ids(host, status(page)["peerId"])
        wait(page, "s => s.approved", 30_000)


def approve_ids(host: Any, *peer_ids: str) -> None:
    """The host approves peers by id once it sees them (native peers have no page)."""
    for peer_id in peer_ids:
        wait(host, "(s, id) => s.peers.some(p => p.id === id)", 30_000, peer_id)
        host.evaluate("(id) => daisychain.approve(id)", peer_id)


def history_hashes(page: Any) -> dict[int, str]:
    """step -> state hash, from the page's history (the steps it computed or checked: a
    page synced into a run under way also shows the run's earlier losses, without hashes)."""
    return {h["step"]: h["hash"] for h in status(page)["history"] if h["hash"] is not None}


def host_candidates(page: Any) -> list[str]:
    """The addresses of the host ICE candidates a tab gathers (a throwaway connection's):
    `NAME.local` names where Chromium hides them, as it does by default."""
    return page.evaluate("""async () => {
        const pc = new RTCPeerConnection();
        pc.createDataChannel("probe");
        const found = [];
        const gathered = new Promise(done => {
            pc.onicecandidate = e => e.candidate ? found.push(e.candidate.address) : done();
        });
        await pc.setLocalDescription(await pc.createOffer());
        await gathered;
        pc.close();
        return found;
    }""")


def unavailable(reason: str) -> None:
    """Skip for a missing browser part, or fail under CI=true, where the tier must run."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the browser tests must run)")
    pytest.skip(reason)


def param_count(cfg: Any) -> int:
    """Parameters of the gpt model a RunConfig builds (what the page's estimate counts)."""
    from pynode.core.gpt import gpt_param_shapes
    from pynode.tasks.gpt import gpt_config

    return sum(math.prod(s) for s in gpt_param_shapes(gpt_config(cfg)).values())
