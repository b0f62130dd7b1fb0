// /dashboard: the native runs this server knows (GET /api/runs), redrawn every second.
const POLL_MS = 1000;
const main = document.getElementById("runs");
const badge = document.getElementById("runs-badge");
const empty = document.getElementById("runs-empty");

const COLUMNS = [
  ["rank", (r) => r.rank],
  ["state", (r) => r.state + (r.reason ? `: ${r.reason}` : "")],
  ["step", (r) => (r.step ?? "") + (r.steps ? ` / ${r.steps}` : "")],
  ["loss", (r) => fixed(r.loss, 4)],
  ["held-out", (r) => fixed(r.heldout, 4)],
  ["runtime", (r) => r.runtime],
  ["backend", (r) => r.backend],
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

function runSection(run) {
  const section = document.createElement("section");
  section.className = "run";
  section.dataset.run = run.run;
  const last = run.points[run.points.length - 1];
  const title = cell("h2", `${run.name || run.command || "run"} (${run.run})`);
  const line = cell("p", `${run.command} · ${run.world} rank${run.world === 1 ? "" : "s"} · ` +
    (last ? `loss ${last[1].toFixed(4)} at step ${last[0]}` : "no step yet"));
  line.className = "run-line";
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  COLUMNS.forEach(([name]) => head.appendChild(cell("th", name)));
  const body = table.createTBody();
  for (const rank of run.ranks) {
    const row = body.insertRow();
    row.className = `rank state-${rank.state}`;
    COLUMNS.forEach(([, value]) => row.appendChild(cell("td", value(rank))));
  }
  section.append(title, line, table);
  return section;
}

async function refresh() {
  try {
    const reply = await fetch("/api/runs", { cache: "no-store" });
    const { runs } = await reply.json();
    main.querySelectorAll("section.run").forEach((node) => node.remove());
    runs.forEach((run) => main.appendChild(runSection(run)));
    empty.hidden = runs.length > 0;
    badge.textContent = `${runs.length} run${runs.length === 1 ? "" : "s"}`;
  } catch (error) {
    badge.textContent = `cannot reach the server: ${error.message}`;
  }
  setTimeout(refresh, POLL_MS);
}

refresh();
