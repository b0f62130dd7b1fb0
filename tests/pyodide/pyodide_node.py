"""Python under Pyodide in Node.js: run_tests.mjs boots the fetched runtime and the pynode
bundle, runs test modules through harness.py and prints one `RESULTS {json}` line.

Using this module is what puts a test in the `wasm` tier (conftest.py at the repo root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from server.runtime import RuntimeMissingError, runtime_dir

REPO = Path(__file__).resolve().parents[2]
RUNNER = REPO / "tests" / "pyodide" / "run_tests.mjs"


def unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the Pyodide tier must run)")
    pytest.skip(reason)


def node_runtime() -> Path:
    """The fetched Pyodide runtime, once node is known to be here (or skip with the reason)."""
    if shutil.which("node") is None:
        unavailable("node is not installed")
    try:
        return runtime_dir()
    except RuntimeMissingError as exc:
        unavailable(str(exc))


def run_in_pyodide(runtime: Path, bundle: Path, modules: list[str], data: list[str]) -> tuple:
    """The runner's process and its parsed report (None when it printed none)."""
    return finish_in_pyodide(start_in_pyodide(runtime, bundle, modules, data))


def start_in_pyodide(runtime: Path, bundle: Path, modules: list[str], data: list[str]
                     ) -> tuple[subprocess.Popen, Path]:
    """The runner started in the background (its output goes to files in `bundle`'s folder,
    so no pipe fills while nobody reads); finish_in_pyodide waits for it."""
    cmd = ["node", str(RUNNER), "--runtime", str(runtime), "--bundle", str(bundle),
           "--root", str(REPO)]
    cmd += [arg for m in modules for arg in ("--module", m)]
    cmd += [arg for d in data for arg in ("--data", d)]
    folder = bundle.parent
    with open(folder / "runner.out", "w") as out, open(folder / "runner.err", "w") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                text=True), folder


def finish_in_pyodide(started: tuple[subprocess.Popen, Path]) -> tuple:
    """The started runner's completed process and its parsed report (None when none)."""
    popen, folder = started
    try:
        popen.wait(timeout=900)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
    proc = subprocess.CompletedProcess(popen.args, popen.returncode,
                                       (folder / "runner.out").read_text(),
                                       (folder / "runner.err").read_text())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")]
    report = json.loads(lines[-1][len("RESULTS "):]) if lines else None
    return proc, report
