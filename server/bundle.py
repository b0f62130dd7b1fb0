"""The pynode bundle: one deterministic zip a Pyodide peer unpacks and puts on sys.path.

Layout inside the zip (the package as installed, so ``pynode.unitfiles.weights_dir()``
finds the unit weights inside it, as it does in a wheel):

    pynode/**             every file of the imported package except caches
    pynode/data/units/*   the unit weights this server's pynode reads (PYNODE_UNITS_DIR
                          included), in place of the package's own copy

Entries are sorted, carry a fixed timestamp and fixed permissions, so the same sources give
the same bytes and the same ``bundle_sha256()``. The zip is rebuilt only when a source file's
path, size or mtime changes.

    python -m server.bundle OUT.zip    # write it and print its sha256
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

import pynode
from pynode.core.errors import DaisyError

ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry
SKIPPED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")
WEIGHTS_PREFIX = "pynode/data/units/"  # pynode.unitfiles.SHIPPED_DIR, as named in the zip


class BundleError(DaisyError):
    """The pynode bundle cannot be built (package or unit weights not found)."""


def package_dir() -> Path:
    """The folder of the imported pynode package."""
    return Path(pynode.__file__).resolve().parent


def weights_dir() -> Path | None:
    """The unit weights folder pynode itself reads; None while pynode has no unitfiles module."""
    try:
        from pynode.unitfiles import weights_dir as pynode_weights_dir
    except ImportError:
        return None
    return Path(pynode_weights_dir()).resolve()


def bundle_sources() -> list[tuple[str, Path]]:
    """(name in the zip, file on disk) for every bundled file, sorted by name."""
    sources = {f"pynode/{rel}": path for rel, path in _walk(package_dir())}
    weights = weights_dir()
    if weights is not None:
        found = _walk(weights) if weights.is_dir() else []
        if not found:
            # A bundle without weights would boot and then fail in every browser tab.
            raise BundleError(f"unit weights folder {weights} is missing or empty")
        sources = {n: p for n, p in sources.items() if not n.startswith(WEIGHTS_PREFIX)}
        sources.update((WEIGHTS_PREFIX + rel, path) for rel, path in found)
    return sorted(sources.items())


def build_bundle() -> bytes:
    """The bundle zip as bytes; cached until a source file changes."""
    sources = bundle_sources()
    if not any(name == "pynode/__init__.py" for name, _ in sources):
        raise BundleError(f"no pynode package found at {package_dir()}")
    fingerprint = tuple(
        (name, str(path), st.st_size, st.st_mtime_ns)
        for name, path in sources
        for st in (path.stat(),)
    )
    return _zip_sources(fingerprint)


def bundle_sha256() -> str:
    """Hex sha256 of ``build_bundle()``: what a peer checks after download."""
    return _sha256(build_bundle())


@lru_cache(maxsize=2)
def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@lru_cache(maxsize=2)
def _zip_sources(fingerprint: tuple[tuple[str, str, int, int], ...]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, path, _, _ in fingerprint:
            info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o100644 << 16  # regular file, rw-r--r--, whatever the disk says
            info.create_system = 3  # unix, so the mode above is honoured everywhere
            zf.writestr(info, Path(path).read_bytes(), compresslevel=9)
    return buffer.getvalue()


def _walk(root: Path) -> list[tuple[str, Path]]:
    files = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if any(part in SKIPPED_DIRS or part.startswith(".") for part in rel.parts):
            continue
        if path.is_file() and not path.name.endswith(SKIPPED_SUFFIXES):
            files.append((rel.as_posix(), path))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.bundle", description=__doc__)
    parser.add_argument("out", type=Path, help="where to write the bundle zip")
    args = parser.parse_args(argv)
    data = build_bundle()
    args.out.write_bytes(data)
    print(f"{args.out}: {len(data)} bytes, sha256 {_sha256(data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
