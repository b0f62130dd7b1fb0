"""The native mesh follows the approved roster: a peer the host removes loses its links,
except while rosters refill just after (re)joining signaling (a server restart)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from comm_helpers import REPO
from node_check import node_check

pytest.importorskip("aiortc")
from pynode.comm import native_mesh  # noqa: E402
from pynode.comm.native_mesh import NativeMesh  # noqa: E402


class FakeSignaling:
    def __init__(self) -> None:
        self.peer_id = "a"
        self.approved = self.connected = True
        self.roster: list[dict[str, Any]] = []
        self.removed: set[str] = set()
        self.listeners: dict[str, list[Any]] = {}

    def on(self, kind: str, listener: Any) -> None:
        self.listeners.setdefault(kind, []).append(listener)

    def fire(self, kind: str, frame: dict[str, Any]) -> None:
        if kind == "roster":
            self.roster = frame["peers"]
            self.removed.update(frame.get("removed", []))
        for listener in self.listeners.get(kind, []):
            listener(frame)


class InlineNet:  # the mesh's network loop is the test's loop
    def call(self, fn: Any, *args: Any) -> None:
        fn(*args)


class FakeLink:
    def __init__(self, mesh: NativeMesh, peer: str) -> None:
        self.mesh, self.peer, self.closed = mesh, peer, False

    def close(self) -> None:
        self.closed = True
        self.mesh.links.pop(self.peer, None)


def roster(*approved: str, pending: tuple[str, ...] = ()) -> dict[str, Any]:
    peers = [{"id": p, "state": "approved"} for p in approved]
    peers += [{"id": p, "state": "pending"} for p in pending]
    return {"type": "roster", "peers": peers}


def test_links_to_peers_off_the_approved_roster_are_closed_after_the_grace(monkeypatch, caplog):
    monkeypatch.setattr(native_mesh, "ROSTER_GRACE_S", 0.3)
    caplog.set_level("INFO", logger=native_mesh.log.name)

    async def body() -> None:
        sig = FakeSignaling()
        mesh = NativeMesh(sig, InlineNet())  # joined already: the grace starts now
        links = {p: FakeLink(mesh, p) for p in ("0", "1", "2")}  # ids below "a": they offer
        mesh.links.update(links)
        sig.fire("roster", roster("a", "0", "1", "2"))
        sig.fire("roster", roster("a", "0", pending=("1",)))  # a restart: 2 not back yet
        assert not any(link.closed for link in links.values())
        await asyncio.sleep(0.5)  # the grace is over: the roster rules
        assert [p for p, link in links.items() if link.closed] == ["1", "2"]
        # why, in words a host reads (a killed peer was "not on the approved roster")
        assert "peer 1: no longer approved by the host; link closed" in caplog.text
        assert "peer 2: left the room; link closed" in caplog.text
        sig.fire("roster", {**roster("a"), "removed": ["0"]})  # the host removed 0: at once
        assert links["0"].closed and not mesh.links
        assert "peer 0: removed by the host; link closed" in caplog.text
        sig.fire("joined", {"type": "joined"})  # signaling came back: a new grace
        mesh.links["3"] = third = FakeLink(mesh, "3")
        sig.fire("roster", roster("a"))
        assert not third.closed

    asyncio.run(body())


NODE_CHECK = """
const { Mesh } = await import(process.argv[1]);
const mesh = new Mesh(new EventTarget(), "a");
const closed = [];
const fake = (peer) => ({ peer, close() { closed.push(peer); mesh.links.delete(peer); } });
const said = [];
mesh.addEventListener("error", (e) => said.push(`${e.detail.peer}: ${e.detail.text}`));
for (const p of ["0", "1", "2"]) mesh.links.set(p, fake(p));
mesh.connect(["a", "0"], ["a", "0", "1"]);  // just joined: the roster may still be refilling
const inGrace = [...closed];
clearTimeout(mesh.pruneTimer); mesh.pruneTimer = null;
mesh.joinedAt -= 31000;  // the grace is over
mesh.connect(["a", "0"], ["a", "0", "1"]);  // 1 is there unapproved, 2 is gone
const afterGrace = [...closed];
mesh.connect(["a"], ["a"], ["0"]);  // the host removed 0
const left = [...mesh.links.keys()];
console.log(JSON.stringify({ inGrace, afterGrace, last: [...closed], left, said }));
"""


def test_the_pages_mesh_follows_the_approved_roster_the_same_way():
    module = (REPO / "server" / "pyodide_app" / "mesh.js").as_uri()
    got = json.loads(node_check(NODE_CHECK, module))
    assert got == {"inGrace": [], "afterGrace": ["1", "2"], "last": ["1", "2", "0"],
                   "left": [], "said": ["1: no longer approved by the host; link closed",
                                        "2: left the room; link closed",
                                        "0: removed by the host; link closed"]}


ICE_CHECK = """
const { Mesh } = await import(process.argv[1]);
const { Signaling } = await import(process.argv[2]);
const frames = JSON.parse(process.argv[3]);
const made = [];
globalThis.RTCPeerConnection = class {
  constructor(config) { made.push(config); }
  createDataChannel() { return {}; }
  createOffer() { return new Promise(() => {}); }  // the offer never matters here
};
const signaling = new Signaling({ room: "r" });
signaling.send = () => true;
const mesh = new Mesh(signaling, "a");
for (const frame of frames) {
  signaling.onFrame(JSON.stringify(frame));
  mesh.connect(["a", "b" + made.length]);  // a new link per frame: a < b offers
}
console.log(JSON.stringify(made));
clearTimeout(mesh.pruneTimer);
"""


def test_the_pages_mesh_uses_the_servers_ice_servers_once_approved():
    turn = {"urls": ["turn:t.example.net:3478"], "username": "1700000000:a",
            "credential": "c2VjcmV0"}
    given = {"iceServers": [{"urls": ["stun:s.example.net"]}, turn],
             "iceTransportPolicy": "relay"}
    frames = [
        {"v": 1, "type": "joined", "peer": "a", "state": "pending", "token": "t"},
        {"v": 1, "type": "approved", "peer": "a", "rtcConfig": given},
        {"v": 1, "type": "joined", "peer": "a", "state": "approved", "token": "t",
         "rtcConfig": {**given, "iceTransportPolicy": "all"}},
    ]
    app = REPO / "server" / "pyodide_app"
    made = node_check(ICE_CHECK, (app / "mesh.js").as_uri(), (app / "signaling.js").as_uri(),
                      json.dumps(frames))
    assert json.loads(made) == [
        {"iceServers": []},  # pending: host candidates only
        given,  # approved: the server's servers and its relay-only switch
        {"iceServers": given["iceServers"]},  # a token resume: a fresh config
    ]


def test_a_peers_bye_on_its_ui_channel_reads_as_its_goodbye():
    """A closing tab says `bye` on each link's ui channel, ahead of a large message still
    queued on its data channel; the mesh hands the room protocol's goodbye on as that
    peer's message (so the others say it left, not that they lost it)."""
    from pynode.comm.rtclink import Link
    from pynode.run.protocol import goodbye

    async def body(farewell: bytes) -> list[tuple[str, bytes | None]]:
        mesh = NativeMesh(FakeSignaling(), InlineNet(), goodbye=farewell)
        link = Link(mesh, "tab")
        link.receive_ui('{"state": "training"}')
        link.receive_ui("bye")
        link.receive_ui("scanned 100")  # no scan of this side's under way: nothing
        await asyncio.sleep(0.05)
        assert mesh.ui["tab"] == {"state": "training"}  # ui rows are shown, not delivered
        link.close()
        got = []
        while not mesh._events.empty():
            got.append(mesh._events.get_nowait())
        return [event for event in got if event[1] is not None]  # None: the link's end

    assert asyncio.run(body(goodbye())) == [("tab", goodbye())]
    assert asyncio.run(body(b"")) == []  # a mesh without a protocol's goodbye: nothing
