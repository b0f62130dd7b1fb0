"""The checked-in wasm kernels (pynode/wasm/*.wasm) are exactly what their .wat sources build to.

Rebuilds each kernel with the pinned wat2wasm (`python -m server.wasm_build fetch`, needs
npm once) and compares bytes. Without node or the fetched wat2wasm the rebuild tests skip
with the reason, except under CI=true, where they fail. The cache checks run offline.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from server import wasm_build
from server.runtime import RuntimeIntegrityError, RuntimeMissingError


def need_wat2wasm() -> None:
    reason = None
    if shutil.which("node") is None:
        reason = "node is not installed"
    else:
        try:
            wasm_build.wat2wasm_path()
        except RuntimeMissingError as exc:
            reason = str(exc)
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the wasm build must be checked)")
    pytest.skip(reason)


def test_checked_in_kernels_equal_a_fresh_build():
    need_wat2wasm()
    results = wasm_build.build_all()
    assert [r.source.name for r in results] == ["gemm_i8.wat", "philox4x64.wat"]
    for r in results:
        assert r.matches, (f"{r.target} differs from a build of {r.source.name}: run "
                           "`python -m server.wasm_build build` and commit the result")
        assert r.built[:4] == b"\0asm" and b"dylink.0" in r.built


def test_a_changed_source_is_caught(tmp_path: Path):
    need_wat2wasm()
    source = wasm_build.SOURCE_DIR / "gemm_i8.wat"
    changed = tmp_path / source.name
    shutil.copy(source.with_suffix(".wasm"), changed.with_suffix(".wasm"))
    text = source.read_text()
    changed.write_text(text.replace("(i32.const 32)", "(i32.const 48)", 1))
    (result,) = wasm_build.build_all([changed])
    assert not result.matches
    changed.write_text(text)
    (result,) = wasm_build.build_all([changed])
    assert result.matches


def test_wat2wasm_is_refused_when_missing_or_altered(tmp_path, monkeypatch):
    monkeypatch.setenv("DAISYCHAIN_CACHE", str(tmp_path))
    with pytest.raises(RuntimeMissingError, match="server.wasm_build fetch"):
        wasm_build.wat2wasm_path()
    folder = wasm_build.wabt_path()
    folder.mkdir(parents=True)
    (folder / "wat2wasm").write_text("console.log('not wabt')\n")
    manifest = {"wabt": wasm_build.WABT_VERSION, "wat2wasm_sha256": "0" * 64}
    (folder / wasm_build.MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(RuntimeIntegrityError):
        wasm_build.wat2wasm_path()
