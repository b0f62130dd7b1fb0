"""uPlot, the page's chart library, fetched once at set-up from the npm registry (never a CDN).

``python -m server.chartlib fetch`` (the Makefile runs it with the runtime's fetch): ``npm
pack uplot@1.6.32``, accepted only when the tarball's sha256 is the pinned one, and three of
its files copied to ``$DAISYCHAIN_CACHE/uplot-1.6.32/`` (default parent
``~/.cache/daisychain``), the manifest written last. The server serves them as
``/vendor/uplot/<file>``; while they are missing, the page says which command fetches them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pynode.core.errors import DaisyError
from server.runtime import (
    RuntimeMissingError,
    cache_root,
    install_npm_files,
    sha256_file,
)

UPLOT_VERSION = "1.6.32"
UPLOT_TARBALL_SHA256 = "4b8a8191e425658e3ea8c8c1314b0fc679c861ee3a1af2b20c7b16ba50b5133d"
UPLOT_FILES = {"uPlot.iife.min.js": "package/dist/uPlot.iife.min.js",
               "uPlot.min.css": "package/dist/uPlot.min.css", "LICENSE": "package/LICENSE"}
MANIFEST_NAME = "daisychain-uplot.json"
FETCH_COMMAND = "python -m server.chartlib fetch"


def uplot_path() -> Path:
    return cache_root() / f"uplot-{UPLOT_VERSION}"


def check_uplot(folder: Path) -> None:
    """RuntimeMissingError (with the fetch command) unless `folder` holds a complete,
    unchanged fetch."""
    try:
        manifest = json.loads((folder / MANIFEST_NAME).read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeMissingError(f"uPlot {UPLOT_VERSION} is not fetched ({folder}); fetch it "
                                  f"once with `{FETCH_COMMAND}` (needs npm)") from exc
    for name, digest in manifest["files"].items():
        path = folder / name
        if not path.is_file() or sha256_file(path) != digest:
            raise RuntimeMissingError(f"{path} is missing or changed; fetch it again with "
                                      f"`{FETCH_COMMAND} --force`")


def fetch_uplot(*, force: bool = False) -> bool:
    """Fetch uPlot into uplot_path() unless a complete copy is there; True if fetched."""
    target = uplot_path()
    if not force:
        try:
            check_uplot(target)
            return False
        except RuntimeMissingError:
            pass
    install_npm_files(
        "uplot", UPLOT_VERSION, UPLOT_TARBALL_SHA256, UPLOT_FILES, target, MANIFEST_NAME,
        lambda staging, _: {"npm": f"uplot@{UPLOT_VERSION}",
                            "files": {n: sha256_file(staging / n) for n in UPLOT_FILES}})
    check_uplot(target)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.chartlib", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["fetch", "path"])
    parser.add_argument("--force", action="store_true", help="fetch again even if present")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            verb = "fetched" if fetch_uplot(force=args.force) else "already present:"
            print(f"uPlot {UPLOT_VERSION} (the page's charts) {verb} {uplot_path()}")
        else:
            print(uplot_path())
    except DaisyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
