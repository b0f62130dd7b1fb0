"""The page a person opens (``/`` and ``/?room=CODE``), its files, and /healthz.

``static/index.html`` is the page when it exists; until then a built-in placeholder says
what the server is and what is missing. Page scripts live in ``pyodide_app/`` (``/app/``).
Both folders are package data beside this file, so every install serves them;
``ServerConfig.static_dir`` and ``app_dir`` serve other folders instead.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Response, current_app, jsonify, render_template, request
from flask.typing import ResponseReturnValue

from server.config import ServerConfig
from server.files import REVALIDATE, send_file_from
from server.protocol import CODE_PATTERN, PROTOCOL_VERSION

bp = Blueprint("pages", __name__)
PACKAGE_DIR = Path(__file__).resolve().parent


def static_dir(cfg: ServerConfig) -> Path:
    return cfg.static_dir if cfg.static_dir is not None else PACKAGE_DIR / "static"


def app_dir(cfg: ServerConfig) -> Path:
    return cfg.app_dir if cfg.app_dir is not None else PACKAGE_DIR / "pyodide_app"


def _config() -> ServerConfig:
    return current_app.extensions["daisychain.config"]


@bp.get("/")
def index() -> ResponseReturnValue:
    """The join page; ``?room=CODE`` is read by the page itself, the server only serves it."""
    folder = static_dir(_config())
    if (folder / "index.html").is_file():
        return send_file_from(folder, "index.html", REVALIDATE)
    room = request.args.get("room", "")
    html = render_template(
        "placeholder.html",
        room=room if CODE_PATTERN.fullmatch(room) else None,
        bad_room=bool(room) and not CODE_PATTERN.fullmatch(room),
        static_folder=folder.name,
    )
    response = Response(html, mimetype="text/html")
    response.headers["Cache-Control"] = REVALIDATE
    return response


@bp.get("/static/<path:name>")
def static_file(name: str) -> ResponseReturnValue:
    return send_file_from(static_dir(_config()), name, REVALIDATE)


@bp.get("/app/<path:name>")
def app_file(name: str) -> ResponseReturnValue:
    return send_file_from(app_dir(_config()), name, REVALIDATE)


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    """Liveness plus room/peer counts (never identities or codes)."""
    rooms = current_app.extensions["daisychain.signaling"].rooms
    response = jsonify(ok=True, protocol=PROTOCOL_VERSION, **rooms.counts())
    response.headers["Cache-Control"] = "no-store"
    return response
