// The compute side of a page: Pyodide, numpy and pynode in a Web Worker, so the page stays
// responsive while a step computes. Everything is loaded from our own server: the runtime
// from /runtime/ (numpy from the wheel beside it), pynode from /bundle/pynode.zip, checked
// against the sha256 the server sends with it.
//
// main -> worker: boot {flags}, self {id}, open {peer}, gone {peer}, leave {reason},
//                 message {peer, data: ArrayBuffer (transferred)}, start {id, config},
//                 bench {id, size, repeats}, gemm {id, cases},
//                 generate {id, data: .pt ArrayBuffer, request: {prompt, tokens, ...}},
//                 kit {id, data: .pt ArrayBuffer}, stop {ids: generations to end},
//                 preview {id, data: .pt ArrayBuffer, steps}
// worker -> main: state {state, error}, checks {ready, rows}, send {peer, data (transferred)},
//                 report {kind, fields}, started {id, ok, ranks | error}
//
// The page's generation worker (generate.js) is this same script booted without `self`: it
// joins no room and trains nothing, it only answers `generate`.

importScripts("/app/webgpu.js"); // pyodide.js once boot() knows the server has the runtime

const BUNDLE_DIR = "/home/pyodide/bundle";
let pyodide = null;
let browser = null; // the pynode.browser module
let checks = null; // its Checks, once run
let peer = null; // its BrowserPeer, once checks passed and signaling named us
let selfId = null;
const early = []; // mesh events that came before `peer` existed, in order
let left = null; // the host removed or declined this page: it takes part in nothing more

function post(msg, transfer = []) {
  self.postMessage(msg, transfer);
}

// What Python calls: `send` gets a Uint8Array that owns its ArrayBuffer (pyodide's to_js
// copied it out of the wasm heap), so the buffer is transferred, not copied, to the page.
const stopped = new Set(); // generations the page asked to stop (ids)
const bridge = {
  stopped(id) { // asked by a generation each time it hands the event loop over
    return stopped.delete(id);
  },
  send(peerId, bytes) {
    post({ type: "send", peer: peerId, data: bytes.buffer }, [bytes.buffer]);
  },
  post(kind, json) {
    post({ type: "report", kind, fields: JSON.parse(json) });
  },
};

async function fetchBundle() {
  const response = await fetch("/bundle/pynode.zip", { cache: "no-cache" });
  if (!response.ok) throw new Error(`/bundle/pynode.zip answered ${response.status}`);
  const expected = response.headers.get("X-Content-SHA256");
  const zip = new Uint8Array(await response.arrayBuffer());
  // SubtleCrypto needs a secure context, which a LAN address over http is not: hash in Python.
  const sha256 = pyodide.runPython(
    "import hashlib\nlambda b: hashlib.sha256(b.to_py()).hexdigest()");
  const digest = sha256(zip);
  sha256.destroy();
  if (expected && digest !== expected) {
    throw new Error(`pynode bundle hashes to ${digest}, the server announced ${expected}`);
  }
  return { zip, digest };
}

// A server without the fetched runtime answers /runtime/ with 503 and the command that fixes
// it: that message, not importScripts' bare network error, is what the page shows.
async function runtimeMissing() {
  const response = await fetch("/runtime/", { cache: "no-store" });
  if (response.ok) return null;
  const body = await response.json().catch(() => ({}));
  return body.message || `the server has no Pyodide runtime (/runtime/ answered ${response.status})`;
}

async function boot(flags) {
  post({ type: "state", state: "booting" });
  const missing = await runtimeMissing();
  if (missing) throw new Error(missing);
  importScripts("/runtime/pyodide.js");
  pyodide = await loadPyodide({ indexURL: "/runtime/" });
  await pyodide.loadPackage("numpy", { messageCallback: () => {}, checkIntegrity: true });
  const { zip, digest } = await fetchBundle();
  pyodide.unpackArchive(zip, "zip", { extractDir: BUNDLE_DIR });
  pyodide.runPython(`import sys\nsys.path.insert(0, ${JSON.stringify(BUNDLE_DIR)})`);
  post({ type: "state", state: "verifying", bundle: digest });
  browser = pyodide.pyimport("pynode.browser");
  const bye = browser.goodbye_bytes();
  post({ type: "goodbye", data: bye.buffer }, [bye.buffer]);
  // Awaited as a coroutine: its stack may then suspend on WebGPU's promises (JSPI).
  checks = await browser.run_checks_async(Boolean(flags.break_gate), flags.backend || null);
  const result = JSON.parse(checks.to_json());
  post({ type: "checks", ...result });
  makePeer();
}

function makePeer() {
  if (peer || left || !selfId || !checks || !checks.ready) return;
  peer = browser.BrowserPeer(bridge, selfId, checks);
  for (const [kind, id, data] of early.splice(0)) meshEvent(kind, id, data);
}

function meshEvent(kind, id, data) {
  if (!peer) {
    if (checks && !checks.ready) return; // this peer must not train: it takes part in nothing
    early.push([kind, id, data]);
    return;
  }
  if (kind === "open") peer.opened(id);
  else if (kind === "gone") peer.gone(id);
  else peer.deliver(id, data);
}

// A request of the page answered with {type: "started", id, ok, ...}: start a run or a bench.
async function lead(msg) {
  if (!peer) {
    post({ type: "started", id: msg.id, ok: false, error: "this peer is not ready to train" });
    return;
  }
  let answer;
  if (msg.type === "start") answer = await peer.start(JSON.stringify(msg.config));
  else if (msg.type === "resume") answer = await peer.resume(msg.data, msg.steps ?? null);
  else if (msg.type === "gemm") answer = await gemmCases(msg.cases);
  else if (msg.type === "steer") answer = peer.steer(JSON.stringify(msg.request));
  else answer = await peer.bench(msg.size, msg.repeats);
  post({ type: "started", id: msg.id, ...JSON.parse(answer) });
}

// Continue a prompt with a .pt's model; text streams as `report` {kind: "generated"}.
async function generate(msg) {
  if (!checks || !checks.ready) {
    post({ type: "started", id: msg.id, ok: false, error: "this page's checks did not pass" });
    return;
  }
  const request = JSON.stringify({ ...msg.request, id: msg.id });
  const answer = await browser.generate_text(checks, msg.data, request, bridge);
  post({ type: "started", id: msg.id, ...JSON.parse(answer) });
}

// GEMM cases through the page's candidate backends (tests and benchmarks): {ok, results}.
async function gemmCases(cases) {
  const results = await browser.gemm_cases(checks, JSON.stringify(cases));
  return JSON.stringify({ ok: true, results: JSON.parse(results) });
}

// What a resume of a .pt would continue, read with the resume's own checks; it starts
// nothing, so it needs no peer (only Python): {type: "started", ok, ...summary | error}.
function preview(msg) {
  const answer = browser ? browser.preview_checkpoint(msg.data, msg.steps ?? null)
    : JSON.stringify({ ok: false, error: "this tab's Python is still loading" });
  post({ type: "started", id: msg.id, ...JSON.parse(answer) });
}

// The state as a .pt file, transferred to the page without a copy: {type: "started", data}.
function checkpoint(msg) {
  const answer = peer ? peer.checkpoint() : JSON.stringify({ ok: false, error: "not ready" });
  if (typeof answer === "string") {
    post({ type: "started", id: msg.id, ...JSON.parse(answer) });
    return;
  }
  const bytes = answer.toJs();
  answer.destroy();
  post({ type: "started", id: msg.id, ok: true, data: bytes.buffer }, [bytes.buffer]);
}

self.onmessage = (event) => {
  const msg = event.data;
  if (msg.type === "boot") {
    boot(msg.flags || {}).catch((err) => post({ type: "state", state: "failed", error: String(err.message || err) }));
  } else if (msg.type === "self") {
    selfId = msg.id;
    if (checks) makePeer();
  } else if (msg.type === "open" || msg.type === "gone" || msg.type === "message") {
    meshEvent(msg.type, msg.peer, msg.data);
  } else if (msg.type === "leave") {
    left = msg.reason;
    if (peer) peer.leave(msg.reason);
  } else if (msg.type === "checkpoint") {
    checkpoint(msg);
  } else if (msg.type === "preview") {
    preview(msg);
  } else if (msg.type === "kit") {
    post({ type: "started", id: msg.id, ...JSON.parse(browser.kit_html(msg.data)) });
  } else if (msg.type === "stop") {
    for (const id of msg.ids) stopped.add(id);
  } else if (msg.type === "generate") {
    generate(msg).catch((err) => post({ type: "started", id: msg.id, ok: false, error: String(err) }));
  } else if (["start", "resume", "bench", "gemm", "steer"].includes(msg.type)) {
    lead(msg).catch((err) => post({ type: "started", id: msg.id, ok: false, error: String(err) }));
  }
};
