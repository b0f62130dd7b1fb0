// /dashboard: the native runs this server knows (GET /api/runs), redrawn every second.
import { clock } from "/static/clock.js";

const POLL_MS = 1000;
const main = document.getElementById("runs");
const badge = document.getElementById("runs-badge");
const empty = document.getElementById("runs-empty");

// A training (or waiting) rank reports every second; one silent this long has likely gone
// (a killed process says nothing), and the table says so rather than "training" forever.
const SILENT_S = 10;

function stateText(r) {
  if (["training", "waiting"].includes(r.state) && r.seen_s > SILENT_S) {
    return `silent for ${r.seen_s} s (gone?)`;
  }
  if (r.state === "waiting") return "waiting for a run (a room peer)";
  return r.state + (r.reason ? `: ${r.reason}` : "");
}

const COLUMNS = [
  ["rank", (r) => r.rank],
  ["state", stateText],
  ["step", (r) => (r.step ?? "") + (r.steps ? ` / ${r.steps}` : "")],
  ["loss", (r) => fixed(r.loss, 4)],
  ["held-out", (r) => fixed(r.heldout, 4)],
  ["runtime", (r) => r.runtime],
  ["backend", shortBackend],
  ["cores", (r) => r.cores],
  ["RAM", (r) => (r.ram ? `${(r.ram / 2 ** 30).toFixed(1)} GiB` : "")],
  ["microbatch", (r) => (r.microbatch_seconds != null ? `${(r.microbatch_seconds * 1000).toFixed(0)} ms` : "")],
  ["share", (r) => (r.share != null ? `${(100 * r.share).toFixed(0)} %` : "")],
  ["tokens/s", (r) => fixed(r.tokens_per_s, 0)],
  ["sent", (r) => megabytes(r.bytes_sent)],
  ["received", (r) => megabytes(r.bytes_received)],
  ["hash", (r) => r.hash],
  ["seen", (r) => `${r.seen_s} s ago`],
];

// A rank's GEMM backend and kernels in a few words ("blas_float · numba"); the whole
// report ("blas_float (torch on 9 shapes: faster there, measured) kernels numba") is the
// cell's title: it wrapped to five lines in the table.
function shortBackend(r) {
  if (!r.backend) return "";
  const kernels = /kernels:? (\w+)/.exec(r.backend);
  // its first words: before " (", ";" or " kernels" ("blas_float kernels numba" read
  // "blas_float kernels numba · numba")
  const name = r.backend.split(" (")[0].split(";")[0].split(" kernels")[0].trim();
  return name + (kernels ? ` · ${kernels[1]}` : "");
}

function fixed(value, digits) {
  return value == null ? "" : Number(value).toFixed(digits);
}

function megabytes(value) {
  return value == null ? "" : `${(value / 1e6).toFixed(2)} MB`;
}

function cell(tag, text) {
  const node = document.createElement(tag);
  node.textContent = text ?? "";
  return node;
}

const shown = new Map(); // run id -> {section, chart, size}

function rankTable(run) {
  // a run that measures no held-out loss (no --eval-every) has no such column
  const columns = COLUMNS.filter(([name]) => name !== "held-out" ||
    run.ranks.some((r) => r.heldout != null));
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  columns.forEach(([name]) => head.appendChild(cell("th", name)));
  const body = table.createTBody();
  for (const rank of run.ranks) {
    const row = body.insertRow();
    row.className = `rank state-${rank.state}`;
    columns.forEach(([name, value]) => {
      const td = row.appendChild(cell("td", value(rank)));
      td.dataset.col = name;
      if (name === "backend" && rank.backend) td.title = rank.backend;
    });
  }
  return table;
}

// Loss and held-out loss per step (uPlot, served by this server), redrawn in place.
// Whole steps only on the step axis (uPlot would tick 1.25, 1.5, ... in a short run).
const STEP_TICKS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];
function chartData(run) {
  return [run.points.map((p) => p[0]), run.points.map((p) => p[1]), run.points.map((p) => p[2])];
}

function drawRun(run) {
  let entry = shown.get(run.run);
  if (!entry) {
    const section = document.createElement("section");
    section.className = "run";
    section.id = `run-${run.run}`; // the address a run prints: /dashboard#run-ID
    section.dataset.run = run.run;
    section.append(cell("h2", ""), cell("p", ""), document.createElement("div"),
      document.createElement("div"));
    section.children[1].className = "run-line";
    section.children[3].className = "run-chart";
    main.appendChild(section);
    // when the run registered here, fixed once (its age comes rounded, after a fetch)
    entry = { section, chart: null, size: -1, started: new Date(Date.now() - run.age_s * 1000) };
    shown.set(run.run, entry);
  }
  const [title, line, tableBox, chartBox] = entry.section.children;
  const last = run.points[run.points.length - 1];
  title.textContent = `${run.name || run.command || "run"} (${run.run})`;
  // when it registered, and the step its curve starts at where that is not 1 (a resume):
  // two cards of one command on one machine told apart
  const first = run.points[0];
  line.textContent = `${run.command} · ${run.world} rank${run.world === 1 ? "" : "s"} · ` +
    `started ${clock(entry.started)} · ` +
    (last ? `loss ${last[1].toFixed(4)} at step ${last[0]}` : "no step yet") +
    (first && first[0] > 1 ? ` (from step ${first[0]})` : "");
  tableBox.replaceChildren(rankTable(run));
  if (!window.uPlot) { // as the page says it: which command gets the chart library
    chartBox.textContent = "The chart library is missing on this server: run " +
      "`python -m server.chartlib fetch` there (the table above lists the ranks).";
    return;
  }
  if (run.points.length === entry.size) return;
  entry.size = run.points.length;
  if (!entry.chart) {
    entry.chart = new window.uPlot({
      width: Math.max(300, chartBox.clientWidth || 600), height: 240, // as the page's chart
      scales: { x: { time: false } },
      // ticks at most 20 px apart: one "4" was the only label of a curve from 5.5 to 2.5
      axes: [{ label: "step", incrs: STEP_TICKS }, { label: "loss", space: 20 }],
      series: [{ label: "step" }, { label: "loss", stroke: "#2a6f4f", width: 1.5, spanGaps: true },
        { label: "held-out", stroke: "#b45309", width: 0, spanGaps: true,
          points: { show: true, size: 7, fill: "#b45309" } }],
    }, chartData(run), chartBox);
  } else {
    entry.chart.setData(chartData(run));
  }
}

let scrolled = false; // to the run of the address's #run-ID, once

async function refresh() {
  try {
    const reply = await fetch("/api/runs", { cache: "no-store" });
    const { runs } = await reply.json();
    const known = new Set(runs.map((run) => run.run));
    for (const [id, entry] of shown) {
      if (!known.has(id)) {
        entry.chart?.destroy();
        entry.section.remove();
        shown.delete(id);
      }
    }
    runs.forEach(drawRun);
    // in the server's order, newest first (a run that registered later was added below);
    // moved only when that order changed, so the charts stay where they are
    const wanted = runs.map((run) => shown.get(run.run).section);
    const current = [...main.querySelectorAll("section.run")];
    if (wanted.some((section, i) => section !== current[i])) main.append(...wanted);
    // the run the address names, once it is drawn (the browser looked for it at load,
    // before any run was)
    if (!scrolled && location.hash.startsWith("#run-")) {
      const named = document.getElementById(location.hash.slice(1));
      if (named) {
        scrolled = true;
        named.scrollIntoView();
        named.classList.add("named");
      }
    }
    empty.hidden = runs.length > 0;
    badge.textContent = `${runs.length} run${runs.length === 1 ? "" : "s"}`;
  } catch (error) {
    badge.textContent = `cannot reach the server: ${error.message}`;
  }
  setTimeout(refresh, POLL_MS);
}

refresh();
