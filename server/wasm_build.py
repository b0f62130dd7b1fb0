"""Builds the page's WebAssembly kernels from their text sources with a pinned wat2wasm.

The kernels' sources (`pynode/wasm/*.wat`) and their builds (`*.wasm`, checked in beside
them and shipped in the pynode bundle, so a server needs no build tools) must agree byte
for byte: `check` rebuilds each one and compares, and tests/server/test_wasm_build.py runs
it. The compiler is `wat2wasm` of the npm package ``wabt@1.0.39`` (WABT compiled to
JavaScript; runs on Node.js), fetched at set-up by ``npm pack`` from the npm registry into
the same cache as the Pyodide runtime and accepted only when the tarball's sha256 is the
pinned one.

Layout: ``$DAISYCHAIN_CACHE/wabt-1.0.39/`` holds ``wat2wasm``, ``LICENSE``,
``package.json`` and ``daisychain-wabt.json`` (written last: its presence means a
complete fetch).

    python -m server.wasm_build fetch   # idempotent; npm pack + sha256 check
    python -m server.wasm_build build   # rewrite every pynode/wasm/*.wasm from its .wat
    python -m server.wasm_build check   # rebuild into a temp folder; exit 1 if bytes differ
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pynode
from pynode.core.errors import DaisyError
from server.runtime import (
    RuntimeIntegrityError,
    RuntimeMissingError,
    cache_root,
    install_npm_files,
    run_tool,
    sha256_file,
)

WABT_VERSION = "1.0.39"
# sha256 of the registry tarball of wabt@1.0.39 (npm's own sha512 is checked by npm).
WABT_TARBALL_SHA256 = "a10d4f4b15b91de8ab2ccb4700ef12185736f0bc96ee809e53ab17f7ea743fd2"
WABT_FILES = {"package/bin/wat2wasm": "wat2wasm", "package/LICENSE": "LICENSE",
              "package/package.json": "package.json"}
WAT2WASM_FLAGS = ("--enable-annotations",)  # the kernels carry a custom section (dylink.0)
MANIFEST_NAME = "daisychain-wabt.json"
FETCH_COMMAND = "python -m server.wasm_build fetch"
SOURCE_DIR = Path(pynode.__file__).resolve().parent / "wasm"  # the kernels ship with pynode


class WasmBuildError(DaisyError):
    """A kernel did not compile, or its checked-in build differs from its source."""


@dataclass(frozen=True)
class BuildResult:
    source: Path  # the .wat
    target: Path  # the checked-in .wasm beside it
    built: bytes  # what wat2wasm made of the source now

    @property
    def matches(self) -> bool:
        return self.target.is_file() and self.target.read_bytes() == self.built


def wabt_path() -> Path:
    return cache_root() / f"wabt-{WABT_VERSION}"


def wat2wasm_path() -> Path:
    """The fetched wat2wasm; RuntimeMissingError (with the fetch command) if absent."""
    folder = wabt_path()
    manifest = folder / MANIFEST_NAME
    tool = folder / "wat2wasm"
    if not manifest.is_file() or not tool.is_file():
        raise RuntimeMissingError(f"wat2wasm (wabt {WABT_VERSION}) not found at {folder}. "
                                  f"Fetch it once with `{FETCH_COMMAND}` (needs npm).")
    recorded = json.loads(manifest.read_text()).get("wat2wasm_sha256")
    if recorded != sha256_file(tool):
        raise RuntimeIntegrityError(f"{tool} does not match {manifest}; delete {folder} and "
                                    f"run `{FETCH_COMMAND}`")
    return tool


def fetch_wabt(*, force: bool = False) -> Path:
    """npm pack wabt@WABT_VERSION, check its sha256, keep wat2wasm; no-op when present."""
    target = wabt_path()
    if not force:
        try:
            wat2wasm_path()
            return target
        except RuntimeMissingError:
            pass
    install_npm_files(
        "wabt", WABT_VERSION, WABT_TARBALL_SHA256,
        {name: member for member, name in WABT_FILES.items()}, target, MANIFEST_NAME,
        lambda staging, digest: {"wabt": WABT_VERSION, "source": f"npm wabt@{WABT_VERSION}",
                                 "tarball_sha256": digest,
                                 "wat2wasm_sha256": sha256_file(staging / "wat2wasm")})
    return target


def compile_wat(source: Path, out: Path) -> None:
    """wat2wasm source -o out (Node.js runs the pinned wat2wasm)."""
    tool = wat2wasm_path()
    run_tool(["node", str(tool), *WAT2WASM_FLAGS, str(source), "-o", str(out)], source.parent,
             f"wat2wasm {source.name}", WasmBuildError)


def build_all(sources: list[Path] | None = None) -> list[BuildResult]:
    """Compile every kernel source; nothing on disk changes (see `write`)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="daisychain-wasm-") as tmp:
        for source in sources if sources is not None else sorted(SOURCE_DIR.glob("*.wat")):
            out = Path(tmp) / (source.stem + ".wasm")
            compile_wat(source, out)
            results.append(BuildResult(source, source.with_suffix(".wasm"), out.read_bytes()))
    return results


def write(results: list[BuildResult]) -> None:
    for result in results:
        if not result.matches:
            result.target.write_bytes(result.built)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.wasm_build", description=__doc__)
    parser.add_argument("command", choices=["fetch", "build", "check"])
    parser.add_argument("--force", action="store_true", help="fetch again even if present")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            print(f"wat2wasm (wabt {WABT_VERSION}, tarball sha256 verified) at "
                  f"{fetch_wabt(force=args.force)}")
            return 0
        results = build_all()
        if args.command == "build":
            write(results)
        for r in results:
            state = "matches its source" if r.matches else "DIFFERS from its source"
            print(f"{r.target.name}: {len(r.built)} bytes, {state}")
        if not all(r.matches for r in results):
            print("rebuild with `python -m server.wasm_build build`", file=sys.stderr)
            return 1
    except DaisyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
