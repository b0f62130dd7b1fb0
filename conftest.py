"""Test tiers, named by what a test needs; every test of the suite is marked here.

    browser  Chromium driven by Playwright
    netns    a private network namespace (root, iproute2)
    wasm     Python under Pyodide in Node.js

A test needs a tier when the code it runs uses a helper module of that tier (TIER_MODULES):
its own function, every fixture it requests (directly or through other fixtures), and the
functions and classes of the test folders these call, read from their bytecode. None of
the three is marked by folder or by hand, so a test keeps its tiers wherever its file
moves, and a new test that builds a namespace or opens a tab is marked without anyone
remembering to. `slow` is marked by hand. The quick tier:
`pytest -m "not browser and not netns"` (README, Tests).
"""

from __future__ import annotations

import dis
import inspect
import os
import sys
from pathlib import Path
from types import CodeType, FunctionType
from typing import Any

import pytest

TIER_MODULES = {  # tier -> the modules (and their submodules) that provide it
    "browser": ("playwright", "browser_helpers", "local_page", "pynode.bench.browser"),
    "netns": ("netns", "private_net"),  # tests/netns.py, e2e/private_net.py
    "wasm": ("pyodide_node",),  # tests/pyodide/pyodide_node.py
}
TIER_OF_MODULE = {name: tier for tier, names in TIER_MODULES.items() for name in names}
COLLECTED = pytest.StashKey[list[pytest.Item]]()


def module_tiers(name: str) -> set[str]:
    """The tier of module `name` (`playwright.sync_api` is playwright's), as a set of 0 or 1."""
    parts = name.split(".")
    found = (TIER_OF_MODULE.get(".".join(parts[:end])) for end in range(len(parts), 0, -1))
    return {tier for tier in found if tier}


class TierReader:
    """Reads which tiers a function needs, following the test folders' own code."""

    def __init__(self, test_dirs: list[Path]) -> None:
        self.test_dirs = test_dirs
        self.cache: dict[CodeType, frozenset[str]] = {}

    def is_test_code(self, filename: str | None) -> bool:
        path = Path(filename or "")
        return any(path.is_relative_to(folder) for folder in self.test_dirs)

    def function(self, func: Any) -> frozenset[str]:
        func = inspect.unwrap(getattr(func, "__func__", func))
        if not isinstance(func, FunctionType):
            return frozenset()
        code = func.__code__
        if code not in self.cache:
            self.cache[code] = frozenset()  # a recursive call reads as needing nothing more
            self.cache[code] = frozenset(self.code(code, func.__globals__))
        return self.cache[code]

    def code(self, code: CodeType, namespace: dict[str, Any]) -> set[str]:
        tiers: set[str] = set()
        for ins in dis.get_instructions(code):
            if ins.opname == "IMPORT_NAME":
                tiers |= module_tiers(ins.argval)
            elif ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval in namespace:
                tiers |= self.value(namespace[ins.argval])
        for const in code.co_consts:  # nested functions, lambdas, comprehensions
            if isinstance(const, CodeType):
                tiers |= self.code(const, namespace)
        return tiers

    def value(self, value: Any) -> set[str]:
        if inspect.ismodule(value):
            return module_tiers(value.__name__)
        owner = getattr(value, "__module__", None)
        if isinstance(owner, str) and module_tiers(owner):
            return module_tiers(owner)
        if isinstance(value, FunctionType) and self.is_test_code(value.__code__.co_filename):
            return set(self.function(value))
        module = sys.modules.get(owner) if isinstance(owner, str) else None
        if inspect.isclass(value) and self.is_test_code(getattr(module, "__file__", None)):
            return {tier for member in vars(value).values() for tier in self.function(member)}
        return set()


def item_tiers(item: pytest.Item, reader: TierReader) -> set[str]:
    tiers = set(reader.function(getattr(item, "obj", None)))
    fixtures = getattr(item, "_fixtureinfo", None)
    for defs in (fixtures.name2fixturedefs.values() if fixtures else ()):
        for fixturedef in defs:
            tiers |= reader.function(fixturedef.func)
    return tiers


# `full`-marked tests (a fresh clone's set-up, the server's attack suite, the group tests'
# crash and death chains: half a minute each) run only in the full suite, so the quick tier
# stays under two minutes.
FULL_SUITE = os.environ.get("PYNODE_FULL_SUITE") == "1" or os.environ.get("CI") == "true"


@pytest.fixture(scope="session")
def full_suite() -> bool:
    """Whether this is the full suite (a fixture that starts work for `full` tests asks)."""
    return FULL_SUITE


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    reader = TierReader([root / folder for folder in config.getini("testpaths")])
    only_full = pytest.mark.skip(reason="runs in the full suite: make test, or "
                                 "PYNODE_FULL_SUITE=1 or CI=true (README, Tests)")
    for item in items:
        for tier in sorted(item_tiers(item, reader)):
            item.add_marker(tier)
        if not FULL_SUITE and item.get_closest_marker("full"):
            item.add_marker(only_full)
    config.stash[COLLECTED] = list(items)


@pytest.fixture
def collected_items(request: pytest.FixtureRequest) -> list[pytest.Item]:
    """Every test this session collected, before `-m` deselected any (tests/test_tiers.py)."""
    return request.config.stash[COLLECTED]
