"""/runtime/ (the fetched Pyodide runtime, ``indexURL`` of loadPyodide), /vendor/uplot/ (the
page's chart library, fetched with it) and /bundle/ (pynode).

The runtime folder comes from ``server.runtime.runtime_dir()`` (or the config); when it
has not been fetched every runtime URL answers 503 with the one command that fixes it.
The bundle is built from the installed pynode package once per change and served with its
sha256 as ETag, so a page revalidates cheaply and a peer can check what it runs.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

from flask import Blueprint, Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue

from pynode.core.errors import DaisyError
from server.config import ServerConfig
from server.files import REVALIDATE, send_file_from

log = logging.getLogger(__name__)
bp = Blueprint("runtime", __name__)
SETUP_COMMAND = "python -m server.runtime fetch"
BUNDLE_NAME = "pynode.zip"
_bundle_lock = threading.Lock()


def _config() -> ServerConfig:
    return current_app.extensions["daisychain.config"]


def resolve_runtime_dir(cfg: ServerConfig) -> Path:
    """The runtime folder; DaisyError (with the set-up command) when it is not there."""
    if cfg.runtime_dir is not None:
        if not cfg.runtime_dir.is_dir():
            raise DaisyError(f"runtime folder {cfg.runtime_dir} does not exist")
        return cfg.runtime_dir
    from server.runtime import runtime_dir  # owns the cache layout and its checks

    return runtime_dir()


def _missing(message: str) -> ResponseReturnValue:
    if SETUP_COMMAND not in message:
        message += f" Fetch it once with `{SETUP_COMMAND}`."
    response = jsonify(error="runtime_missing", message=message, setup=SETUP_COMMAND)
    response.headers["Cache-Control"] = "no-store"
    return response, 503


@bp.get("/runtime/<path:name>")
def runtime_file(name: str) -> ResponseReturnValue:
    cfg = _config()
    try:
        folder = resolve_runtime_dir(cfg)
    except DaisyError as exc:
        return _missing(str(exc))
    # Pinned version, but not content-addressed URLs: a long max-age plus ETag revalidation.
    return send_file_from(folder, name, f"public, max-age={cfg.runtime_max_age}")


@bp.get("/runtime/")
def runtime_index() -> ResponseReturnValue:
    """Whether the runtime is there (for the page's boot screen and for operators)."""
    try:
        folder = resolve_runtime_dir(_config())
    except DaisyError as exc:
        return _missing(str(exc))
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    response = jsonify(ok=True, files=files)
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/vendor/uplot/<name>")
def uplot_file(name: str) -> ResponseReturnValue:
    """uPlot (server/chartlib.py), fetched at set-up with the runtime; 503 until then."""
    from server.chartlib import UPLOT_FILES, check_uplot, uplot_path

    folder = uplot_path()
    try:
        check_uplot(folder)
    except DaisyError as exc:  # the message names its own fetch command
        response = jsonify(error="chartlib_missing", message=str(exc))
        response.headers["Cache-Control"] = "no-store"
        return response, 503
    if name not in UPLOT_FILES:
        return jsonify(error="not_found", message=f"no {name} in uPlot"), 404
    return send_file_from(folder, name, f"public, max-age={_config().runtime_max_age}")


def _bundle_bytes(cfg: ServerConfig) -> bytes:
    if cfg.bundle_file is not None:
        return cfg.bundle_file.read_bytes()
    from server.bundle import build_bundle  # caches itself until a source file changes

    with _bundle_lock:  # build once even when every tab of a room asks at the same moment
        return build_bundle()


def _bundle() -> tuple[bytes, str]:
    data = _bundle_bytes(_config())
    return data, hashlib.sha256(data).hexdigest()


@bp.get(f"/bundle/{BUNDLE_NAME}")
def bundle_zip() -> ResponseReturnValue:
    try:
        data, digest = _bundle()
    except (OSError, DaisyError) as exc:
        log.error("pynode bundle unavailable: %s", exc)
        return jsonify(error="bundle_unavailable", message=str(exc)), 503
    response = Response(data, mimetype="application/zip")
    response.set_etag(digest)
    response.headers["Cache-Control"] = REVALIDATE
    response.headers["X-Content-SHA256"] = digest
    return response.make_conditional(request)


@bp.get("/bundle/manifest.json")
def bundle_manifest() -> ResponseReturnValue:
    try:
        data, digest = _bundle()
    except (OSError, DaisyError) as exc:
        return jsonify(error="bundle_unavailable", message=str(exc)), 503
    response = jsonify(url=f"/bundle/{BUNDLE_NAME}", sha256=digest, size=len(data))
    response.headers["Cache-Control"] = "no-store"
    return response
