"""Runs a JavaScript check of the page's modules under Node: the tests that hold a page
module (fragments.js, mesh.js, node.js) against its native twin or its record.

Without node such a check is skipped, except under CI=true, where the JS checks must run.
Imported by test modules (tests/ is on their sys.path).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def node_check(script: str, *args: str, stdin: str | None = None) -> str:
    """stdout of `script` (an ES module's source) run with `args` as process.argv[1:]."""
    if shutil.which("node") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("node is not installed (CI=true: the JS checks must run)")
        pytest.skip("node is not installed")
    done = subprocess.run(["node", "--input-type=module", "-e", script, *args], input=stdin,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout
