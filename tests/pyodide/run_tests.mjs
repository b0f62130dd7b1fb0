// Runs plain `test_*` functions of Python test modules inside Pyodide under Node.js.
//
//   node tests/pyodide/run_tests.mjs --runtime DIR --bundle pynode.zip --root REPO \
//        --module tests/core/test_golden.py [--module ...] [--data tests/golden/golden_v2.npz]
//
// DIR is the fetched runtime (`python -m server.runtime path`); nothing is loaded from the
// network: pyodide.mjs comes from DIR and numpy from the wheel next to it. The bundle zip
// (`python -m server.bundle OUT`) is unpacked into the Pyodide FS and put on sys.path. Each
// --module and --data file is copied to /repo/<same relative path>, so a module that finds
// its data relative to __file__ finds it here too.
//
// Prints one line per test, `RESULTS <json>`, then `N passed, M failed, K skipped`.
// Exit status: 0 when every test passed or skipped and at least one ran, 1 otherwise,
// 2 when Pyodide itself could not be set up.

import { readFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const BUNDLE_DIR = "/home/pyodide/bundle";
const REPO_DIR = "/repo";
const HERE = dirname(fileURLToPath(import.meta.url));

function options() {
  const { values } = parseArgs({
    options: {
      runtime: { type: "string" },
      bundle: { type: "string" },
      root: { type: "string", default: "." },
      module: { type: "string", multiple: true, default: [] },
      data: { type: "string", multiple: true, default: [] },
      select: { type: "string", default: "" },
    },
  });
  if (!values.runtime || !values.bundle || values.module.length === 0) {
    throw new Error("usage: run_tests.mjs --runtime DIR --bundle ZIP --module PATH [...]");
  }
  return values;
}

async function bootPyodide(runtime) {
  const indexURL = resolve(runtime) + "/";
  const { loadPyodide } = await import(pathToFileURL(join(indexURL, "pyodide.mjs")).href);
  const t0 = performance.now();
  const pyodide = await loadPyodide({ indexURL, stdout: console.log, stderr: console.error });
  const bootMs = performance.now() - t0;
  const t1 = performance.now();
  // The wheel sits in indexURL under the lock file's name, so this never reaches a CDN.
  await pyodide.loadPackage("numpy", { messageCallback: () => {}, checkIntegrity: true });
  return { pyodide, bootMs, numpyMs: performance.now() - t1 };
}

async function copyIntoFS(pyodide, root, rel) {
  const target = `${REPO_DIR}/${rel}`;
  pyodide.FS.mkdirTree(target.slice(0, target.lastIndexOf("/")));
  pyodide.FS.writeFile(target, await readFile(resolve(root, rel)));
  return target;
}

async function main() {
  const opts = options();
  let session;
  try {
    session = await bootPyodide(opts.runtime);
    const { pyodide } = session;
    const bundle = new Uint8Array(await readFile(opts.bundle)); // Pyodide rejects a Node Buffer
    pyodide.unpackArchive(bundle, "zip", { extractDir: BUNDLE_DIR });
    for (const rel of opts.data) await copyIntoFS(pyodide, opts.root, rel);
    const modules = [];
    for (const rel of opts.module) modules.push(await copyIntoFS(pyodide, opts.root, rel));
    pyodide.runPython(await readFile(join(HERE, "harness.py"), "utf8"), { filename: "harness.py" });
    session.modules = modules;
  } catch (err) {
    console.error(`Pyodide set-up failed: ${err.stack || err}`);
    process.exit(2);
  }
  const { pyodide, bootMs, numpyMs, modules } = session;
  const runModules = pyodide.globals.get("run_modules");
  const t0 = performance.now();
  const results = JSON.parse(runModules(BUNDLE_DIR, modules, opts.select));
  const runMs = performance.now() - t0;
  const count = (status) => results.filter((r) => r.status === status).length;
  const summary = { passed: count("passed"), failed: count("failed"), skipped: count("skipped") };
  const timing = { boot_ms: bootMs, numpy_ms: numpyMs, run_ms: runMs };
  console.log(`pyodide ${pyodide.version} boot ${bootMs.toFixed(0)} ms, numpy ${numpyMs.toFixed(0)} ms`);
  console.log("RESULTS " + JSON.stringify({ ...summary, timing, results }));
  console.log(`${summary.passed} passed, ${summary.failed} failed, ${summary.skipped} skipped`);
  process.exit(summary.failed === 0 && summary.passed > 0 ? 0 : 1);
}

await main();
