"""DaisyChain server: serves the page, the Pyodide runtime and /data, and relays signaling.

It never sees weights or gradients.

app.py             create_app(config) and the threaded test server; __main__.py is the CLI
serving.py         the production server (gevent, connection gate, header deadlines)
config.py          ServerConfig (one frozen dataclass)
pages.py           /, /static/, /app/, /healthz      files.py  MIME types and caching
runtime_routes.py  /runtime/ (Pyodide) and /bundle/ (pynode zip)
runtime.py         fetching the Pyodide runtime      bundle.py building the pynode zip
signaling.py       /ws connections                   protocol.py  the frame schemas
rooms.py           rooms, approval, relay rules      tokens.py    resume tokens
ratelimit.py       token buckets                     addresses.py client address, auto rooms
data.py            /data                             shards.py / rangefile.py / slicing.py
static/, pyodide_app/  the page and its scripts (package data, like templates/)
"""

from __future__ import annotations

from typing import Any

__all__ = ["ServerConfig", "create_app"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `python -m server` can check for flask & co. and monkey-patch (gevent)
    # before Flask is imported.
    if name == "create_app":
        from server.app import create_app

        return create_app
    if name == "ServerConfig":
        from server.config import ServerConfig

        return ServerConfig
    raise AttributeError(f"module 'server' has no attribute {name!r}")
