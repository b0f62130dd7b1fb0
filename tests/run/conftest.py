"""Fixtures the run-layer tests share."""

from __future__ import annotations

import pytest

from pynode.browser import Checks, run_checks


@pytest.fixture(scope="module")
def checks() -> Checks:
    """The start-up checks' result (units, gate, kernels) that in-process peers reuse,
    once per module: a module's trainers share its GEMM and whatever befalls it."""
    result = run_checks()
    assert result.ready, result.rows
    return result
