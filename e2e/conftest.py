"""Fixtures of the browser tests: a private network, the server and one Chromium inside it.

One namespace and one server serve the session, one browser each test module; each tab
is its own browser context (its own storage, so its own peer). Playwright drives Debian's Chromium
(`executable_path`), never a downloaded one. Screenshots go to artifacts/e2e/ (gitignored).

Needs: root with iproute2 (the namespace), chromium, the playwright package and the fetched
Pyodide runtime (`python -m server.runtime fetch`). Missing ones skip these tests with the
reason, except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import CHROMIUM_FLAGS, Tabs, missing_browser_parts, unavailable
from mixed_helpers import NativeJoin
from private_net import NetnsUnavailable, PrivateNet

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def net() -> Iterator[PrivateNet]:
    reason = missing_browser_parts()
    if reason:
        unavailable(reason)
    private = PrivateNet()
    try:
        private.__enter__()
    except NetnsUnavailable as exc:
        unavailable(f"no private network namespace: {exc}")
    try:
        yield private
    finally:
        private.close()


@pytest.fixture(scope="module")
def local_browser() -> Iterator[Any]:
    """One Chromium on this machine, outside any namespace, for a module's pages of a local
    server on loopback (local_page.py)."""
    reason = missing_browser_parts()
    if reason:
        unavailable(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which("chromium"),
                                     args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def server_url(net: PrivateNet, tmp_path_factory: pytest.TempPathFactory) -> str:
    data_dir = tmp_path_factory.mktemp("server-data")
    proc = net.popen([sys.executable, "-m", "server", "--host", net.address, "--port", "0",
                      "--data-dir", str(data_dir), "--log-level", "WARNING"],
                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    found = re.search(r"http://[\d.]+:(\d+)/", line)
    if not found:
        pytest.fail(f"the server did not start: {line}{proc.stdout.read()}")
    return f"http://{net.address}:{found.group(1)}"


@pytest.fixture(scope="module")
def browser(net: PrivateNet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # Module scope: Playwright's sync API keeps an event loop running in this thread until
    # it stops, and later test modules need asyncio.run.
    from playwright.sync_api import sync_playwright

    wrapper = net.wrapper(tmp_path_factory.mktemp("bin") / "chromium", shutil.which("chromium"))
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(wrapper), args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def tabs(browser: Any, server_url: str, request: pytest.FixtureRequest) -> Iterator[Tabs]:
    opened = Tabs(browser, server_url, request.node.name)
    yield opened
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print("\n".join(opened.console[-200:]))
    opened.close()


@pytest.fixture
def console(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Console lines a test collects from its pages; printed if the test failed."""
    lines: list[str] = []
    yield lines
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        print("\n".join(lines[-200:]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def natives(net: PrivateNet, server_url: str,
            tmp_path: Path) -> Iterator[Callable[..., NativeJoin]]:
    """start(name, *flags, env=, server=) -> a NativeJoin (`python -m pynode join` in the
    private network); every one is killed at the end of the test."""
    started: list[NativeJoin] = []

    def start(name: str, *args: str, env: dict | None = None,
              server: str | None = None) -> NativeJoin:
        peer = NativeJoin(net, server or server_url, tmp_path, name, *args, env=env)
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.kill()


@pytest.fixture(scope="session")
def native_reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict], list[dict]]:
    """`python -m pynode train` with a page config: one {step, loss, hash, probe} per step."""
    cache: dict[str, list[dict]] = {}

    def run(config: dict) -> list[dict]:
        key = json.dumps(config, sort_keys=True)
        if key not in cache:
            log = tmp_path_factory.mktemp("native") / "steps.jsonl"
            flags = [f"--{k.replace('_', '-')}={v}" for k, v in sorted(config.items())]
            done = subprocess.run([sys.executable, "-m", "pynode", "train", *flags, "--log",
                                   str(log), "--no-progress"], cwd=REPO, capture_output=True,
                                  text=True, timeout=600)
            assert done.returncode == 0, done.stderr
            cache[key] = [json.loads(line) for line in log.read_text().splitlines()]
        return cache[key]

    return run
