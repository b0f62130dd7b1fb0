"""A server on 127.0.0.1 and pages at http://localhost:PORT, for single-tab tests that need a
secure context (WebGPU) rather than a network: no namespace, no root.

`navigator.gpu` exists only in secure contexts; http://localhost is one, the private
network's 10.77.0.1 is not. Headless Chromium offers a WebGPU adapter (SwiftShader, on
the CPU) only with `--enable-unsafe-webgpu`, which works beside `--disable-gpu`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from browser_helpers import CHROMIUM_FLAGS, REPO

WEBGPU_FLAGS = [*CHROMIUM_FLAGS, "--enable-unsafe-webgpu"]


class LocalServer:
    """`python -m server` on 127.0.0.1 with a free port; `url` is its localhost address.
    `env`: variables to set for the server beside this process's own; `port`: a given one
    (a server started again where the pages look for it); `args`: more flags."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None,
                 port: int = 0, args: list[str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", str(data_dir), "--log-level", "WARNING", *(args or [])],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **(env or {})})
        line = self.proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if not found:
            self.close()
            raise RuntimeError(f"the server did not start: {line}")
        self.port = int(found.group(1))
        self.url = f"http://localhost:{self.port}"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def open_page(browser: Any, url: str, console: list[str], **context: Any) -> Any:
    """A page in a fresh context (`context`: its options, e.g. timezone_id), its console
    lines appended to `console`."""
    page = browser.new_context(**context).new_page()
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"page error: {e}"))
    page.goto(url)
    page.wait_for_function("() => window.daisychain && daisychain.status().peerId",
                           timeout=30_000)
    return page


def steered_checkpoint(path: Path, steps: int, changes: list[dict[str, Any]]) -> Path:
    """`python -m pynode train` of a small model for `steps`, steered by `changes` (its
    --schedule, written beside `path`), saved to `path`: a checkpoint that holds changes."""
    import json

    schedule = path.with_suffix(".schedule.json")
    schedule.write_text(json.dumps(changes))
    made = subprocess.run(
        [sys.executable, "-m", "pynode", "train", "--steps", str(steps), "--width", "32",
         "--layers", "1", "--heads", "2", "--seq", "16", "--microbatch-size", "2",
         "--microbatches", "2", "--schedule", str(schedule), "--no-progress", "--save",
         str(path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    return path
