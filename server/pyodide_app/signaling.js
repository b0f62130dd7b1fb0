// The page's websocket to the server (/ws): join or create a room, host actions, relaying
// WebRTC offers/answers/ICE, status. Frames are {"v": 1, "type": ...} as docs/SERVER.md and
// server/protocol.py define them. Every server frame is dispatched as an event of its type.
//
// A dropped socket is reopened with the resume token the server issued on `joined`, so a
// page keeps its peer id and role (host included) across a server restart or a network blip.
// A host's token is also kept for its tab (sessionStorage: that tab's, and a duplicated or
// restored copy of it), so a host page that reloads hosts its room again, under a new peer id (`fresh`: the page's
// state is new; docs/SERVER.md, "Restarts and reconnects"). One entry a room: a tab that
// hosted two rooms in turn (New room) takes either back.

const PROTOCOL_VERSION = 1;
const RECONNECT_MS = [500, 1000, 2000, 5000];
const HOST_KEY = "daisychain.host."; // + a room code: this tab's host token of that room

// This tab's kept host token of `room`, or null (none, or storage refused: a private
// window may).
function keptHost(room) {
  try {
    return sessionStorage.getItem(HOST_KEY + room);
  } catch {
    return null;
  }
}

function keepHost(room, token) {
  try {
    if (token) sessionStorage.setItem(HOST_KEY + room, token);
    else sessionStorage.removeItem(HOST_KEY + room);
  } catch {
    // no storage: a reload makes this page a new member, as before
  }
}

export class Signaling extends EventTarget {
  // target: {room: CODE} joins that private room, {create: true} makes one, {} the auto room.
  constructor(target) {
    super();
    this.target = target;
    this.token = null;
    this.fresh = false; // this page reloaded from a host's page of target.room
    const kept = target.room ? keptHost(target.room) : null;
    if (kept) {
      this.token = kept;
      this.fresh = true;
    }
    // The server's ICE servers (TURN credentials included), sent once this page is approved:
    // {iceServers, iceTransportPolicy}, spread into each RTCPeerConnection (mesh.js).
    this.rtcConfig = {};
    this.ws = null;
    this.closed = false;
    this.attempt = 0;
  }

  connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/ws`);
    this.ws = ws;
    ws.onopen = () => {
      this.attempt = 0;
      this.dispatch("socket", { open: true });
      if (this.target.create && !this.token) this.send("create", {});
      else this.send("join", this.joinFields());
    };
    ws.onmessage = (event) => this.onFrame(event.data);
    ws.onclose = (event) => {
      if (this.ws !== ws) return;
      this.dispatch("socket", { open: false, code: event.code, reason: event.reason });
      if (this.closed || event.code === 4403 || event.code === 4409) return;
      const wait = RECONNECT_MS[Math.min(this.attempt++, RECONNECT_MS.length - 1)];
      setTimeout(() => this.closed || this.connect(), wait);
    };
  }

  joinFields() {
    const fields = {};
    // an empty code too: the server refuses it as no room code (it joined the auto room)
    if (this.target.room !== undefined) fields.room = this.target.room;
    if (this.token) fields.token = this.token;
    if (this.fresh) fields.fresh = true;
    return fields;
  }

  onFrame(raw) {
    let msg;
    try {
      msg = JSON.parse(raw);
    } catch {
      return;
    }
    if (!msg || msg.v !== PROTOCOL_VERSION || typeof msg.type !== "string") return;
    if (msg.type === "joined") {
      this.token = msg.token;
      this.fresh = false; // later reconnects are this page's own: same id
      if (msg.room) this.target = { room: msg.room };
      if (msg.room) keepHost(msg.room, msg.role === "host" ? msg.token : null);
    }
    if ((msg.type === "joined" || msg.type === "approved") && msg.rtcConfig
        && typeof msg.rtcConfig === "object") {
      this.rtcConfig = msg.rtcConfig;
    }
    this.dispatch(msg.type, msg);
  }

  dispatch(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  send(type, fields) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify({ v: PROTOCOL_VERSION, type, ...fields }));
    return true;
  }

  close() {
    this.closed = true; // on pagehide too: a reload keeps the tab's host token
    if (this.ws) {
      this.send("leave", {});
      this.ws.close(1000, "bye");
    }
  }
}
