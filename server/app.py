"""The app factory and the threaded server that runs it."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response
from werkzeug.serving import BaseWSGIServer, make_server

from server import dashboard, data, pages, runtime_routes, signaling, uploads
from server.config import ServerConfig, as_config, default_data_dir
from server.ice import IceIssuer
from server.revocations import REVOKED_FILE, Revocations
from server.rooms import RoomLimits, Rooms
from server.runs import RunBoard
from server.tokens import TokenSigner, load_secret

log = logging.getLogger(__name__)
CONFIG_EXTENSION = "daisychain.config"


def create_app(config: ServerConfig | dict[str, Any] | None = None) -> Flask:
    """A DaisyChain server app: pages, runtime, signaling (/ws), /data and /dashboard."""
    cfg = as_config(config)
    app = Flask(__name__, static_folder=None)
    app.config.update(
        SOCK_SERVER_OPTIONS={"ping_interval": cfg.ws_ping_s,
                             "max_message_size": cfg.hard_frame_bytes},
        # no route takes a large body (but /api/uploads: max_upload_bytes); refuse them early
        MAX_CONTENT_LENGTH=1 << 20,
    )
    app.config.update(cfg.extra)
    state_dir = cfg.data_dir or default_data_dir()
    secret = load_secret(cfg.secret, state_dir)  # resume tokens and run tokens outlive a restart
    rooms = Rooms(
        TokenSigner(secret, cfg.token_ttl_s),
        RoomLimits(cfg.max_rooms, cfg.max_room_peers, cfg.room_idle_s,
                   cfg.max_rooms_per_address, cfg.max_pending_per_address),
        revocations=Revocations(state_dir / REVOKED_FILE, cfg.token_ttl_s),
        ice=IceIssuer(cfg.ice_servers, cfg.turn_secret, cfg.turn_ttl_s, cfg.ice_relay_only),
    )
    app.extensions[CONFIG_EXTENSION] = cfg
    app.extensions[signaling.EXTENSION] = signaling.SignalingState(
        cfg, rooms, signaling.AddressCounter(cfg.max_ws_per_address))
    app.extensions[data.EXTENSION] = data.DataService(cfg)
    app.extensions[dashboard.EXTENSION] = RunBoard(cfg.max_runs, cfg.run_idle_s, secret=secret)
    app.extensions[uploads.EXTENSION] = uploads.UploadStore(state_dir / uploads.FOLDER,
                                                            cfg.max_uploads)
    for blueprint in (pages.bp, runtime_routes.bp, signaling.bp, data.bp, dashboard.bp,
                      uploads.bp):
        app.register_blueprint(blueprint)
    signaling.sock.init_app(app)

    @app.after_request
    def security_headers(response: Response) -> Response:
        headers = response.headers
        headers.setdefault("Content-Security-Policy", cfg.content_security_policy)
        headers.setdefault("X-Content-Type-Options", "nosniff")
        # Room codes travel in the page URL; never leak them to another site.
        headers.setdefault("Referrer-Policy", "no-referrer")
        headers.setdefault("Cross-Origin-Resource-Policy", "same-origin")
        return response

    return app


def make_threaded_server(app: Flask, host: str, port: int) -> BaseWSGIServer:
    """Werkzeug's threaded server (a thread per connection), which flask-sock supports.

    ``port=0`` binds a free port; read it back from ``server.server_port``.
    """
    return make_server(host, port, app, threaded=True)
