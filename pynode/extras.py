"""Optional dependencies: which extra of the package brings each, and the one line that says
what to install when one is missing (the base install is numpy, tqdm and psutil)."""

from __future__ import annotations

import importlib.util

from pynode.core.errors import DaisyError

# import name -> (name pip knows, the extra of daisychain that installs it)
EXTRA_OF = {
    "torch": ("torch", "torch"),
    "flask": ("flask", "server"),
    "flask_sock": ("flask-sock", "server"),
    "pyarrow": ("pyarrow", "server"),
    "aiortc": ("aiortc", "webrtc"),
    "websockets": ("websockets", "webrtc"),
    "numba": ("numba", "fast"),
}


class MissingExtraError(DaisyError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def missing_line(what: str, modules: list[str]) -> str:
    """`what` needs `modules`: the install command of their extras."""
    names = " and ".join(EXTRA_OF[m][0] for m in modules)
    extras = ",".join(sorted({EXTRA_OF[m][1] for m in modules}))
    return f"{what} needs {names}, not installed here: pip install 'daisychain[{extras}]'"


def require(what: str, *modules: str) -> None:
    """MissingExtraError naming the extra to install if any of `modules` (import names, keys
    of EXTRA_OF) cannot be imported; nothing is imported here."""
    missing = [m for m in modules if _absent(m)]
    if missing:
        raise MissingExtraError(missing_line(what, missing))


def explain(what: str, exc: ImportError) -> MissingExtraError | None:
    """The MissingExtraError of an ImportError of an optional dependency, else None (an
    ImportError of anything else is a bug to show whole)."""
    root = (exc.name or "").partition(".")[0]
    return MissingExtraError(missing_line(what, [root])) if root in EXTRA_OF else None


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent that fails to import, a broken __spec__
        return True
