"""Starts the shared Pyodide run (pyodide_session.py) in the background once collection
shows that a selected test reads it, so it overlaps the tests that run before it."""

from __future__ import annotations

import shutil

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return  # nothing will run (tests/test_tiers.py collects the suite this way)
    if not any("session" in getattr(item, "fixturenames", ())
               and item.nodeid.startswith("tests/pyodide/") for item in session.items):
        return
    if shutil.which("node") is None:
        return  # the fixture skips (or fails under CI=true) with the reason
    from pyodide_session import STARTED, start

    from server.runtime import RuntimeMissingError, runtime_dir

    try:
        runtime = runtime_dir()
    except RuntimeMissingError:
        return
    session.config.stash[STARTED] = start(runtime)
