"""Reading (and writing) the shipped unit weight files; the I/O half of pynode.core.units.

Layout (units/SPEC.md section 4.3): <dir>/{mul8,requant16,relu8}.npz and <dir>/MANIFEST.json
with the sha256 of each file. Only numpy and the standard library, so it runs under Pyodide
given the same directory layout in its virtual file system.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pynode.core.errors import UnitVerificationError
from pynode.core.units import FORMAT_VERSION, UNIT_NAMES, Units, load_units

MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = "daisychain-unit-weights"
ENV_DIR = "PYNODE_UNITS_DIR"
SHIPPED_DIR = Path(__file__).resolve().parent / "data" / "units"  # package data, in every wheel
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed, so the same weights always give the same bytes


def weights_dir() -> Path:
    """The unit weight folder: $PYNODE_UNITS_DIR if set, else the package's data/units."""
    override = os.environ.get(ENV_DIR)
    if override:
        return Path(override)
    return SHIPPED_DIR


def _read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UnitVerificationError(f"unit weights: {path} is missing") from None
    except (OSError, ValueError) as exc:
        raise UnitVerificationError(f"unit weights: cannot read {path}: {exc}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if (
        not isinstance(files, dict)
        or manifest.get("format") != MANIFEST_FORMAT
        or manifest.get("format_version") != FORMAT_VERSION
    ):
        raise UnitVerificationError(
            f"unit weights: {path} is not a version-{FORMAT_VERSION} {MANIFEST_FORMAT} manifest"
        )
    return files


def _read_checked(folder: Path, name: str, entry: object) -> bytes:
    path = folder / name
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        raise UnitVerificationError(f"unit weights: {MANIFEST} has no sha256 for {name}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UnitVerificationError(f"unit weights: {path} is missing") from None
    except OSError as exc:
        raise UnitVerificationError(f"unit weights: cannot read {path}: {exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise UnitVerificationError(
            f"unit weights: {name} is corrupted: sha256 {digest[:16]}... does not match "
            f"{MANIFEST} ({entry['sha256'][:16]}...); refusing to load it"
        )
    return data


def read_unit_weights(dir: str | os.PathLike | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Read and hash-check the weight files of every unit.

    dir: folder holding MANIFEST.json and the .npz files (default: weights_dir()).
    Returns {"mul8": {array name: array}, ...}. Raises UnitVerificationError naming the
    file if the manifest or any file is missing, corrupted or unreadable.
    """
    folder = Path(dir) if dir is not None else weights_dir()
    files = _read_manifest(folder)
    weights = {}
    for unit in UNIT_NAMES:
        name = f"{unit}.npz"
        # Hash and parse the same bytes, so the file cannot change in between.
        data = _read_checked(folder, name, files.get(name))
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                weights[unit] = {key: npz[key] for key in npz.files}
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise UnitVerificationError(
                f"unit weights: {name} is not a valid .npz: {exc}"
            ) from None
    return weights


def load_default_units() -> Units:
    """Read the shipped unit weights and verify them over their full domains (load_units)."""
    return load_units(read_unit_weights())


def _npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for key in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


def write_unit_weights(
    weights: Mapping[str, Mapping[str, np.ndarray]], dir: str | os.PathLike
) -> dict[str, int]:
    """Write the unit weight files and their manifest (last); byte-reproducible.

    Returns the size in bytes of each file written. Does not verify the networks:
    callers run load_units on `weights` first (units/train_units.py does).
    """
    folder = Path(dir)
    folder.mkdir(parents=True, exist_ok=True)
    entries, sizes = {}, {}
    for unit in UNIT_NAMES:
        name = f"{unit}.npz"
        data = _npz_bytes(weights[unit])
        tmp = folder / f".{name}.tmp"
        tmp.write_bytes(data)
        tmp.replace(folder / name)
        entries[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        sizes[name] = len(data)
    manifest = {"format": MANIFEST_FORMAT, "format_version": FORMAT_VERSION, "files": entries}
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(folder / MANIFEST)
    return sizes
