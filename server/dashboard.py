"""/dashboard and /api/runs: native runs report their status here; anyone may look.

POST /api/runs                       {name, command, world} -> 201 {run, token}
POST /api/runs                       {run, token, name, command, world}: that run again
                                     (the server restarted) -> 201 re-created, 200 known;
                                     403 bad_token: not this id's token under this secret
POST /api/runs/<run>/status          Authorization: Bearer <token>; one rank's status
                                     -> 200 {first_point: the step of the run's first loss
                                     point here, or null}
GET  /api/runs                       {runs: [...]}, newest first (never a token)
GET  /dashboard                      the page that shows them (static/dashboard.html)

The rules of a report live in server/runs.py; here only HTTP.
"""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, request
from flask.typing import ResponseReturnValue

from server.files import REVALIDATE, send_file_from
from server.pages import static_dir
from server.runs import BadTokenError, RunBoard, RunReportError, UnknownRunError

bp = Blueprint("dashboard", __name__)
EXTENSION = "daisychain.runs"


def _board() -> RunBoard:
    return current_app.extensions[EXTENSION]


def _refused(status: int, error: str, message: str) -> ResponseReturnValue:
    return jsonify(error=error, message=message), status


@bp.post("/api/runs")
def register() -> ResponseReturnValue:
    """A new run: 201. A body with the `run` and `token` a server issued (one that restarted
    since): 201 if the run is back under that id, 200 if this server had it (unchanged)."""
    body = request.get_json(silent=True)
    try:
        if isinstance(body, dict) and ("run" in body or "token" in body):
            created = _board().register_again(body)
            run_id, token = body["run"], body["token"]
        else:
            (run_id, token), created = _board().register(body), True
    except BadTokenError as exc:
        return _refused(403, "bad_token", str(exc))
    except RunReportError as exc:
        return _refused(400, "bad_registration", str(exc))
    response = jsonify(run=run_id, token=token, dashboard="/dashboard")
    response.headers["Cache-Control"] = "no-store"
    return response, 201 if created else 200


@bp.post("/api/runs/<run_id>/status")
def report(run_id: str) -> ResponseReturnValue:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme != "Bearer" or not token:
        return _refused(401, "no_token", "a report needs Authorization: Bearer <the run's "
                        "token> (POST /api/runs issued it)")
    try:
        first = _board().report(run_id, token, request.get_json(silent=True))
    except UnknownRunError as exc:
        return _refused(404, "unknown_run", str(exc))
    except RunReportError as exc:
        return _refused(400, "bad_report", str(exc))
    return jsonify(first_point=first), 200


@bp.get("/api/runs")
def runs() -> ResponseReturnValue:
    response = jsonify(runs=_board().views())
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/dashboard")
def dashboard() -> ResponseReturnValue:
    return send_file_from(static_dir(current_app.extensions["daisychain.config"]),
                          "dashboard.html", REVALIDATE)
