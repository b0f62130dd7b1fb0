"""The checked-in wasm kernels (pynode/wasm/*.wasm) are exactly what their .wat sources build to.

Rebuilds each kernel with the pinned wat2wasm (`python -m server.wasm_build fetch`, needs
npm once) and compares bytes. Without node or the fetched wat2wasm the rebuild tests skip
with the reason, except under CI=true, where they fail. The cache checks run offline.
"""

from __future__ import annotations

import json
import os
import re
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
    assert [r.source.name for r in results] == ["gemm_i8.wat", "kernels.wat", "philox4x64.wat"]
    for r in results:
        assert r.matches, (f"{r.target} differs from a build of {r.source.name}: run "
                           "`python -m server.wasm_build build` and commit the result")
        assert r.built[:4] == b"\0asm" and b"dylink.0" in r.built


@pytest.mark.parametrize(("name", "old", "new"), [
    ("gemm_i8.wat", "(i32.const 32)", "(i32.const 48)"),
    ("kernels.wat", "0x1.33171f83ca933p+0 0x1.33171f83ca933p+0",
     "0x1.33171f83ca934p+0 0x1.33171f83ca934p+0"),
])
def test_a_changed_source_is_caught(tmp_path: Path, name: str, old: str, new: str):
    need_wat2wasm()
    source = wasm_build.SOURCE_DIR / name
    changed = tmp_path / source.name
    shutil.copy(source.with_suffix(".wasm"), changed.with_suffix(".wasm"))
    text = source.read_text()
    assert old in text
    changed.write_text(text.replace(old, new, 1))
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


# An f64x2 constant of kernels.wat and the fastmath name in its comment: `(v128.const f64x2
# A B)` then closing parens, then `;; _NAME` or `;; _NAME[i]`.
_NAMED_CONST = re.compile(
    r"\(v128\.const f64x2 (\S+) ([^\s)]+)\)[)\s]*;; (_[A-Z0-9_]+)(?:\[(\d+)\])?")
_PLAIN_CONSTS = {0.0, 0.5, -0.5, 1.0}  # exact literals of the reference's own code


def test_kernel_constants_are_fastmath_s_bit_for_bit():
    """A last-bit change of a polynomial coefficient rarely shows in float32 results, so the
    gate alone would not catch it: every f64 constant of kernels.wat must be fastmath's."""
    from pynode.core import fastmath

    text = (wasm_build.SOURCE_DIR / "kernels.wat").read_text()
    named = set()
    for a, b, name, index in _NAMED_CONST.findall(text):
        want = getattr(fastmath, name)
        want = want[int(index)] if index else want
        assert float.fromhex(a) == float.fromhex(b) == want, (name, index, a, b, want)
        named.add(f"{name}[{index}]" if index else name)
    expected = {"_EXP_FLOOR", "_INV_LN2", "_LN2_HI", "_LN2_LO", "_SQRT1_2", "_ERFCX_P",
                "_ERFCX_T0", "_INV_SQRT_2PI"}
    expected |= {f"_EXP_TAYLOR[{i}]" for i in range(len(fastmath._EXP_TAYLOR))}
    expected |= {f"_ERFCX[{i}]" for i in range(len(fastmath._ERFCX))}
    assert named == expected, named ^ expected
    for line in text.splitlines():
        if ";; _" in line:
            continue  # named: checked above
        for a, b in re.findall(r"v128\.const f64x2 (\S+) ([^\s)]+)", line):
            value = float.fromhex(a) if "0x" in a else float(a)
            assert value in _PLAIN_CONSTS and float(b) == value, line
