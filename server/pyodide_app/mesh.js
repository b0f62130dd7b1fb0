// The WebRTC mesh between approved peers of a room (main thread).
//
// One RTCPeerConnection per pair, offered by the peer with the smaller id, with two
// pre-negotiated ordered, reliable data channels: "data" carries the Python peers' messages
// (fragmented, see fragments.js) and "ui" small JSON the pages show (state, step, hashes).
// Sends are queued per link and fed to the channel while its bufferedAmount stays below
// HIGH_WATER, resuming on `bufferedamountlow`, so a large gradient never floods memory.
//
// Events: open {peer}, gone {peer}, message {peer, data: ArrayBuffer}, ui {peer, msg},
// bye {peer} (it closes on purpose: sayBye),
// error {peer, text}, unreachable {peer} (ICE found no working candidate pair),
// routes {rows} (this page's links, every SHARE_EVERY heartbeats).

import { FragmentError, Reassembler, fragment, fragmentCount } from "./fragments.js";

// Without a server's ICE servers, host candidates only: peers on one network reach each
// other without any third party. Across NATs the server hands approved peers its STUN/TURN
// servers (`python -m server --ice-server`, docs/NETWORKS.md) as signaling.rtcConfig.
export function rtcConfiguration(signaling) {
  const given = (signaling && signaling.rtcConfig) || {};
  const config = { iceServers: Array.isArray(given.iceServers) ? given.iceServers : [] };
  if (given.iceTransportPolicy === "relay") config.iceTransportPolicy = "relay";
  return config;
}
const HIGH_WATER = 4 << 20;
const LOW_WATER = 1 << 20;
// Heartbeats, as pynode/comm/native_mesh.py: every open link sends "beat T" on its "ui"
// channel each BEAT_MS, answered "echo T" (the link's RTT); a link that brought nothing for
// SILENT_MS is closed, so a dead, frozen or cut-off peer is left out within seconds. This
// main thread beats while the worker computes. Every SHARE_EVERY beats each peer sends its
// links ({"links": [route...]}) to all: the connectivity matrix. The scan: when a link
// opens, SCAN_PIECES strings "scan K N ..." of SCAN_BYTES, the last answered "scanned B";
// B bytes over the time to the answer is the link's MB/s (one RTT included).
const BEAT_MS = 500;
const SILENT_MS = 3000;
const LATE_MS = 500; // a beat this much later than BEAT_MS: this page stalled, not the others
const SHARE_EVERY = 4;
const SCAN_PIECES = 8;
const SCAN_BYTES = 16 * 1024;

class Link {
  constructor(mesh, peer) {
    this.mesh = mesh;
    this.peer = peer;
    this.pc = new RTCPeerConnection(rtcConfiguration(mesh.signaling));
    this.data = this.pc.createDataChannel("data", { negotiated: true, id: 0, ordered: true });
    this.ui = this.pc.createDataChannel("ui", { negotiated: true, id: 1, ordered: true });
    this.data.binaryType = "arraybuffer";
    this.data.bufferedAmountLowThreshold = LOW_WATER;
    this.queue = []; // {bytes: Uint8Array, id, next}
    this.nextId = 1;
    this.reassembler = new Reassembler();
    this.pendingIce = [];
    this.isOpen = false;
    this.isGone = false;
    this.heard = 0; // performance.now() of the last message on either channel
    this.rttMs = null; // the last heartbeat's round trip
    this.mbps = null; // the scan's MB/s
    this.scanStarted = null;
    this.scanReceived = 0;
    this.wire();
  }

  wire() {
    const { pc, data, ui, mesh, peer } = this;
    pc.onicecandidate = (e) => {
      const c = e.candidate;
      mesh.signaling.send("ice", c ? {
        to: peer, candidate: c.candidate, sdpMid: c.sdpMid, sdpMLineIndex: c.sdpMLineIndex,
        usernameFragment: c.usernameFragment,
      } : { to: peer, candidate: "" });
    };
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === "failed" && !this.isOpen) mesh.emit("unreachable", { peer });
      if (pc.connectionState === "failed" || pc.connectionState === "closed") this.close();
    };
    const maybeOpen = () => {
      if (!this.isOpen && data.readyState === "open" && ui.readyState === "open") {
        this.isOpen = true;
        this.heard = performance.now();
        if (mesh.beating === null) mesh.beating = setInterval(() => mesh.beat(), BEAT_MS);
        this.scan();
        mesh.emit("open", { peer });
      }
    };
    data.onopen = maybeOpen;
    ui.onopen = maybeOpen;
    data.onclose = () => this.close();
    ui.onclose = () => this.close();
    data.onbufferedamountlow = () => this.pump();
    data.onmessage = (e) => {
      this.heard = performance.now();
      this.receive(e.data);
    };
    ui.onmessage = (e) => {
      const now = this.heard = performance.now();
      const text = String(e.data);
      const space = text.indexOf(" ");
      const kind = space < 0 ? text : text.slice(0, space);
      const rest = text.slice(space + 1);
      if (kind === "beat") return this.sendUiText(`echo ${rest}`);
      if (kind === "echo") {
        this.rttMs = Math.round((now - Number(rest)) * 100) / 100;
        return;
      }
      if (kind === "scan") {
        this.scanReceived += text.length;
        const [index, count] = rest.split(" ", 2);
        if (index === count) {
          this.sendUiText(`scanned ${this.scanReceived}`);
          this.scanReceived = 0;
        }
        return;
      }
      if (kind === "bye") return mesh.emit("bye", { peer }); // a closing page's goodbye
      if (kind === "scanned") {
        if (this.scanStarted !== null) {
          this.mbps = Math.round(Number(rest) / 1e3 / Math.max(now - this.scanStarted, 1e-3) * 100) / 100;
          this.scanStarted = null;
        }
        return;
      }
      try {
        mesh.emit("ui", { peer, msg: JSON.parse(e.data) });
      } catch {
        /* a page that sends junk on the ui channel only loses its own row */
      }
    };
  }

  async offer() {
    await this.pc.setLocalDescription(await this.pc.createOffer());
    this.mesh.signaling.send("offer", { to: this.peer, sdp: this.pc.localDescription.sdp });
  }

  async onOffer(sdp) {
    await this.pc.setRemoteDescription({ type: "offer", sdp });
    await this.flushIce();
    await this.pc.setLocalDescription(await this.pc.createAnswer());
    this.mesh.signaling.send("answer", { to: this.peer, sdp: this.pc.localDescription.sdp });
  }

  async onAnswer(sdp) {
    await this.pc.setRemoteDescription({ type: "answer", sdp });
    await this.flushIce();
  }

  async onIce(msg) {
    if (!msg.candidate) return; // end of candidates
    const init = { candidate: msg.candidate, sdpMid: msg.sdpMid,
      sdpMLineIndex: msg.sdpMLineIndex, usernameFragment: msg.usernameFragment };
    if (!this.pc.remoteDescription) this.pendingIce.push(init);
    else await this.pc.addIceCandidate(init);
  }

  async flushIce() {
    for (const init of this.pendingIce.splice(0)) await this.pc.addIceCandidate(init);
  }

  send(buffer) {
    this.queue.push({ bytes: new Uint8Array(buffer), id: this.nextId++, next: 0 });
    this.pump();
  }

  pump() {
    const dc = this.data;
    while (this.queue.length && dc.readyState === "open" && dc.bufferedAmount < HIGH_WATER) {
      const msg = this.queue[0];
      dc.send(fragment(msg.bytes, msg.id, msg.next));
      msg.next += 1;
      if (msg.next >= fragmentCount(msg.bytes.byteLength)) this.queue.shift();
    }
  }

  receive(buffer) {
    let whole;
    try {
      whole = this.reassembler.push(buffer);
    } catch (err) {
      if (!(err instanceof FragmentError)) throw err;
      this.mesh.emit("error", { peer: this.peer, text: `broken data channel: ${err.message}` });
      this.close();
      return;
    }
    if (whole) this.mesh.emit("message", { peer: this.peer, data: whole });
  }

  sendUi(obj) {
    this.sendUiText(JSON.stringify(obj));
  }

  sendUiText(text) {
    if (this.ui.readyState === "open") this.ui.send(text);
  }

  scan() {
    this.scanStarted = performance.now();
    for (let index = 1; index <= SCAN_PIECES; index++) {
      const head = `scan ${index} ${SCAN_PIECES} `;
      this.sendUiText(head + "x".repeat(SCAN_BYTES - head.length));
    }
  }

  // This link as the connectivity matrix shows it: {peer, state, local, remote, localAddress,
  // remoteAddress, rttMs, mbps}, the candidate types (host, srflx, prflx, relay) and
  // addresses of the selected pair, the heartbeat's round trip (ICE's before the first
  // echo) and the scan's MB/s.
  async route() {
    const report = await this.pc.getStats();
    let pair = null;
    report.forEach((s) => {
      if (s.type === "transport" && s.selectedCandidatePairId) pair = report.get(s.selectedCandidatePairId);
    });
    const local = pair ? report.get(pair.localCandidateId) : null;
    const remote = pair ? report.get(pair.remoteCandidateId) : null;
    const rtt = pair ? pair.currentRoundTripTime : undefined;
    const address = (c) => (c && c.address ? `${c.address}:${c.port}` : null);
    return { peer: this.peer, state: this.pc.connectionState,
      local: local ? local.candidateType : null, remote: remote ? remote.candidateType : null,
      localAddress: address(local), remoteAddress: address(remote),
      rttMs: this.rttMs ?? (typeof rtt === "number" ? rtt * 1000 : null), mbps: this.mbps };
  }

  close() {
    if (this.isGone) return;
    this.isGone = true;
    this.queue = [];
    try {
      this.pc.close();
    } catch {
      /* already closed */
    }
    this.mesh.links.delete(this.peer);
    if (this.isOpen) this.mesh.emit("gone", { peer: this.peer });
  }
}

// After (re)joining signaling, e.g. across a server restart, rosters refill as peers come
// back; for this long a peer missing from them keeps its link. Afterwards the roster rules.
export const ROSTER_GRACE_MS = 30000;

export class Mesh extends EventTarget {
  constructor(signaling, selfId) {
    super();
    this.signaling = signaling;
    this.selfId = selfId;
    this.links = new Map();
    this.joinedAt = performance.now();
    this.pruneTimer = null;
    this.approved = null; // ids of the last approved roster
    this.present = new Set(); // ids of the last roster
    this.removed = new Set(); // ids a roster said the host removed
    this.beating = null; // the heartbeat interval, from the first open link on
    for (const type of ["offer", "answer", "ice"]) {
      signaling.addEventListener(type, (e) => this.onSignal(type, e.detail));
    }
  }

  emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  // Send a heartbeat on every open link; close those that fell silent (see BEAT).
  beat() {
    const now = performance.now();
    if (this.lastBeat && now - this.lastBeat > BEAT_MS + LATE_MS) {
      // This page itself did not run (a throttled or busy tab): what it did not read says
      // nothing about the others.
      for (const link of this.links.values()) link.heard = Math.max(link.heard, now - BEAT_MS);
    }
    this.lastBeat = now;
    this.beats = (this.beats || 0) + 1;
    if (this.beats % SHARE_EVERY === 0) {
      this.routes().then((rows) => {
        this.emit("routes", { rows });
        this.sendUi({ links: rows });
      }).catch(() => {});
    }
    for (const link of [...this.links.values()]) {
      if (!link.isOpen) continue;
      if (now - link.heard > SILENT_MS) {
        const silent = ((now - link.heard) / 1000).toFixed(1);
        this.emit("error", { peer: link.peer, text: `nothing heard for ${silent} s (no heartbeat); left out` });
        link.close();
      } else {
        link.sendUiText(`beat ${now.toFixed(3)}`);
      }
    }
  }

  // Signaling (re)joined: rosters may refill for a while (see ROSTER_GRACE_MS).
  rejoined() {
    this.joinedAt = performance.now();
  }

  // Connect to every approved peer in `ids` (the roster); the smaller id offers. Links to
  // peers not in `ids` are closed (removed by the host, or gone), except within
  // ROSTER_GRACE_MS of (re)joining signaling: after a server restart the rosters refill
  // while the channels, which never touch the server, carry on.
  connect(ids, present = ids, removed = []) {
    this.approved = new Set(ids);
    this.present = new Set(present); // every peer of the roster, approved or not
    for (const peer of removed) this.removed.add(peer); // a roster said the host removed it
    for (const peer of ids) {
      if (peer === this.selfId) continue;
      if (!this.links.has(peer) && this.selfId < peer) {
        const link = new Link(this, peer);
        this.links.set(peer, link);
        link.offer().catch((err) => this.fail(link, err));
      }
    }
    this.prune();
  }

  prune() {
    const wait = this.joinedAt + ROSTER_GRACE_MS - performance.now();
    if (wait > 0) {
      if (this.pruneTimer === null) {
        this.pruneTimer = setTimeout(() => { this.pruneTimer = null; this.prune(); }, wait);
      }
      return;
    }
    if (this.approved === null) return;
    for (const link of [...this.links.values()]) {
      if (!this.approved.has(link.peer)) {
        // the host removed it, it left the room (closed or lost), or is there unapproved
        const why = this.removed.has(link.peer) ? "removed by the host"
          : this.present.has(link.peer) ? "no longer approved by the host" : "left the room";
        this.emit("error", { peer: link.peer, text: `${why}; link closed` });
        link.close();
      }
    }
  }

  onSignal(type, msg) {
    const peer = msg.from;
    let link = this.links.get(peer);
    if (type === "offer") {
      if (link) link.close(); // the other side restarted: start over
      link = new Link(this, peer);
      this.links.set(peer, link);
    }
    if (!link) return;
    const step = type === "offer" ? link.onOffer(msg.sdp)
      : type === "answer" ? link.onAnswer(msg.sdp) : link.onIce(msg);
    step.catch((err) => this.fail(link, err));
  }

  fail(link, err) {
    this.emit("error", { peer: link.peer, text: `WebRTC: ${err.message || err}` });
    link.close();
  }

  send(peer, buffer) {
    const link = this.links.get(peer);
    if (link && link.isOpen) link.send(buffer);
  }

  // A closing page's goodbye on every open link's "ui" channel: its own SCTP stream, so it
  // goes out ahead of the rest of a large message still queued on "data" (which the page
  // closes before it is sent); the others then say this peer left, not that it was lost.
  sayBye() {
    for (const link of this.links.values()) if (link.isOpen) link.sendUiText("bye");
  }

  sendUi(obj, peer = null) {
    for (const link of this.links.values()) if (link.isOpen && (!peer || link.peer === peer)) link.sendUi(obj);
  }

  // Every link's route() (see Link.route), in peer order.
  async routes() {
    const links = [...this.links.values()].sort((a, b) => (a.peer < b.peer ? -1 : 1));
    return Promise.all(links.map((link) => link.route()));
  }

  openPeers() {
    return [...this.links.values()].filter((l) => l.isOpen).map((l) => l.peer);
  }

  close() {
    clearInterval(this.beating);
    for (const link of [...this.links.values()]) link.close();
  }
}
