"""The tier markers of conftest.py: known tests carry exactly their tiers, wherever their
file lives, and no test on a browser or namespace fixture goes without its marker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIERS = ("browser", "netns", "wasm")

# file name::test -> its tiers. Found by file name, so a file moved between folders
# (e2e/test_room.py became tests/run/test_room_protocol.py) is checked where it now is.
KNOWN = {
    "test_browser_gemm.py::test_wasm_simd_is_exact_in_chromium": {"browser", "netns"},
    # `python -m pynode bench browser` opens Chromium itself, on 127.0.0.1
    "test_browser_gemm.py::test_bench_browser_stops_with_the_reason_when_the_tab_cannot_start":
        {"browser"},
    "test_webgpu.py::test_without_the_flag_webgpu_is_unavailable_and_the_page_trains":
        {"browser"},
    # no tab, but the e2e `net` fixture wants Chromium and the runtime before it builds
    "test_mixed.py::test_two_native_peers_alone_train_the_reference_hashes": {"browser", "netns"},
    "test_turn.py::test_two_tabs_and_a_native_peer_on_separate_networks_train_through_turn":
        {"browser", "netns"},
    "test_turn.py::test_without_turn_a_pair_that_cannot_connect_is_named_on_both_sides":
        {"browser", "netns"},
    "test_page_ui.py::test_bad_and_unknown_room_codes_end_next_to_the_room_controls":
        {"browser"},
    "test_mdns.py::test_a_native_peer_resolves_a_name_answered_as_chromium_answers": {"netns"},
    "test_mdns.py::test_readable_keeps_what_parses_and_drops_what_aioice_does_not_read": set(),
    "test_netns.py::test_namespaces_are_removed_when_the_test_fails": {"netns"},
    "test_under_pyodide.py::test_wasm_kernels_under_pyodide": {"wasm"},
    "test_under_pyodide.py::test_wasm_simd_is_unavailable_natively": set(),
    "test_room_protocol.py::test_three_peers_train_the_reference_hashes": set(),
    "test_mesh_collective.py::test_star_collectives": set(),
}
# The fixtures that open Chromium or build the e2e namespace, by name: an oracle that
# shares nothing with conftest.py's reading of bytecode.
FIXTURE_TIERS = {"browser": "browser", "tabs": "browser", "gpu_browser": "browser",
                 "plain_browser": "browser", "browsers": "browser", "net": "netns",
                 "nets": "netns", "server_url": "netns"}

REPORT_PLUGIN = f"""
import json

def pytest_collection_finish(session):
    for item in session.items:
        tiers = sorted(m.name for m in item.iter_markers() if m.name in {TIERS!r})
        print("TIERS", json.dumps([item.nodeid, tiers]))
"""


def find_test_file(name: str) -> Path:
    (found,) = [path for folder in ("tests", "e2e") for path in (REPO / folder).rglob(name)]
    return found


def test_known_tests_carry_exactly_their_tiers(tmp_path: Path) -> None:
    (tmp_path / "tier_report.py").write_text(REPORT_PLUGIN)
    files = sorted({str(find_test_file(key.split("::")[0])) for key in KNOWN})
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "tier_report", *files],
        cwd=REPO, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("TIERS "):
            nodeid, tiers = json.loads(line[len("TIERS "):])
            found[Path(nodeid).name] = set(tiers)  # file name::test (a node id's last part)
    assert {key: found.get(key) for key in KNOWN} == KNOWN


def test_every_test_on_a_browser_or_namespace_fixture_carries_its_marker(
        collected_items: list[pytest.Item]) -> None:
    """Over every test this session collected (the whole suite under a plain `pytest`)."""
    missing = [f"{item.nodeid}: {name} without the {tier} marker"
               for item in collected_items for name in item.fixturenames
               if (tier := FIXTURE_TIERS.get(name)) and item.get_closest_marker(tier) is None]
    assert not missing, "\n".join(missing)
