"""Fixtures shared by the comm tests."""

from __future__ import annotations

import pytest

from pynode.comm import wire


@pytest.fixture
def fresh_codec():
    """The int64 codec decides again which accelerators it uses (numba's byte planes,
    zlib-ng's deflate: wire._native_planes, wire._deflate), and again after the test."""
    wire._native_planes.cache_clear()
    wire._deflate.cache_clear()
    yield
    wire._native_planes.cache_clear()
    wire._deflate.cache_clear()
