// The join page: renders one PageNode (pyodide_app/node.js) and exposes `window.daisychain`.
//
//   /                 joins the automatic room of this network
//   /?create=1        makes a private room; this page is its host (the URL becomes ?room=CODE)
//   /?room=CODE       asks to join a private room; its host approves
//   &break_gate=1     test hook: corrupt the GEMM backends so the exact gate fails
//   &backend=NAME     force a GEMM backend (e.g. webgpu); it must pass its exact gate
//   &approval_wait=S  give up waiting for the host's approval after S seconds (default 300)

import { PageGenerator } from "/app/generate.js";
import { PageNode, STEERABLE } from "/app/node.js";
import { clock } from "/static/clock.js";
import { TAB_MEMORY_BUDGET, memoryBytes, paramCount, sizeText, stepSeconds }
  from "/static/estimate.js";

const params = new URLSearchParams(location.search);
// a link pasted with a space or a line break after it was refused as no room code (a code
// in capitals reaches its room: server/rooms.py); `?room=` with no code is a bad link, not
// the automatic room
const roomCode = (params.get("room") || "").trim();
const target = params.get("create") ? { create: true }
  : params.has("room") ? { room: roomCode } : {};
const node = new PageNode(target, { break_gate: params.get("break_gate") === "1",
  backend: params.get("backend"), approvalWaitS: Number(params.get("approval_wait")) || null });
const generator = new PageGenerator({ backend: params.get("backend") });
const $ = (id) => document.getElementById(id);
// A page opened at localhost shares a link that names each friend's own machine.
// (the same question as pynode.addresses.only_this_machine: localhost, *.localhost, loopback)
const LOOPBACK_PAGE = /^(localhost|.+\.localhost|127(\.\d+){3}|\[::1\])\.?$/i.test(location.hostname);
// A number field's value as the browser validated it ("1e1" is 10, as Chromium reads it;
// parseInt read 1), or NaN: empty, or not what the field takes.
const given = (text) => (String(text).trim() === "" ? NaN : Number(text));
const whole = (text) => (Number.isInteger(given(text)) ? given(text) : NaN);
const real = (text) => (Number.isFinite(given(text)) ? given(text) : NaN);
const NUMBER_FIELDS = { width: whole, layers: whole, heads: whole, seq: whole,
  microbatch_size: whole, microbatches: whole, steps: whole, lr: real, seed: whole,
  sync_every: whole, replicas: whole };
// The most steps a run (or its outer step) the page starts or steers may have, the bound of
// pynode.config.MAX_STEPS (keep the two equal): it catches a slip (1e12) before it starts,
// 10,000,000 steps being weeks of a tab at 0.1 s a step. Any other whole number stops at what a page holds exactly (a seed
// of 1e30 reached Python as a float).
const MAX_STEPS = 10_000_000;
const MOST = { steps: MAX_STEPS, sync_every: MAX_STEPS };

// A form field's label, as the page names the field in its messages.
const labelOf = (field) => field.closest("label").firstChild.textContent.trim();

// Python's reason as the page says it: no exception class before it ("ConfigError: ",
// "MemoryRefusal: ", "ResumeDisagreement: ": names a person never sees elsewhere on the
// page) and each setting by its label in `form` where Python's name differs ("lr must be in
// (0, 1)": the field says "learning rate"; "sync_every"; "tokens" of the Generate panel:
// "bytes"). A word of a flag, a path, a file name or an address stays (--seq, seq.pt,
// /data/lr/). A run's failure keeps Python's words in status(); the page shows them so.
const renames = new Map(); // form id -> [[pattern, label], ...]
function plainly(text, form = $("config-form")) {
  if (!renames.has(form.id)) {
    renames.set(form.id, [...form.querySelectorAll("label > input[type=number][name]")]
      .filter((field) => labelOf(field) !== field.name)
      .map((field) => [new RegExp(`(?<![\\w./=?&#:-])${field.name}(?![\\w-]|[./=]\\w)`, "g"),
        labelOf(field)]));
  }
  let said = text.replace(/\b[A-Z][a-z]+(?:[A-Z][a-z]+)+: /g, "");
  for (const [pattern, label] of renames.get(form.id)) said = said.replace(pattern, label);
  return said;
}

// Why `text`, the field `label` of run setting `name`, holds no value for it (as
// `parse` reads it), in the page's words, or null.
function numberProblem(name, label, text, parse) {
  const value = parse(text);
  if (Number.isNaN(value)) {
    return `${label} must be ${parse === whole ? "a whole number" : "a number"}, got "${text}"`;
  }
  const most = parse === whole ? MOST[name] ?? Number.MAX_SAFE_INTEGER : Infinity;
  return value > most ? `${label} must be at most ${most.toLocaleString("en")}, got "${text}"`
    : null;
}
// A per-step run's config leaves out the fields of --sync-every (pynode/config.py to_json).
const OUTER_DEFAULTS = { sync_every: 1, replicas: 1, outer_lr: 0.7, outer_momentum: 0.9 };
const FORM_FIELDS = ["task", ...Object.keys(NUMBER_FIELDS), "data"]; // data_file: not a setting
// Run settings the form has no field for, named in the line above the form.
const OTHER_FIELDS = { warmup: "warm-up", weight_decay: "weight decay", clip: "clip",
  frac_bits: "fraction bits" };
// A slider beside each of these fields: [min, max, step]; the number field stays exact.
const SLIDERS = { width: [8, 512, 8], layers: [1, 12, 1], heads: [1, 16, 1], seq: [8, 512, 8],
  microbatch_size: [1, 64, 1], microbatches: [1, 64, 1], steps: [1, 5000, 1],
  lr: [0.0001, 0.02, 0.0001] };
let filledRun = null; // the run, and its changes, whose config the form shows
// True from a click on Start until that start (and its upload) is settled: one start
// at a time, whatever renders in between.
let starting = false;
let dismissedError = null; // "at text" of the error the user dismissed from the top

window.daisychain = {
  status: () => node.status(),
  start: (config) => node.start(config),
  steer: (request) => node.steer(request),
  benchAllreduce: (size, repeats) => node.benchAllreduce(size, repeats),
  gemm: (cases) => node.gemm(cases),
  checkpoint: () => node.checkpoint(),
  resume: (data, steps = null) => node.resume(data, steps),
  // what resume(data, steps) would continue, as "Resume from a checkpoint" shows it first;
  // starts nothing
  previewResume: (data, steps = null) => node.previewCheckpoint(data, steps),
  // {prompt, tokens, temperature, top_k, seed}, from `data` (.pt bytes) or this page's state;
  // `control.stopped = true` (now or later) ends it where it is, as the panel's Stop does
  generate: (request, data = null, control = null) => generate(request, data, () => {}, control),
  bootGenerator: () => generator.boot().then(() => true),
  routes: () => node.routes(),
  approve: (peerId) => node.approve(peerId),
  deny: (peerId) => node.deny(peerId),
  remove: (peerId) => node.remove(peerId),
};

const escape = (text) => String(text ?? "").replace(/[&<>"']/g,
  (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
// A hash's first 16 hex digits, as every line of the command line and the dashboard shows
// it (the whole one on hover): a page showed 8, 12 and 16 in different places
const short = (hash, digits = 16) => (hash
  ? `<code title="${escape(hash)}">${escape(hash.slice(0, digits))}</code>` : "–");
const fmtLoss = (loss) => (Number.isFinite(loss) ? loss.toFixed(4) : "–");

// A UI action's delay between the input event and the end of its handler: the page must
// answer within 100 ms even while a step computes (the compute is in the worker).
function timed(handler) {
  return (event) => {
    handler(event);
    const latency = node.state.uiLatencyMs;
    latency.push(performance.now() - event.timeStamp);
    if (latency.length > 50) latency.shift();
  };
}

node.addEventListener("joined", (e) => {
  const room = e.detail.room;
  if (room && params.get("room") !== room) {
    params.delete("create");
    params.set("room", room);
    history.replaceState(null, "", `?${params}`);
  }
});

function renderRoom(s) {
  // a page the host has not approved yet is not "ready" to anyone reading the header,
  // nor is one that left the room (gave up, removed, refused) "failed"
  const badge = s.outOfRoom ? "not in a room" // refused or removed: not "failed"
    : s.state === "ready" && s.peerId && !s.approved ? "waiting" : s.state;
  $("state-badge").textContent = badge;
  $("state-badge").className = `badge state-${badge.replaceAll(" ", "-")}`;
  // a bad link never gets a peer id: not "joining…" for good beside "not in a room"
  $("role-badge").hidden = !s.peerId && Boolean(s.roomProblem);
  $("role-badge").textContent = !s.peerId ? "joining…"
    : `${s.role}${s.outOfRoom ? ` (${s.outOfRoom})` : s.approved ? "" : " (pending)"}`;
  $("room-line").textContent = !s.peerId ? "Connecting to the server…"
    : s.private ? `Private room, you are ${s.peerId}.` : `Automatic room of this network, you are ${s.peerId}.`;
  $("share-line").hidden = !(s.private && s.role === "host");
  $("share-local").hidden = $("share-line").hidden || !LOOPBACK_PAGE;
  if (s.room) $("share-link").value = `${location.origin}/?room=${s.room}`;
  $("pending-line").hidden = !s.peerId || s.approved || Boolean(s.roomProblem);
  $("pending-peer").textContent = s.peerId || "";
  $("pending-until").textContent = s.approvalUntil ? clock(new Date(s.approvalUntil))
    : "it gives up";
  $("host-away").hidden = !s.hostAway || !s.approved || Boolean(s.roomProblem);
  $("room-problem").hidden = !s.roomProblem;
  $("room-problem").textContent = s.roomProblem || "";
  // out of the room for good: no longer "you are X" beside the reason it left
  if (s.roomProblem) {
    $("room-line").textContent = s.peerId ? `Not in a room (this page was peer ${s.peerId}).`
      : "Not in a room.";
  }
}

// The latest error, wherever it came from (the server, the worker, a run, an action), stays
// at the top of the page until it is dismissed or a newer one replaces it. Not the reason
// the page is out of the room: the banner and the room panel say it (a newcomer read the
// same sentence three times in a row).
function renderAlert(s) {
  const last = s.messages.findLast((m) => m.level === "error");
  const shown = last && `${last.at} ${last.text}` !== dismissedError &&
    last.text !== s.roomProblem ? last : null;
  $("alert").hidden = !shown;
  $("alert-text").textContent = shown ? plainly(shown.text) : "";
}

// An action's failure, next to the action's buttons and at the top (with the others), both
// at once: render() waits for the next animation frame, which a busy or hidden tab delays,
// and the top would say nothing (or an older error) while the text beside the button shows.
// Said as the page says it (plainly) in both places and in Messages. `box`: the text beside
// the action's controls (the run form's, or the steer panel's: a refused change showed
// under the run form, far from the control that made it).
function actionError(text, box = $("form-error")) {
  const said = plainly(text);
  box.textContent = said;
  box.hidden = !said;
  if (!said) return;
  node.say("error", said);
  renderAlert(node.status());
}

// The form shows the config of the run this page trains, whoever leads it, as the run has it
// now: filled in when the run starts and again at each change its leader makes, locked while
// it trains, and the start of the next run afterwards (the values used last).
function renderForm(s) {
  const form = $("config-form");
  const config = s.config; // with its leader's changes (node.status)
  // filled again as the run ends: a stopped run's steps give way to those chosen before
  const over = s.state !== "training";
  const shown = config && `${s.run} ${JSON.stringify(s.schedule)} ${over}`;
  if (config && shown !== filledRun) {
    filledRun = shown;
    for (const name of FORM_FIELDS) {
      const value = name === "data" ? (config.data === "builtin" ? "builtin"
        : config.data.includes("#sha256=") ? "upload" : "server")
        : name === "steps" && over && s.stoppedFrom !== null ? String(s.stoppedFrom)
        : String(config[name] ?? OUTER_DEFAULTS[name]);
      const field = form.elements[name];
      if (field.tagName === "SELECT" && ![...field.options].some((o) => o.value === value)) {
        field.add(new Option(value)); // a task the form does not list (module:Class)
      }
      field.value = value;
    }
  }
  renderSteeredNotes(form, config, s.config ? s.schedule : [],
    s.state !== "training" ? s.stoppedFrom : null);
  const training = s.state === "training";
  for (const name of FORM_FIELDS) form.elements[name].disabled = training;
  form.elements.data_file.disabled = training;
  // A resume is refused while this page is in a run, and where it may lead none (as Start)
  $("upload").disabled = training || !s.approved;
  $("upload").title = training ? "available when this page is not in a run"
    : s.outOfRoom ? "this page is out of the room" : !s.approved
      ? "available once the host of this room approved this page" : "";
  for (const name of Object.keys(SLIDERS)) {
    const slider = form.elements[`${name}-slider`];
    slider.disabled = training;
    if (document.activeElement !== slider) slider.value = form.elements[name].value;
  }
  $("run-note").hidden = !s.config;
  if (s.config) {
    const leader = s.leader === s.peerId ? "this page" : s.leader;
    const other = Object.entries(OTHER_FIELDS).map(([k, label]) => `${label} ${s.config[k]}`);
    const outer = outerSettings(s.config);
    if (outer) other.push(`outer lr ${outer.outer_lr}, outer momentum ${outer.outer_momentum}`);
    $("run-note").textContent = `${training ? "Training" : "Last run"}: run ${s.run}, led by ` +
      `${leader}, with the settings below (and ${other.join(", ")})` +
      (outer ? `; syncs every ${outer.sync_every} steps, ${outer.replicas} replicas.` : ".");
  }
  $("download").disabled = !s.run;
}

// Beside a field the run's leader changed: after which step, while the field still holds
// the run's value (edited for the next run, it is the person's own) and that value is the
// last change's (a resumed checkpoint's changes are history: the resume's own steps or lr
// come after them).
// `stoppedFrom`: the steps a stopped run had before its Stop (the form shows those), or null.
function renderSteeredNotes(form, config, schedule, stoppedFrom) {
  for (const name of STEERABLE) {
    const field = form.elements[name];
    const stop = name === "steps" && stoppedFrom !== null ? schedule.at(-1) : null;
    const value = stop ? stoppedFrom : config?.[name];
    const made = schedule.filter((c) => c[name] !== undefined && c !== stop);
    const changes = made.length && made.at(-1)[name] === value ? made : [];
    const steered = (changes.length > 0 || stop !== null) && field.value === String(value);
    const note = field.closest("label").querySelector(".steered");
    const said = [changes.length ? `changed after step ${changes.at(-1).step}` : null,
      stop ? `stopped at step ${stop.step}` : null].filter(Boolean);
    note.hidden = !steered;
    note.textContent = steered ? said.join("; ") : "";
    field.title = !steered ? "" : [changes.length ? "changed by the run's leader: " +
      changes.map((c) => `${c[name]} after step ${c.step}`).join(", ") : null,
    stop ? `the run was stopped at step ${stop.step}` : null].filter(Boolean).join("; ");
  }
}

// The --sync-every settings of `config` (defaults filled in), or null for a per-step run.
function outerSettings(config) {
  const outer = { ...OUTER_DEFAULTS, ...Object.fromEntries(Object.keys(OUTER_DEFAULTS)
    .filter((k) => config?.[k] !== undefined).map((k) => [k, config[k]])) };
  return outer.sync_every > 1 ? outer : null;
}

// This page's last inner step ({replica, step}) while it is inside an outer step, or null.
const innerUnderWay = (s) => (s.inner && s.inner.step > s.step ? s.inner : null);

// What a --sync-every run adds to the Training line: how it syncs, and where this page is
// inside the outer step under way (the replica it computes, its inner step).
function outerProgress(s) {
  const outer = outerSettings(s.config);
  if (!outer) return "";
  const at = innerUnderWay(s);
  const inner = at ? `; this page: replica ${at.replica + 1} of ${outer.replicas} at inner ` +
    `step ${at.step}` : "";
  return `; syncs every ${outer.sync_every} steps, ${outer.replicas} replicas${inner}`;
}

const fmtBytes = (n) => (n == null ? "–" : n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(1)} GiB`
  : `${(n / 2 ** 20).toFixed(1)} MiB`);
const fmtMB = (n) => (n == null ? "–" : `${(n / 1e6).toFixed(2)} MB`);
const fmtMs = (sec) => (sec == null ? "–" : `${(sec * 1000).toFixed(0)} ms`);
const fmtShare = (x) => (x == null ? "–" : `${(100 * x).toFixed(0)} %`);
const fmtRate = (x) => (x == null ? "–" : x.toFixed(0));
const sum = (rows, key) => {
  const known = rows.map((p) => p[key]).filter((v) => v != null);
  return known.length ? known.reduce((a, b) => a + b, 0) : null;
};

// The config's parameter count, memory per peer and step time for the pool (scaled from
// the microbatch times the peers measured in the last run), under the sliders.
// Only for the gpt task, and for a form whose numbers a run could take (width 0 made "0
// parameters, about 0.0 MiB"); a size no tab can hold is said before Start refuses it.
function renderEstimate(s) {
  const form = $("config-form");
  const cfg = {};
  for (const [name, parse] of Object.entries(NUMBER_FIELDS)) cfg[name] = parse(form.elements[name].value);
  if (form.elements.task.value !== "gpt" || Object.keys(NUMBER_FIELDS).some((name) =>
    !Number.isFinite(cfg[name]) || !form.elements[name].validity.valid)) { // no "invalid" event
    $("estimate").textContent = "";
    $("estimate").classList.remove("error");
    return;
  }
  const pool = s.peers.filter((p) => p.approved && p.connected);
  const step = stepSeconds(cfg, s.config, pool.map((p) => p.microbatch_seconds ?? 0));
  const memory = memoryBytes(cfg);
  const tooBig = memory > TAB_MEMORY_BUDGET;
  $("estimate").classList.toggle("error", tooBig);
  $("estimate").textContent = `${paramCount(cfg).toLocaleString("en")} parameters, ` +
    `about ${sizeText(memory)} per peer` + (tooBig ? `: more than a tab can hold ` +
      `(${sizeText(TAB_MEMORY_BUDGET)}), so Start will refuse it; choose a smaller width, ` +
      "layers, sequence or microbatch size." : "; " +
    (step === null ? "the step time is estimated once this pool has trained a step."
      : `about ${step < 1 ? `${(step * 1000).toFixed(0)} ms` : `${step.toFixed(1)} s`} a step ` +
        `for these ${pool.length} peer(s), ${duration(step * cfg.steps)} for the run.`));
}

function duration(seconds) {
  return seconds < 120 ? `${seconds.toFixed(0)} s` : seconds < 7200 ? `${(seconds / 60).toFixed(0)} min`
    : `${(seconds / 3600).toFixed(1)} h`;
}

function addSliders() {
  const form = $("config-form");
  for (const [name, [min, max, step]] of Object.entries(SLIDERS)) {
    const field = form.elements[name];
    const slider = Object.assign(document.createElement("input"),
      { type: "range", min, max, step, value: field.value, name: `${name}-slider` });
    slider.setAttribute("aria-label", `${name} slider`);
    // The estimate under the sliders changes with the value, not a frame later (render()
    // waits for the next animation frame: a slow or hidden tab would show stale numbers).
    const follow = (from, to) => () => {
      to.value = from.value;
      renderEstimate(node.status());
      render();
    };
    slider.addEventListener("input", timed(follow(slider, field)));
    field.addEventListener("input", follow(field, slider));
    field.after(slider);
  }
}

// Under each field a run's leader may change, the note renderSteeredNotes fills in.
function addSteeredNotes() {
  for (const name of STEERABLE) {
    const note = Object.assign(document.createElement("small"), { className: "steered hint" });
    note.hidden = true;
    $("config-form").elements[name].closest("label").append(note);
  }
}

// A table's rows kept by key, each cell rewritten only when what it shows changed. The
// peers table was rewritten whole on every frame that changed (tens a second in a run), so
// the Approve, Refuse or Remove button under a host's pointer was a new element by the
// time the button was released, and no click landed (a trial: 0 of 5).
const shownHtml = new WeakMap(); // cell -> the HTML it was last given
function patchRows(body, rows) {
  const kept = new Map();
  for (const tr of [...body.rows]) {
    if (kept.has(tr.dataset.peer)) tr.remove(); // one row a key
    else kept.set(tr.dataset.peer, tr);
  }
  rows.forEach((row, index) => {
    let tr = kept.get(row.key);
    kept.delete(row.key);
    if (!tr) {
      tr = document.createElement("tr");
      tr.dataset.peer = row.key;
    }
    if (tr.className !== row.className) tr.className = row.className;
    while (tr.cells.length > row.cells.length) tr.deleteCell(-1);
    row.cells.forEach(([className, html], i) => {
      const td = tr.cells[i] || tr.insertCell();
      if (td.className !== className) td.className = className;
      if (shownHtml.get(td) !== html) {
        td.innerHTML = html;
        shownHtml.set(td, html);
      }
    });
    if (body.rows[index] !== tr) body.insertBefore(tr, body.rows[index] || null);
  });
  for (const tr of kept.values()) tr.remove();
}

function renderPeers(s) {
  const host = s.role === "host";
  const problems = Object.values(s.linkProblems);
  $("link-problems").hidden = !problems.length;
  $("link-problems").innerHTML = problems.map((text) => `<li>${escape(text)}</li>`).join("");
  patchRows($("peers").tBodies[0], s.peers.map((p) => {
    // this page's own row says it left the room ("removed", "refused"): status().outOfRoom
    const approval = p.approval !== "approved" && p.approval !== "pending" ? escape(p.approval)
      : p.approved
        ? (host && !p.self ? `approved <button data-remove="${escape(p.id)}">Remove</button>` : "approved")
        : host
          ? `pending <button data-approve="${escape(p.id)}">Approve</button> <button data-deny="${escape(p.id)}">Refuse</button>`
          : "pending";
    const forked = p.hash && s.hash && p.step === s.step && p.hash !== s.hash ? " forked" : "";
    const gemm = p.gemm ? `${p.gemm}${p.kernels ? ` / ${p.kernels}` : ""}` : "–";
    return { key: p.id, className: `${p.self ? "self" : ""}${forked}`, cells: [
      ["", `<code class="peer-id">${escape(p.id)}</code>${p.self ? " (you)" : ""}`],
      ["", `${escape(p.role)}${p.id === s.leader ? ", leader" : ""}`], ["", approval],
      ["", escape(s.linkProblems[p.id] ? "no connection" : p.state || (p.connected ? "" : p.approved ? "not connected" : "waits for approval"))],
      ["runtime", escape(p.runtime || "–")], ["", escape(gemm)],
      ["cores", `${p.cores ?? "–"}`], ["ram", fmtBytes(p.ram)],
      ["microbatch", fmtMs(p.microbatch_seconds)], ["share", fmtShare(p.share)],
      ["tokens", fmtRate(p.tokens_per_s)], ["", fmtMB(p.bytes_sent)],
      ["", fmtMB(p.bytes_received)], ["", `${p.step}`],
      ["", fmtLoss(p.loss)], ["", short(p.hash)], ["", short(p.probe)]] };
  }));
  // The pool: what the approved, connected peers bring together.
  const pool = s.peers.filter((p) => p.approved && p.connected);
  $("pooled").innerHTML = `<td>pooled: ${pool.length} peer(s)</td><td></td><td></td><td></td>
    <td>${pool.filter((p) => p.runtime === "native").length} native, ${pool.filter((p) => p.runtime === "browser").length} browser</td>
    <td></td><td>${sum(pool, "cores") ?? "–"}</td><td>${fmtBytes(sum(pool, "ram"))}</td><td></td>
    <td>${fmtShare(sum(pool, "share"))}</td><td>${fmtRate(sum(pool, "tokens_per_s"))}</td>
    <td>${fmtMB(sum(pool, "bytes_sent"))}</td><td>${fmtMB(sum(pool, "bytes_received"))}</td>
    <td></td><td></td><td></td><td></td>`;
}

// A link's ICE candidate types in plain words, as `join` says them (pynode.cli.peer
// route_kind): "host" is ICE's word for a machine's own address, not the room's host.
function routeKind(l) {
  if (l.local === "host" && l.remote === "host") return ", direct";
  if (l.local === "relay" || l.remote === "relay") return ", relayed by the TURN server";
  return "";
}

// The link matrix: one row per pair of peers, from `s.links` when the page measures them
// ({a, b, state, rtt_ms, candidate, mbps}); until then the panel says what it will show.
function renderLinks(s) {
  const links = s.links || [];
  $("links").hidden = !links.length;
  $("links").tBodies[0].innerHTML = links.map((l) => `<tr><td>${escape(l.a)} – ${escape(l.b)}</td>
    <td>${escape(l.state)}</td><td>${l.rtt_ms == null ? "–" : `${l.rtt_ms.toFixed(1)} ms`}</td>
    <td class="route">${escape(l.candidate ? l.candidate + routeKind(l) : "–")}</td><td>${l.mbps == null ? "–" : `${l.mbps.toFixed(1)} MB/s`}</td></tr>`).join("");
}

// One line at the top: can this page train, what it waits for, or why it stopped.
function renderReadiness(s) {
  const ready = s.peers.filter((p) => p.approved && (p.self ? s.state === "ready" : p.trainable));
  let text, kind;
  if (s.state === "failed") {
    [text, kind] = [`Stopped: ${plainly(s.error)}`, "stopped"];
  } else if (s.state === "training" && s.paused) {
    [text, kind] = [`Paused after step ${s.step} of ${s.steps} by the leader.`, "waiting"];
  } else if (s.state === "training") {
    [text, kind] = [`Training: step ${s.step} of ${s.steps} with ${s.members.length} peer(s)` +
      `${outerProgress(s)}.`, "training"];
  } else if (s.state === "done" && s.stoppedFrom !== null) { // a Stop: not a finished run
    [text, kind] = [`Stopped at step ${s.step} of ${s.stoppedFrom}, state hash ` +
      `${(s.hash || "").slice(0, 16)}. Start begins a new run from step 0; to go on from ` +
      "here, download the checkpoint and resume from it.", "ready"];
  } else if (s.state === "done") {
    [text, kind] = [`Finished: step ${s.step}, state hash ${(s.hash || "").slice(0, 16)}.`, "ready"];
  } else if (s.state === "joining") {
    [text, kind] = [`Waiting to join the run of ${s.joining.leader}: admitted at its next step ` +
      "(not while it is paused).", "waiting"];
  } else if (!s.verified) {
    [text, kind] = ["Checking this tab's arithmetic…", "waiting"];
  } else if (s.roomProblem) { // a bad code, nobody approved: said in the room panel too
    [text, kind] = [`Checks passed; not in a room: ${s.roomProblem}`, "stopped"];
  } else if (!s.approved) {
    [text, kind] = ["Checks passed; waiting for the host of this room to approve this page.", "waiting"];
  } else {
    const others = s.peers.length - 1;
    text = `Checks passed; ${ready.length} peer(s) ready to train` +
      (!others ? ": waiting for other peers (or start a run alone below)."
        : ready.length < s.peers.length ? `, waiting for ${s.peers.length - ready.length} more.`
          : ".");
    // the host's own move: "waiting for 1 more" read as if the other page had to act
    const asking = s.role === "host" ? s.peers.filter((p) => !p.approved).length : 0;
    if (asking) text += ` ${asking} of them wait${asking === 1 ? "s" : ""} for your approval ` +
      "(Approve or Refuse in the Peers table).";
    kind = "ready";
  }
  $("readiness").textContent = text;
  $("readiness").className = `banner ${kind}`;
}

function renderProgress(s) {
  const training = s.state === "training" || s.state === "done";
  // What the group is doing now: a finished or paused run computes nothing.
  // A --sync-every run's step is the last synced one: say which steps are under way.
  const outer = outerSettings(s.config);
  const under = outer ? ` steps ${s.step + 1}-${Math.min(s.step + outer.sync_every, s.steps)}` +
    (innerUnderWay(s) ? `; this page at inner step ${s.inner.step}` : "") : "";
  const stopped = s.state === "done" && s.stoppedFrom !== null;
  const doing = stopped ? `stopped (the run had ${s.stoppedFrom} steps)`
    : s.state === "done" ? "finished"
    : s.paused ? `paused by the leader (${s.members.length} peer(s) waiting)`
    : `${s.members.length} peer(s) computing${under}`;
  $("progress-line").innerHTML = training
    ? `Step ${s.step} of ${s.steps}, loss ${fmtLoss(s.loss)}, state hash ${short(s.hash)},
       probe ${short(s.probe)}; ${doing}; leader ${escape(s.leader)}.`
    : escape(s.state === "failed" ? `Stopped: ${plainly(s.error)}` : "Not training.");
  $("history").tBodies[0].innerHTML = s.history.slice(-10).reverse().map((h) =>
    `<tr><td>${h.step}</td><td>${fmtLoss(h.loss)}</td><td>${short(h.hash)}</td></tr>`).join("");
  drawLoss(s.history);
  const leading = s.state === "training" && s.leader === s.peerId;
  // The leader steers; everyone else (and the leader once the run ended) sees the changes
  // made and may download them, without the leader's controls.
  $("steer").hidden = !leading && !s.schedule.length;
  $("steer-intro").hidden = $("steer-controls").hidden = !leading;
  $("steer-record").hidden = leading;
  // the changes themselves, in words (a resumed checkpoint's first): the download saves them
  $("steer-changes").hidden = !s.schedule.length;
  $("steer-changes").textContent = s.schedule.length
    ? `${s.schedule.map(changeText).join("; ")}.` : "";
  for (const id of ["pause", "resume-run", "stop", "apply-change", "steer-lr", "steer-steps"]) {
    $(id).disabled = !leading;
  }
  $("pause").disabled ||= s.paused;
  $("resume-run").disabled ||= !s.paused;
  // A verified page may lead again after a run ended, even one that failed (fork, lost leader).
  $("start").disabled = starting || !s.verified || !s.approved || s.state === "training"
    || s.state === "joining";
}

// The loss chart (uPlot, fetched at set-up and served by this server): the training loss of
// every step and the held-out loss where measured; axes, hover values, a log scale.
let chart = null;
// Whole steps only on the step axis (uPlot would tick 1.25, 1.5, ... in a short run).
const STEP_TICKS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];
let chartLog = false;
let chartSize = -1;

function chartData(history) {
  return [history.map((h) => h.step), history.map((h) => (Number.isFinite(h.loss) ? h.loss : null)),
    history.map((h) => (Number.isFinite(h.heldout) ? h.heldout : null))];
}

function drawLoss(history) {
  const box = $("loss-chart");
  if (!window.uPlot) {
    $("chart-note").textContent = "The chart library is missing on this server: run " +
      "`python -m server.chartlib fetch` there (the table below lists the steps).";
    return;
  }
  const logScale = $("log-scale").checked;
  if (!chart || chartLog !== logScale) {
    if (chart) chart.destroy();
    chartLog = logScale;
    chartSize = -1;
    chart = new window.uPlot({
      width: Math.max(300, box.clientWidth || 600), height: 240,
      scales: { x: { time: false }, y: logScale ? { distr: 3 } : {} },
      axes: [{ label: "step", incrs: STEP_TICKS }, { label: "loss", space: 20 }],
      series: [{ label: "step" },
        { label: "loss", stroke: "#2a6f4f", width: 1.5, spanGaps: true },
        { label: "held-out", stroke: "#b45309", width: 0, spanGaps: true,
          points: { show: true, size: 7, fill: "#b45309" } }],
    }, chartData(history), box);
    chartSize = history.length;
    return;
  }
  if (history.length !== chartSize) {
    chartSize = history.length;
    chart.setData(chartData(history));
  }
}

function renderChecks(s) {
  const failed = s.checks.filter((r) => !r.passed && !r.skipped);
  $("checks-line").textContent = !s.checks.length ? (s.state === "failed" ? plainly(s.error) : "Loading Python…")
    : failed.length ? `FAILED: ${failed.map((r) => `${r.check} ${r.result}`).join("; ")}`
      : `Checks passed: units == lookup tables == integer ops == GEMM backend; computing with ${s.gemm}, kernels ${s.kernels}.`;
  $("checks-line").className = failed.length ? "error" : "";
  $("checks").tBodies[0].innerHTML = s.checks.map((r) =>
    `<tr class="${r.passed || r.skipped ? "" : "error"}${(r.backend === s.gemm || r.backend === s.kernels) && r.passed ? " in-use" : ""}"><td>${escape(r.check)}</td><td>${escape(r.domain)}</td>
      <td>${escape(r.result)}</td><td>${escape(r.backend)}</td><td>${(r.seconds * 1000).toFixed(1)}</td></tr>`).join("");
}

function renderMessages(s) {
  $("messages").innerHTML = s.messages.slice(-30).reverse().map((m) =>
    `<li class="${escape(m.level)}"><time>${clock(new Date(m.at))}</time> ${escape(plainly(m.text))}</li>`).join("");
}

// A run that starts on this page, whoever leads it (this page's Start too), settles a Start
// of this page that was refused before it: "could not start: ..." stayed beside the button
// and at the top through a run another peer started (a newcomer trial).
let settledRun = null;
function settleStartRefusal(s) {
  if (!s.run || s.run === settledRun || s.state !== "training") return;
  settledRun = s.run;
  if ($("form-error").textContent.startsWith("could not start")) actionError("");
  steerError(""); // a refused change of the run before is about that run
  const last = s.messages.findLast((m) => m.level === "error");
  if (last?.text.startsWith("could not start")) dismissedError = `${last.at} ${last.text}`;
}

let scheduled = false;
function render() {
  if (scheduled) return;
  scheduled = true;
  requestAnimationFrame(() => {
    scheduled = false;
    const s = node.status();
    settleStartRefusal(s);
    renderAlert(s);
    renderRoom(s);
    renderReadiness(s);
    renderPeers(s);
    renderLinks(s);
    renderForm(s);
    renderResumePreview(s);
    renderEstimate(s);
    renderProgress(s);
    renderChecks(s);
    renderMessages(s);
  });
}

node.addEventListener("change", render);

$("peers").addEventListener("click", timed((event) => {
  const approve = event.target.dataset.approve;
  const deny = event.target.dataset.deny;
  const remove = event.target.dataset.remove;
  try {
    if (approve) node.approve(approve);
    if (deny) node.deny(deny);
    if (remove) node.remove(remove);
  } catch (err) {
    node.say("error", err.message);
  }
}));

// The browser's own check of a field (its bubble) stops a submit: the refusal of the try
// before is about other values by then, beside the buttons and at the top alike.
function settleRefusal(box) {
  const text = box.textContent;
  box.textContent = "";
  box.hidden = true;
  const last = node.status().messages.findLast((m) => m.level === "error");
  if (text && last?.text === text) dismissedError = `${last.at} ${last.text}`;
  renderAlert(node.status());
}
$("config-form").addEventListener("invalid", () => settleRefusal($("form-error")), true);
$("steer").addEventListener("invalid", () => settleRefusal($("steer-error")), true);
$("generate-form").addEventListener("invalid", () => settleRefusal($("generate-error")), true);

$("config-form").addEventListener("submit", timed((event) => {
  event.preventDefault();
  if (starting) return;
  const data = new FormData(event.target);
  const config = { task: data.get("task") };
  // The server's /data serves the same bytes to every peer that asks (pynode.datasource).
  if (data.get("data") === "server") config.data = location.origin;
  const serverText = event.target.elements.data.querySelector("option[value=server]");
  if (data.get("data") === "server" && serverText.dataset.unavailable) {
    actionError(`could not start: this server cannot serve its text now ` +
      `(${serverText.dataset.unavailable}): choose the built-in corpus or a file you upload`);
    return;
  }
  for (const [name, parse] of Object.entries(NUMBER_FIELDS)) config[name] = parse(data.get(name));
  // named by its label, with what it holds (the worker would say "got None")
  const [bad, problem] = Object.entries(NUMBER_FIELDS).map(([name, parse]) => [name,
    numberProblem(name, labelOf(event.target.elements[name]), data.get(name), parse)])
    .find(([, said]) => said) ?? [];
  if (bad) {
    actionError(`could not start: ${problem}`);
    event.target.elements[bad].focus();
    return;
  }
  starting = true;
  $("start").disabled = true;
  actionError("");
  (async () => {
    if (data.get("data") === "upload") config.data = await uploadText($("data-file").files[0]);
    return node.start(config);
  })().catch((err) => actionError(`could not start: ${err.message}`)) // a start settles
    .finally(() => { starting = false; render(); }); // the one refused before it: render
}));

$("log-scale").addEventListener("change", timed(() => render()));

const steerError = (text) => actionError(text, $("steer-error"));
// A change of both fields is applied whole or not at all: said, so that the valid one is
// not thought applied (a trial: a learning rate dropped beside refused steps, unsaid).
const notApplied = (both) => `not applied${both ? " (neither field: the change is one)" : ""}: `;

function steer(request) {
  steerError("");
  node.steer(request).then(() => { // a change that applies settles the one refused before it
    const last = node.status().messages.findLast((m) => m.level === "error");
    if (/^(change )?not applied/.test(last?.text ?? "")) dismissedError = `${last.at} ${last.text}`;
    render();
  }, (err) => steerError(notApplied("lr" in request && "steps" in request) + err.message));
}

$("pause").addEventListener("click", timed(() => steer({ pause: true })));
$("resume-run").addEventListener("click", timed(() => steer({ pause: false })));
$("stop").addEventListener("click", timed(() => steer({ stop: true })));
$("steer").addEventListener("submit", timed((event) => {
  event.preventDefault();
  const request = {};
  if ($("steer-lr").value) request.lr = given($("steer-lr").value);
  if ($("steer-steps").value) {
    const problem = numberProblem("steps", "steps", $("steer-steps").value, whole);
    if (problem) {
      steerError(notApplied(Boolean($("steer-lr").value)) + problem);
      return;
    }
    request.steps = given($("steer-steps").value);
  }
  if (!Object.keys(request).length) { // it did nothing and said nothing
    steerError("not applied: give a learning rate or a number of steps to change");
    return;
  }
  steer(request);
}));

// The run's changes as `train --schedule FILE` reads them.
$("download-schedule").addEventListener("click", () => {
  const url = URL.createObjectURL(new Blob([JSON.stringify(node.state.schedule)],
    { type: "application/json" }));
  const link = document.createElement("a");
  link.href = url;
  link.download = `daisychain-schedule-${node.state.run}.json`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
});

// The chosen file goes to the server, which keeps its text under its sha256 and serves it
// to the room; every peer checks the digest and slices it as `train --data FILE` does.
async function uploadText(file) {
  if (!file) throw new Error("choose the text or parquet file to upload");
  const reply = await fetch("/api/uploads", { method: "POST", body: file,
    headers: { "Content-Type": "application/octet-stream" } });
  const answer = await reply.json().catch(() => ({ message: reply.status === 413
    ? "the file is larger than this server accepts (max_upload_bytes)" : `HTTP ${reply.status}` }));
  const size = reply.status === 413 ? ` (${file.name} holds ${file.size.toLocaleString("en")} bytes)` : "";
  if (!reply.ok) throw new Error(`the server refused ${file.name}: ${answer.message}${size}`);
  node.say("info", `uploaded ${file.name}: text sha256 ${answer.sha256.slice(0, 16)}…`);
  return answer.data;
}

$("alert-close").addEventListener("click", timed(() => {
  const last = node.state.messages.findLast((m) => m.level === "error");
  dismissedError = last ? `${last.at} ${last.text}` : null;
  render();
}));

$("toggle-checks").addEventListener("click", timed(() => {
  const table = $("checks");
  table.hidden = !table.hidden;
  $("toggle-checks").textContent = table.hidden ? "Show" : "Hide";
}));

// navigator.clipboard exists on a secure origin only (https, localhost): a page opened at
// http://LAN-ADDRESS, as docs/QUICKSTART.md has friends do, copied nothing and said nothing.
// There the selected link is copied the old way; the button says what happened.
$("copy-link").addEventListener("click", timed(() => {
  const field = $("share-link");
  const button = $("copy-link");
  field.select();
  const oldWay = () => {
    try {
      return document.execCommand("copy");
    } catch {
      return false;
    }
  };
  const copied = navigator.clipboard
    ? navigator.clipboard.writeText(field.value).then(() => true, oldWay)
    : Promise.resolve(oldWay());
  copied.then((ok) => {
    button.textContent = ok ? "Copied" : "Press Ctrl+C";
    setTimeout(() => { button.textContent = "Copy"; }, 2500);
  });
}));

$("new-room").addEventListener("click", timed(() => {
  location.href = "/?create=1";
}));

$("download").addEventListener("click", async () => {
  try {
    const url = URL.createObjectURL(new Blob([await node.checkpoint()]));
    const link = document.createElement("a");
    link.href = url;
    link.download = `daisychain-step${node.state.step}.pt`;
    link.click();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  } catch (err) {
    actionError(`no checkpoint to download: ${err.message}`);
  }
});

// "Resume from a checkpoint": choosing a .pt shows what it is (read by the worker with the
// resume's own checks) and starts nothing; only "Resume this run" resumes it. A person who
// picked the wrong file had started a run before seeing which.
let resumeChoice = null; // {file, steps, stepsProblem, summary} of the preview shown
let previewsAsked = 0; // an answer to an older preview (another file, other steps) is dropped
let previewing = false; // the latest preview is not back: its button waits for it
let resuming = false; // from "Resume this run" until that resume is settled

// The form's steps for a resume (they count only where the file's run is finished) and why
// they cannot be its end, or null.
function resumeSteps() {
  const text = $("config-form").elements.steps.value;
  const problem = whole(text) > MAX_STEPS ? numberProblem("steps", "steps", text, whole) : null;
  return { steps: !problem && whole(text) >= 1 ? whole(text) : null, problem };
}

// A resume that reads or starts settles the "checkpoint refused" of the file before it at the
// top, as a start settles a failed start.
function settleResumeRefusal() {
  const last = node.status().messages.findLast((m) => m.level === "error");
  if (last?.text.startsWith("checkpoint refused")) dismissedError = `${last.at} ${last.text}`;
}

async function previewResume(file) {
  const asked = ++previewsAsked;
  if (resumeChoice?.file !== file) resumeChoice = null; // another file's rows go at once
  previewing = Boolean(file);
  actionError("");
  render();
  if (!file) return;
  const { steps, problem } = resumeSteps();
  try {
    const summary = await node.previewCheckpoint(await file.arrayBuffer(), steps);
    if (asked !== previewsAsked) return;
    resumeChoice = { file, steps, stepsProblem: problem, summary };
    settleResumeRefusal();
  } catch (err) {
    if (asked !== previewsAsked) return;
    resumeChoice = null;
    $("upload").value = ""; // nothing to resume: the same file may be chosen again
    actionError(`checkpoint refused: ${file.name} ${err.message.startsWith("CheckpointError")
      ? "is not a valid DaisyChain checkpoint" : "cannot be resumed"} (${err.message})`);
  } finally {
    if (asked === previewsAsked) previewing = false;
    render();
  }
}

function closeResumePreview() {
  previewsAsked++;
  resumeChoice = null;
  previewing = false;
  $("upload").value = "";
  render();
}

$("upload").addEventListener("change", (event) => previewResume(event.target.files[0]));
// the preview says where the resume ends, which the form's steps decide for a finished run
$("config-form").elements.steps.addEventListener("input", () => {
  if (resumeChoice && !resuming) previewResume(resumeChoice.file);
});
$("resume-cancel").addEventListener("click", timed(() => closeResumePreview()));
$("resume-confirm").addEventListener("click", timed(() => {
  const choice = resumeChoice;
  if (!choice || resuming || previewing) return;
  resuming = true;
  actionError("");
  render();
  (async () => node.resume(await choice.file.arrayBuffer(), choice.steps))().then((answer) => {
    settleResumeRefusal();
    node.say("info", `resumed ${choice.file.name} at step ${answer.step} with ` +
      `${answer.ranks.length} peer(s)`);
    closeResumePreview();
  }, (err) => actionError(`checkpoint refused: ${err.message}`))
    .finally(() => { resuming = false; render(); });
}));

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

// One change of a run (the steer panel's list, a checkpoint's preview).
function changeText(change) {
  if (change.steps === change.step) return `stopped at step ${change.step}`;
  const parts = [];
  if (change.lr !== undefined) parts.push(`learning rate ${change.lr}`);
  if (change.steps !== undefined) parts.push(`steps ${change.steps}`);
  return `${parts.join(", ")} after step ${change.step}`;
}

// The preview's rows: [field, label, html] of what the chosen checkpoint holds and where its
// resume would go; the loss where this page trained that very state (a .pt holds none).
function previewRows(choice, s) {
  const c = choice.summary;
  const outer = outerSettings(c);
  const text = c.data === "builtin" ? "the built-in corpus"
    : String(c.data).includes("#sha256=") ? "an uploaded file" : c.data;
  const known = s.history.find((h) => h.hash === c.hash && Number.isFinite(h.loss));
  const resume = c.refused ? (choice.stepsProblem ?? c.refused)
    : c.steps > c.run_steps ? `continues to step ${c.steps}, the form's steps (its own run ` +
        `ended at step ${c.run_steps})`
      : `continues to step ${c.steps}, where its run ends`;
  return [
    ["model", "model", escape(`${c.task}: width ${c.width}, ${plural(c.layers, "layer")}, ` +
      `${plural(c.heads, "head")}, sequence ${c.seq} (${c.parameters.toLocaleString("en")} ` +
      `parameters)${outer ? `; syncs every ${outer.sync_every} steps, ${outer.replicas} ` +
        "replicas" : ""}`)],
    ["step", "step", escape(`saved at step ${c.step} of its run's ${c.run_steps} steps`)],
    ["settings", "settings", escape(`learning rate ${c.lr}, text: ${text}`)],
    ["loss", "loss", known ? escape(`${fmtLoss(known.loss)} (this page trained that step)`)
      : "not in the file (a checkpoint holds no loss; the resumed run reports its next step's)"],
    ["hash", "state hash", short(c.hash)],
    ["changes", "changes", escape(c.schedule.length ? c.schedule.map(changeText).join("; ")
      : "none")],
    ["resume", "resume", c.refused ? `<span class="error">${escape(resume)}</span>`
      : escape(resume)],
  ];
}

let shownChoice = null; // the preview whose rows the page shows
function renderResumePreview(s) {
  const choice = resumeChoice;
  $("resume-preview").hidden = !choice;
  if (!choice) return;
  if (choice !== shownChoice) {
    shownChoice = choice;
    $("resume-name").textContent = choice.file.name;
    $("resume-rows").innerHTML = previewRows(choice, s).map(([field, label, html]) =>
      `<tr data-field="${field}"><th>${label}</th><td>${html}</td></tr>`).join("");
  }
  const training = s.state === "training";
  const button = $("resume-confirm");
  button.disabled = training || !s.approved || previewing || resuming
    || Boolean(choice.summary.refused);
  button.title = training ? "available when this page is not in a run"
    : !s.approved ? $("upload").title : choice.summary.refused ? "nothing to train (see above)"
      : "";
}

// The model of this page's state now (a copy, as a download) or of `data`: text streams to
// `onText`; resolves to {bytes, text, step, ...} (generate.js).
async function generate(request, data = null, onText = () => {}, control = null) {
  return generator.generate(data ?? await node.checkpoint(), request, onText, control);
}
let generating = null; // the panel's generation under way: {stopped}

// The generation worker boots (seconds) as soon as someone means to use it.
$("generate-form").addEventListener("focusin", () => generator.boot().catch(() => {}));

function showGenerateError(text) {
  $("generate-error").textContent = plainly(text, $("generate-form"));
  $("generate-error").hidden = !text;
}

// The .pt the generate panel works from: the chosen file's, or this page's state (null).
async function generateSource() {
  if ($("generate-form").elements.source.value !== "file") {
    // before any run, in words and with the ways on ("RoomError: no run has started on
    // this peer yet: no state to save or to generate from")
    if (!node.state.run) {
      throw new Error("this page has no model yet: start a run (or keep the page open " +
        "until one starts in this room), or choose a .pt file under model");
    }
    return null;
  }
  const file = $("generate-file").files[0];
  if (!file) throw new Error("choose a .pt file to generate from");
  return file.arrayBuffer();
}

$("download-kit").addEventListener("click", async () => {
  showGenerateError("");
  try {
    const html = await generator.kit((await generateSource()) ?? await node.checkpoint());
    const url = URL.createObjectURL(new Blob([html], { type: "text/html" }));
    const link = document.createElement("a");
    link.href = url;
    link.download = "daisychain-kit.html";
    link.click();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  } catch (err) {
    showGenerateError(`no inference kit: ${err.message}`);
  }
});

$("generate-form").addEventListener("submit", timed((event) => {
  event.preventDefault();
  const form = new FormData(event.target);
  // the numbers the fields show, refused by pynode's Sampling in its words if they do not do;
  // an empty field is named here (JSON sends it as null: Sampling said "got None")
  const fields = { tokens: whole, temperature: real, top_k: whole, seed: whole };
  const empty = Object.keys(fields).find((name) => form.get(name).trim() === "");
  const problem = form.get("prompt") === ""
    ? "the prompt is empty: write at least one character for the model to continue"
    : empty ? numberProblem(empty, labelOf(event.target.elements[empty]), "", fields[empty])
      : null;
  if (problem) {
    showGenerateError(`could not generate: ${problem}`);
    return;
  }
  const request = { prompt: form.get("prompt"), tokens: given(form.get("tokens")),
    temperature: given(form.get("temperature")), top_k: given(form.get("top_k")),
    seed: given(form.get("seed")) };
  const output = $("generate-output");
  showGenerateError("");
  output.textContent = request.prompt;
  $("generate").disabled = true;
  $("generate-stop").disabled = false;
  $("generate-line").textContent = "Generating…";
  const control = generating = { stopped: false };
  (async () => {
    const data = await generateSource();
    const done = await generate(request, data, (piece) => { output.textContent += piece; },
      control);
    output.textContent = request.prompt + done.text;
    $("generate-line").textContent = `${done.bytes.length / 2} bytes from the model at step ` +
      `${done.step} in ${done.seconds.toFixed(1)} s (context ${done.context} bytes` +
      `${done.prompt_bytes > done.context ? ": it saw the prompt's last ones" : ""})` +
      `${done.stopped ? ", stopped" : ""}.`;
  })().catch((err) => {
    showGenerateError(`could not generate: ${err.message}`);
    if (output.textContent === request.prompt) output.textContent = ""; // nothing generated
    $("generate-line").textContent = "";
  }).finally(() => {
    generating = null;
    $("generate").disabled = false;
    $("generate-stop").disabled = true;
  });
}));

// Ends the generation where it is: its bytes so far stay, as a finished one's (one not yet
// in the generation worker, its state still being copied out, is stopped as it arrives).
$("generate-stop").addEventListener("click", timed(() => {
  if (generating) generating.stopped = true;
  generator.stop();
}));

// Whether this server can serve its training text now (a run on "this server's /data"
// stopped at its first step where it could not, in words of flags the page has not): the
// option says so. Asked at boot and each time the choice is opened, with the built-in
// fallback allowed: its `reason` says what a run's fallback=0 request would answer with a
// 503, and a 503 here was an error in the console of every page of a server without text.
async function probeServerText() {
  const option = $("config-form").elements.data.querySelector("option[value=server]");
  let why = "";
  try {
    const reply = await fetch("/data?seed=1&step=1&index=0&bytes=64", { cache: "no-store" });
    const body = await reply.json().catch(() => ({}));
    if (!reply.ok) why = body.message || `HTTP ${reply.status}`;
    else if (body.source !== "parquet") why = `its shards are unavailable: ${body.reason || "none"}`;
  } catch {
    return; // the server is away: the page says so elsewhere
  }
  option.textContent = why ? "this server's /data (unavailable now)" : "this server's /data";
  option.title = why;
  if (why) option.dataset.unavailable = why;
  else delete option.dataset.unavailable;
}
$("config-form").elements.data.addEventListener("focus", () => probeServerText());

// A page that trains a run alone holds its only copy: closing or reloading it ends the run
// (a reload came back "ready", the run and its state gone without a word). The browser
// asks first. A run of several peers goes on without this page, which may join it again.
window.addEventListener("beforeunload", (event) => {
  const s = node.state;
  if (s.state === "training" && s.members.length <= 1) {
    event.preventDefault();
    event.returnValue = true; // what older Chromium asks for
  }
});

window.addEventListener("pagehide", () => {
  node.sayGoodbye();
  node.mesh?.close();
  node.signaling.close();
});
addSliders();
// any other field of the form (the task: the estimate went on showing the gpt's figures
// for mlp) changes the estimate at once too: as it is edited, not as it loses focus (on
// "change", the estimate's new height moved Start from under a click that blurred a field)
$("config-form").addEventListener("input", () => renderEstimate(node.status()));
addSteeredNotes();
probeServerText();
node.boot();
render();
