// One browser peer, main thread: signaling, the WebRTC mesh and the compute worker glued
// together, and the state the page shows (and `window.daisychain.status()` returns).
//
// The mesh's messages go to the worker and back as transferred ArrayBuffers (no copies);
// the worker's Python decides everything about runs (pynode/run/protocol.py). This file only
// routes, keeps the record and tells the other pages our state on the "ui" channel.

import { Mesh } from "./mesh.js";
import { Signaling } from "./signaling.js";

const STATUS_EVERY_MS = 250; // at most this often to the server (its rate limit is 50/s)
const KEPT_MESSAGES = 200;
// How long a pending page waits for the host's approval (join's --approval-wait default).
// An unknown room code answers exactly like a real room whose host has not decided yet
// (docs/SERVER.md, Rooms), so both end after this same wait: codes cannot be probed.
const APPROVAL_WAIT_S = 300;

// What a run's leader may change while it trains (pynode/run/schedule.py FIELDS).
export const STEERABLE = ["lr", "steps"];

// `config` with the leader's `change` applied, as each peer's trainer applies it. A run
// report (and a failover's) carries the config as it is then, every change of its schedule
// already in it: a resumed checkpoint's changes are history there, and the resume's own
// steps come after them (a Stop in the file, resumed for more steps, still trains on).
function changedConfig(config, change) {
  const now = { ...config };
  for (const name of STEERABLE) if (change[name] !== undefined) now[name] = change[name];
  return now;
}

// A Stop is the change {step: S, steps: S}: the run ends where it is (pynode/run/schedule.py
// is_stop).
const isStop = (change) => change?.steps !== undefined && change.steps === change.step;

// What to do about a pair that cannot connect; pynode/cli/peer.py says the same natively.
export function linkFailedText(peer) {
  return `no connection to peer ${peer}: no ICE candidate pair works between the two ` +
    "networks. On one LAN allow UDP between the machines (and multicast DNS for tabs); " +
    "across networks the server needs a TURN server (--ice-server); or put both on one " +
    "VPN. See docs/NETWORKS.md.";
}
export class PageNode extends EventTarget {
  // target: {room} / {create: true} / {} (auto room); flags: {break_gate, backend,
  // approvalWaitS}
  constructor(target, flags = {}) {
    super();
    this.flags = flags;
    this.state = {
      room: null, peerId: null, role: null, approved: false, private: false,
      hostAway: false, // a private room whose host's page is not connected now
      approvalUntil: null, // when a waiting page gives up on approval (epoch ms)
      state: "booting", step: 0, loss: null, hash: null, probe: null, leader: null,
      run: null, config: null, stoppedFrom: null, members: [], error: null, checks: [],
      history: [], messages: [],
      failovers: [],
      uiLatencyMs: [], bench: null, verified: false, backend: null, gemm: null, kernels: null,
      webgpu: null,
      // What the dashboards show of this peer (a native peer tells the same: pynode/cli/peer.py)
      runtime: "browser", cores: navigator.hardwareConcurrency || null,
      // the device's memory where the browser tells it (secure pages), else the JS heap limit
      ram: navigator.deviceMemory ? navigator.deviceMemory * 2 ** 30
        : (performance.memory?.jsHeapSizeLimit ?? null),
      heldout: null,
      microbatch_seconds: null, share: null, tokens_per_s: null, bytes_sent: 0, bytes_received: 0,
      // The run's changes at step boundaries ({step, lr, steps}: `train --schedule` replays
      // them) and whether it waits between steps.
      schedule: [], paused: false,
      joining: null, // {run, leader}: asked to join that run, admitted at its next step
      // A --sync-every run: the last inner step this page took ({replica, step}) and how
      // many it took in the run (each replica it computes takes each inner step once)
      inner: null, innerSteps: 0,
      roomProblem: null, // why this page is in no room (bad code, nobody approved it)
      // out of the room for good, as its own row says: "removed" or "refused" by the host,
      // or "left" (a duplicate took its place, nobody approved it); null while in it
      outOfRoom: null,
      linkProblems: {}, // peer id -> why no data channel to it could open
    };
    this.approvalTimer = null;
    this.ownLinks = []; // this page's links, as the mesh last measured them
    this.roster = new Map(); // id -> {id, role, approved, status}
    this.info = new Map(); // id -> what that page told us on the ui channel
    this.trainable = {}; // id -> "ready" | "training": that page's Python said so to ours
    this.starts = new Map(); // start request id -> {resolve, reject}
    this.nextStart = 1;
    this.lastStatusSent = 0;
    this.signaling = new Signaling(target);
    this.mesh = null;
    this.left = false; // declined or removed by the host: out of the room for good
    this.dismissed = new Set(); // peers this host refused or removed (sayDepartures)
    this.goodbye = null; // the run protocol's `bye`, from the worker (sayGoodbye)
    this.signalingDown = false; // the signaling socket is lost and being reconnected
    this.rosterRefills = true; // (re)joined signaling: its next roster may lack peers yet
    this.worker = new Worker("/app/worker.js");
    this.worker.onmessage = (e) => this.onWorker(e.data);
    this.computeDown = null; // why the worker answers nothing more (crashed, no Python)
    this.worker.onerror = (e) => this.workerDown(`compute worker crashed: ${e.message}`);
    this.wireSignaling();
  }

  boot() {
    this.worker.postMessage({ type: "boot", flags: this.flags });
    this.signaling.connect();
  }

  changed() {
    this.dispatchEvent(new Event("change"));
  }

  say(level, text) {
    this.state.messages.push({ level, text, at: new Date().toISOString() });
    if (this.state.messages.length > KEPT_MESSAGES) this.state.messages.shift();
    this.changed();
  }

  fail(text) {
    this.state.state = "failed";
    this.state.error = text;
    this.say("error", text);
    this.tellPeers();
  }

  workerDown(text) {
    this.computeDown = text;
    this.fail(text);
  }

  // The host declined or removed this page: it leaves signaling for good, and nothing
  // that arrives later (its checks passing, the socket closing) says it is waiting again.
  // Its Python stops the run it is in first: with its links closed it would fail over to
  // itself and train on alone (the worker takes messages in order, so before the links'
  // `gone`).
  leave(text, how) {
    this.left = true;
    this.state.approved = false;
    this.outOfRoom(text, how);
    this.fail(text);
  }

  // ------------------------------------------------------------------ signaling
  // The server's refusal of something this page sent. A signal relayed to a peer that has
  // just left is refused (no_peer: "no approved peer with that id"): the roster says who
  // left; the refusal showed as an error twice beside "peer X left the room" (a host's tab
  // closing). A host's approval of a peer gone meanwhile is still said.
  onServerError(m) {
    if (m.code === "no_peer" && m.message.startsWith("no approved peer")) return;
    if (m.code === "replaced") { // another page holds this id or took the host role
      this.giveUp(`this page left the room: ${m.message}`);
    } else if (m.code === "bad_room" && !this.state.peerId) {
      const code = this.signaling.target.room;
      this.giveUp(`${code ? `"${code}" is not a room code` : "the link has no room code"} ` +
        "(a room link ends in ?room= and 22 letters, digits, - or _): check the link, or " +
        "make a new private room");
    } else {
      this.say("error", `server: ${m.message} (${m.code})`);
    }
  }

  wireSignaling() {
    const on = (type, fn) => this.signaling.addEventListener(type, (e) => fn(e.detail));
    on("joined", (m) => {
      Object.assign(this.state, { room: m.room, peerId: m.peer, role: m.role,
        approved: m.state === "approved", private: m.private });
      this.say("info", m.state === "approved" ? `joined as ${m.role}`
        : "waiting for the host to approve this page");
      if (m.state !== "approved") this.awaitApproval();
      this.ensureMesh(m.peer);
      this.mesh.rejoined();
      this.rosterRefills = true;
      this.dispatchEvent(new CustomEvent("joined", { detail: m }));
    });
    on("approved", () => {
      this.state.approved = true;
      this.say("info", "the host approved this page");
    });
    on("roster", (m) => this.onRoster(m));
    on("status", (m) => {
      const entry = this.roster.get(m.from);
      if (entry) entry.status = m;
      this.changed();
    });
    // out for good, with the ways on (it said "this page leaves the room: the host
    // declined", under a "failed" badge); a run's state still downloads
    const kept = () => (this.state.run ? "; Download checkpoint (.pt) keeps the state " +
      "this page reached" : "");
    on("denied", () => this.leave("the host refused this page: ask the host, then reload " +
      `this page to ask again, or make a new private room${kept()}`, "refused"));
    on("removed", () => this.leave("the host removed this page from the room: ask the " +
      `host, then reload this page to join again, or make a new private room${kept()}`,
    "removed"));
    on("error", (m) => this.onServerError(m));
    on("socket", (m) => {
      // closed by this page (it gave up waiting for approval): nothing reconnects. Said
      // once an outage, as a native peer does (each failed retry of one server restart
      // said it again), and its end too.
      if (!m.open && !this.left && !this.signaling.closed) {
        if (!this.signalingDown) this.say("warn", "signaling connection lost; reconnecting");
        this.signalingDown = true;
      } else if (m.open && this.signalingDown) {
        this.signalingDown = false;
        this.say("info", "signaling connection restored");
      }
    });
  }

  // A pending page gives up after the approval wait, with one message whether the code is
  // unknown or the host has not decided (see APPROVAL_WAIT_S).
  awaitApproval() {
    if (this.approvalTimer !== null) return;
    const wait = this.flags.approvalWaitS || APPROVAL_WAIT_S;
    this.state.approvalUntil = Date.now() + wait * 1000; // the page says when it gives up
    this.approvalTimer = setTimeout(() => {
      if (this.state.approved || this.state.roomProblem) return;
      // the page leaves the room now: the host can no longer approve this peer id
      this.giveUp(`nobody approved this page within ${wait} s: check the room code, or ` +
        "reload this page to ask again (the room's host approves the peer id it then shows)");
    }, wait * 1000);
  }

  // This page leaves signaling for good and says why next to the room's controls. A run it
  // is in stops (a duplicate of this tab took its place: it must not train on alone).
  giveUp(text) {
    this.outOfRoom(text, "left");
    this.say("error", text);
  }

  // Out of the room for good, `text` saying why (`how`: see state.outOfRoom): its Python
  // first, then its links.
  outOfRoom(text, how) {
    this.state.roomProblem = text;
    this.state.outOfRoom = how;
    this.worker.postMessage({ type: "leave", reason: text });
    this.signaling.close();
    if (this.mesh) this.mesh.close();
  }

  // This tab goes (pagehide): the others must say the page left, not that they lost it.
  // "bye" on each link's ui channel first (Mesh.sayBye): its own stream, ahead of a large
  // message queued on "data" (not always out before the page's WebRTC goes: BROWSER.md);
  // the receivers hand it on as the run protocol's `bye`. Then that `bye` on "data" (the
  // worker gave its bytes at boot; it may not run again now), behind this page's other
  // messages, where it gets through.
  sayGoodbye() {
    if (!this.goodbye || !this.mesh) return;
    this.mesh.sayBye();
    for (const peer of this.mesh.openPeers()) this.mesh.send(peer, this.goodbye);
  }

  onRoster(m) {
    if (this.state.outOfRoom) return; // one sent before the server let this page go
    const waiting = new Set([...this.roster.values()].filter((p) => !p.approved).map((p) => p.id));
    const before = this.rosterRefills ? [] : [...this.roster.values()];
    this.rosterRefills = false;
    this.roster = new Map(m.peers.map((p) => [p.id, {
      id: p.id, role: p.role, approved: p.state === "approved", status: p.status || null,
      resumed: Boolean(p.resumed),
    }]));
    const me = this.roster.get(this.state.peerId);
    if (me) Object.assign(this.state, { role: me.role, approved: me.approved });
    // A private room keeps its host while the host's page is away (server/rooms.py)
    this.state.hostAway = Boolean(this.state.private && m.host && !this.roster.has(m.host));
    if (this.mesh && this.state.approved) {
      this.mesh.connect([...this.roster.values()].filter((p) => p.approved).map((p) => p.id),
        [...this.roster.keys()],
        Array.isArray(m.removed) ? m.removed.filter((p) => typeof p === "string") : []);
      // After a server restart members come back pending; a peer still in our live mesh
      // was approved before, so the host lets it back in at once. A removed or denied
      // peer never comes back pending: the server refuses its token, restarts included.
      if (this.state.role === "host") {
        const live = new Set(this.mesh.openPeers());
        for (const p of this.roster.values()) {
          if (p.resumed && !p.approved && live.has(p.id)) this.signaling.send("approve", { peer: p.id });
        }
      }
    }
    // A host hears of each new request (a member's reloaded page is one: it comes back as a
    // new peer, and its old id's row only said "lost peer"); none while it is pending itself.
    if (this.state.role === "host" && this.state.approved) {
      for (const p of this.roster.values()) {
        if (!p.approved && !p.resumed && !waiting.has(p.id)) {
          this.say("info", `peer ${p.id} asks to join: Approve or Refuse it in the peers table`);
        }
      }
    }
    this.sayDepartures(before, m);
    this.changed();
  }

  // A peer that left the room outside a run (a closed tab, a native peer's Ctrl-C) only
  // lost its row; one that leaves a run is told by the run ("left at step N"). Those the
  // host removed or refused are told where the host did it.
  sayDepartures(before, m) {
    if (!this.state.approved) return;
    const removed = new Set(Array.isArray(m.removed) ? m.removed : []);
    const inRun = new Set(this.state.state === "training" ? this.state.members || [] : []);
    for (const p of before) {
      if (this.roster.has(p.id) || p.id === this.state.peerId || removed.has(p.id)
        || inRun.has(p.id) || this.dismissed.has(p.id)) continue;
      this.say("info", p.approved ? `peer ${p.id} left the room`
        : `peer ${p.id} left the room before the host approved it`);
    }
  }

  ensureMesh(selfId) {
    if (this.mesh) return;
    this.mesh = new Mesh(this.signaling, selfId);
    this.worker.postMessage({ type: "self", id: selfId });
    this.mesh.addEventListener("open", (e) => {
      delete this.state.linkProblems[e.detail.peer];
      this.worker.postMessage({ type: "open", peer: e.detail.peer });
      this.tellPeers(e.detail.peer);
      this.changed();
    });
    this.mesh.addEventListener("gone", (e) => {
      this.worker.postMessage({ type: "gone", peer: e.detail.peer });
      this.info.delete(e.detail.peer);
      this.changed();
    });
    this.mesh.addEventListener("message", (e) => {
      this.state.bytes_received += e.detail.data.byteLength;
      this.worker.postMessage({ type: "message", peer: e.detail.peer, data: e.detail.data },
        [e.detail.data]);
    });
    this.mesh.addEventListener("bye", (e) => {
      if (!this.goodbye) return; // booting: no run to leave
      const data = this.goodbye.slice().buffer; // the same bytes every peer sends
      this.worker.postMessage({ type: "message", peer: e.detail.peer, data }, [data]);
    });
    this.mesh.addEventListener("ui", (e) => {
      this.info.set(e.detail.peer, { ...(this.info.get(e.detail.peer) || {}), ...e.detail.msg });
      this.changed();
    });
    this.mesh.addEventListener("error", (e) => this.say("warn", `peer ${e.detail.peer}: ${e.detail.text}`));
    this.mesh.addEventListener("routes", (e) => {
      this.ownLinks = e.detail.rows;
      this.changed();
    });
    this.mesh.addEventListener("unreachable", (e) => {
      const text = linkFailedText(e.detail.peer);
      this.state.linkProblems[e.detail.peer] = text;
      this.say("error", text);
    });
  }

  // Our state for the other pages' tables, on the ui channel (and a status frame to the server).
  tellPeers(peer = null) {
    const s = this.state;
    if (this.mesh) {
      this.mesh.sendUi({ state: s.state, step: s.step, loss: s.loss, hash: s.hash, probe: s.probe,
        leader: s.leader, run: s.run, error: s.error, ...this.resources() }, peer);
    }
    const now = performance.now();
    if (s.approved && s.hash && now - this.lastStatusSent > STATUS_EVERY_MS) {
      this.lastStatusSent = now;
      this.signaling.send("status", { step: s.step, loss: Number.isFinite(s.loss) ? s.loss : null,
        hash: s.hash, probe: s.probe || "" });
    }
  }

  // This peer's resources and part of the last step, as the dashboards show them.
  resources() {
    const s = this.state;
    return { runtime: s.runtime, gemm: s.gemm, kernels: s.kernels, cores: s.cores, ram: s.ram,
      heldout: s.heldout, microbatch_seconds: s.microbatch_seconds, share: s.share,
      tokens_per_s: s.tokens_per_s, bytes_sent: s.bytes_sent, bytes_received: s.bytes_received };
  }

  // ------------------------------------------------------------------ worker
  onWorker(msg) {
    const s = this.state;
    if (msg.type === "goodbye") {
      this.goodbye = new Uint8Array(msg.data);
    } else if (msg.type === "send") {
      s.bytes_sent += msg.data.byteLength;
      if (this.mesh) this.mesh.send(msg.peer, msg.data);
    } else if (msg.type === "state") {
      if (msg.state === "failed") this.workerDown(`could not start Python: ${msg.error}`);
      else if (!this.left) s.state = msg.state;
      this.tellPeers();
      this.changed();
    } else if (msg.type === "checks") {
      s.checks = msg.rows;
      Object.assign(s, { backend: msg.backend, gemm: msg.backend, kernels: msg.kernels,
        webgpu: msg.webgpu });
      if (msg.ready) {
        if (!this.left) s.state = "ready";
        s.verified = true;
        this.say("info", `verified: ${msg.rows.length} checks passed; GEMM backend ${msg.backend}, kernels ${msg.kernels}`);
        this.tellPeers();
      } else {
        const bad = msg.rows.filter((r) => !r.passed && !r.skipped).map((r) => `${r.check}: ${r.result}`);
        this.fail(`gate failed, this page will not train: ${bad.join("; ")}`);
      }
    } else if (msg.type === "report") {
      this.onReport(msg.kind, msg.fields);
    } else if (msg.type === "started") {
      const waiter = this.starts.get(msg.id);
      this.starts.delete(msg.id);
      const { type, id, ...answer } = msg; // the caller's answer, not the worker's envelope
      if (waiter) (msg.ok ? waiter.resolve(answer) : waiter.reject(new Error(msg.error)));
    }
  }

  onReport(kind, f) {
    const s = this.state;
    // Out of the room: a step already on its way still counts (the state downloads), a run
    // starting or ending, a failover or a join asked for does not.
    if (this.left && !["event", "step"].includes(kind)) return;
    if (kind === "run") {
      // The steps shown so far stay only where this run goes on from them (a resume of
      // the state they led to, or this page synced into its run again); another run's
      // would mix two runs in the table and chart.
      const from = s.history.find((h) => h.step === f.step);
      if (f.run !== s.run && (!from || from.hash !== f.hash)) {
        s.history = [];
        s.failovers = [];
      } else {
        s.history = s.history.filter((h) => h.step <= f.step);
        s.failovers = s.failovers.filter((x) => x.step <= f.step);
      }
      // Synced into a run under way: its loss before this page joined, as the leader kept
      // it (a reloaded page's chart started at the step it came back at). Steps it shows
      // already stay as they are.
      const shown = new Set(s.history.map((h) => h.step));
      const before = (f.curve || []).filter(([step]) => step <= f.step && !shown.has(step))
        .map(([step, loss, heldout]) => ({ step, loss, heldout, hash: null }));
      if (before.length) s.history = [...before, ...s.history].sort((a, b) => a.step - b.step);
      // the step and hash it goes on from, not the last run's until its first step is done
      Object.assign(s, { state: "training", joining: null, run: f.run, leader: f.leader,
        step: f.step, hash: f.hash, loss: null, probe: null,
        // its changes so far (a resumed checkpoint's, or those a sync brings), each in
        // `config` already; `stoppedFrom`: the steps it had before a Stop, once stopped
        config: f.config, error: null, heldout: null, schedule: f.schedule || [], paused: false,
        stoppedFrom: null,
        inner: null, innerSteps: 0, members: f.ranks });
      this.say("info", f.joined_at === null ? `training started by ${f.leader}`
        : `joined the run of ${f.leader} at step ${f.joined_at}; state verified by hash`);
    } else if (kind === "step") {
      Object.assign(s, { step: f.step, loss: f.loss, hash: f.hash, probe: f.probe,
        members: f.members, microbatch_seconds: f.microbatch_seconds, share: f.share,
        tokens_per_s: f.tokens_per_s });
      if (f.heldout !== null) s.heldout = f.heldout;
      s.history.push({ step: f.step, loss: f.loss, hash: f.hash, seconds: f.seconds,
        heldout: f.heldout, share: f.share, inner: f.inner });
    } else if (kind === "inner") {
      // inside an outer step: nothing the other pages show changed
      if (f.run === s.run) Object.assign(s, { inner: f, innerSteps: s.innerSteps + 1 });
      this.changed();
      return;
    } else if (kind === "done") {
      s.state = "done";
      this.say("info", `run finished at step ${f.step}, hash ${f.hash.slice(0, 16)}`);
    } else if (kind === "failed") {
      this.fail(f.error);
      return;
    } else if (kind === "event") {
      this.say(f.level, f.text);
    } else if (kind === "joining") {
      // Asked to join a run: not "ready" for another until admitted (or that run is gone).
      s.joining = f.run ? f : null;
      if (f.run && s.state === "ready") s.state = "joining";
      else if (!f.run && s.state === "joining") s.state = "ready";
      if (f.run) this.say("info", `asked ${f.leader} to join its run: admitted at its next ` +
        "step (not while it is paused)");
    } else if (kind === "leader") {
      // The leader vanished: the run goes on after step f.step (steps past it are computed
      // again, to the same hashes), led by f.leader. The new leader's word at that boundary
      // carries the old one's change of it again: the record keeps only those before it.
      Object.assign(s, { leader: f.leader, step: f.step,
        history: s.history.filter(h => h.step <= f.step),
        config: f.config, schedule: f.schedule, stoppedFrom: null });
      s.failovers.push({ lost: f.lost, leader: f.leader, step: f.step });
      this.say("warn", `the run goes on after step ${f.step} led by ` +
        `${f.leader === s.peerId ? "this page" : f.leader}, with ${f.ranks.length} peer(s)`);
    } else if (kind === "control") {
      s.paused = f.paused;
      if (f.change) {
        s.schedule.push(f.change);
        // a next Start begins from the steps chosen before a Stop, not from where it stopped
        if (s.config && isStop(f.change)) s.stoppedFrom = s.config.steps;
        if (s.config) s.config = changedConfig(s.config, f.change);
        const { step: at, ...changed } = f.change;
        this.say("info", isStop(f.change)
          ? `the leader stopped the run at step ${at}`
          : `after step ${at}: ${Object.entries(changed).map(([k, v]) => `${k} ${v}`).join(", ")}`);
      } else {
        this.say("info", `${f.paused ? "paused" : "resumed"} after step ${f.step}`);
      }
    } else if (kind === "bench") {
      s.bench = f;
      this.say("info", `all-reduce of ${f.size} int64 over ${f.members} peers: ` +
        `${(Math.min(...f.seconds) * 1000).toFixed(1)} ms at best, exact ${f.exact}`);
    } else if (kind === "peers") {
      this.trainable = f;
      this.changed();
      return;
    }
    this.tellPeers();
    this.changed();
  }

  // ------------------------------------------------------------------ actions
  // Lead a run of `config`; resolves to {ranks} or rejects with the reason (bad config, ...).
  start(config) {
    const refused = this.notApproved();
    return refused ? Promise.reject(refused) : this.request({ type: "start", config });
  }

  // Why this page may not lead a run yet (its Start button is off then too): null if it may.
  notApproved() {
    if (this.state.outOfRoom) {
      return new Error(`RoomError: ${this.state.roomProblem}; a page out of the room leads ` +
        "no run (reload it to ask to join again, or make a new private room)");
    }
    return this.state.approved ? null
      : new Error("RoomError: this page waits for the host of this room to approve it; it "
        + "may lead a run once approved");
  }

  // Lead a run continuing an uploaded .pt (ArrayBuffer): validated, then sent to every peer.
  // A run the file finished continues to `steps` where given (the form's steps field).
  resume(data, steps = null) {
    const refused = this.notApproved();
    return refused ? Promise.reject(refused) : this.request({ type: "resume", data, steps });
  }

  // What resume(data, steps) would continue, read with its checks; starts nothing. Resolves
  // to {task, width, ..., step, steps, hash, schedule, refused} (pynode/browser_resume.py)
  // or rejects with why the file is no checkpoint the page can resume.
  previewCheckpoint(data, steps = null) {
    return this.request({ type: "preview", data, steps });
  }

  // Resolves to the current state as .pt bytes (an ArrayBuffer).
  async checkpoint() {
    return (await this.request({ type: "checkpoint" })).data;
  }

  // The leader steers its run: {lr, steps, pause} (each optional), applied at the next step
  // boundary on every peer; resolves to {requested, paused, step} or rejects with the reason.
  steer(request) {
    return this.request({ type: "steer", request });
  }

  // Lead `repeats` all-reduces of `size` int64 with every ready peer; resolves to the timing.
  benchAllreduce(size, repeats) {
    return this.request({ type: "bench", size, repeats });
  }

  // GEMM cases [{backend, batch, m, k, n, seed, fill, repeats}] through the page's candidate
  // backends; resolves to [{...case, sha256, shape, seconds} or {...case, error}].
  async gemm(cases) {
    return (await this.request({ type: "gemm", cases })).results;
  }

  request(msg) {
    // A worker that crashed, or whose Python did not start, answers nothing: refuse at once
    // with the reason instead of leaving the caller waiting forever. One whose run failed,
    // or that left the room, still answers (its state downloads).
    if (this.computeDown) {
      return Promise.reject(new Error(`this tab cannot compute: ${this.computeDown}`));
    }
    const id = this.nextStart++;
    return new Promise((resolve, reject) => {
      this.starts.set(id, { resolve, reject });
      this.worker.postMessage({ ...msg, id });
    });
  }

  approve(peerId) {
    return this.hostAction("approve", peerId);
  }

  deny(peerId) {
    return this.hostAction("deny", peerId);
  }

  // An approved peer out of the room for good (its links close; a run re-plans without it,
  // as when a tab closes): the server refuses its token from then on.
  remove(peerId) {
    if (peerId === this.state.peerId) throw new Error("the host cannot remove itself");
    return this.hostAction("remove", peerId);
  }

  hostAction(type, peerId) {
    if (this.state.role !== "host") throw new Error(`only the host may ${type}`);
    if (!this.roster.has(peerId)) throw new Error(`no peer ${peerId} in this room`);
    if (type !== "approve") this.dismissed.add(peerId);
    const sent = this.signaling.send(type, { peer: peerId });
    // the host's own record of what it did (a refusal said nothing there)
    if (sent && type === "deny") this.say("info", `refused peer ${peerId}: it is out of the room`);
    if (sent && type === "remove") this.say("info", `removed peer ${peerId} from the room`);
    return sent;
  }

  // The connectivity matrix as this page knows it: its own links and the rows the other
  // peers shared, one per direction: {a, b, state, local, remote, candidate, localAddress,
  // remoteAddress, rtt_ms, mbps}, as `a` measured its link to `b` (pynode's
  // NativeMesh.matrix makes the same rows).
  links() {
    const row = (a, r) => ({ a, b: r.peer, state: r.state, local: r.local, remote: r.remote,
      candidate: r.local && r.remote ? `${r.local} -> ${r.remote}` : null,
      localAddress: r.localAddress ?? null, remoteAddress: r.remoteAddress ?? null,
      rtt_ms: r.rttMs ?? null, mbps: r.mbps ?? null });
    const rows = this.ownLinks.map((r) => row(this.state.peerId, r));
    for (const [peer, shown] of this.info) {
      for (const r of Array.isArray(shown.links) ? shown.links : []) {
        if (r && r.peer) rows.push(row(peer, r));
      }
    }
    return rows;
  }

  // This page's links: [{peer, state, local, remote, rttMs, mbps}] (mesh.js Link.route).
  async routes() {
    return this.mesh ? this.mesh.routes() : [];
  }

  status() {
    const s = this.state;
    // Out of the room, the roster it last heard is nobody's now: its own row only.
    const rows = [...this.roster.values()].filter((p) => !s.outOfRoom || p.id === s.peerId);
    if (s.peerId && !rows.some((p) => p.id === s.peerId)) {
      rows.unshift({ id: s.peerId, role: s.role, approved: s.approved, status: null });
    }
    const peers = rows.map((p) => {
      const info = p.id === s.peerId ? s : (this.info.get(p.id) || {});
      const fromServer = p.status || {};
      // A page is "ready" for us once its Python greeted ours: only then can a run include it.
      let state = info.state || null;
      const pythonUp = !["booting", "verifying", "failed"].includes(s.state);
      if (p.id !== s.peerId && pythonUp && state === "ready" && !this.trainable[p.id]) {
        state = "connecting";
      }
      return {
        id: p.id, self: p.id === s.peerId, role: p.role,
        approved: p.id === s.peerId ? s.approved : p.approved, // the roster's is stale once out
        approval: p.id === s.peerId && s.outOfRoom ? s.outOfRoom
          : p.approved ? "approved" : "pending",
        connected: p.id === s.peerId || Boolean(this.mesh && this.mesh.openPeers().includes(p.id)),
        // a page waiting to join another run cannot be in a new one
        state, trainable: p.id === s.peerId ? s.state === "ready"
          : Boolean(this.trainable[p.id]) && this.trainable[p.id] !== "joining",
        step: info.step ?? fromServer.step ?? 0,
        loss: info.loss ?? fromServer.loss ?? null, hash: info.hash ?? fromServer.hash ?? null,
        probe: info.probe ?? fromServer.probe ?? null, error: info.error || null,
        runtime: info.runtime ?? null, gemm: info.gemm ?? null, kernels: info.kernels ?? null,
        cores: info.cores ?? null, ram: info.ram ?? null, heldout: info.heldout ?? null,
        microbatch_seconds: info.microbatch_seconds ?? null, share: info.share ?? null,
        tokens_per_s: info.tokens_per_s ?? null, bytes_sent: info.bytes_sent ?? null,
        bytes_received: info.bytes_received ?? null,
      };
    });
    return JSON.parse(JSON.stringify({ ...s, steps: s.config?.steps ?? null, peers,
      // out of the room (refused, removed, given up): no links, they closed
      links: s.outOfRoom ? [] : this.links() }));
  }
}
