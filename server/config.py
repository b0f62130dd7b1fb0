"""Server configuration: one frozen dataclass, built from defaults, a dict, or the CLI."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pynode.core.errors import DaisyError
from pynode.core.optim import is_real
from server.ice import ICE_SCHEMES, TURN_SCHEMES

# FineWeb-Edu's sample-10BT: 14 parquet shards of ~2 GB (resolve URLs redirect to the HF CDN).
FINEWEB_EDU_10BT = tuple(
    "https://huggingface.co/datasets/HuggingFaceFW/fineweb-edu/resolve/main/"
    f"sample/10BT/{i:03d}_00000.parquet"
    for i in range(14)
)

# Everything the page loads comes from this server; the browser enforces it too.
DEFAULT_CSP = (
    "default-src 'self'; "
    "script-src 'self' 'unsafe-inline' 'unsafe-eval' 'wasm-unsafe-eval' blob:; "
    "worker-src 'self' blob:; connect-src 'self'; img-src 'self' data: blob:; "
    "style-src 'self' 'unsafe-inline'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)


ORIGIN_PATTERN = re.compile(r"https?://[^/\s]+")

PATH_FIELDS = ("static_dir", "app_dir", "runtime_dir", "bundle_file", "data_dir", "corpus_path")


class ServerConfigError(DaisyError, ValueError):
    """A server setting that cannot work (named field, reason)."""


def default_data_dir() -> Path:
    """``$DAISYCHAIN_SERVER_DATA`` or ``<cache>/server`` (cache: ``$DAISYCHAIN_CACHE``)."""
    env = os.environ.get("DAISYCHAIN_SERVER_DATA")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("DAISYCHAIN_CACHE")
    root = Path(cache).expanduser() if cache else Path.home() / ".cache" / "daisychain"
    return root / "server"


@dataclass(frozen=True)
class ServerConfig:
    # --- network
    host: str = "127.0.0.1"  # bind address; 0.0.0.0 to serve a LAN
    port: int = 8000  # TCP port; 0 picks a free one
    # Header a trusted reverse proxy sets to the client's address (e.g. "X-Forwarded-For").
    # Off (None) by default: any client could forge it, and it decides auto-rooms.
    trust_proxy_header: str | None = None
    proxy_hops: int = 1  # how many trusted proxies append to that header (rightmost wins)
    # Origins whose pages may open /ws; empty: the server's own (the request's Host), "*": any.
    # Clients that send no Origin (native peers) are always let in.
    allowed_origins: tuple[str, ...] = ()
    # --- limits of `python -m server` (gevent); see docs/SERVER.md "Limits"
    max_connections: int = 0  # open sockets at most; 0: what the descriptor limit allows
    max_conns_per_address: int = 256  # open sockets per client address (not behind a proxy)
    header_timeout_s: float = 10.0  # a request's line and headers must arrive within this
    # --- files
    static_dir: Path | None = None  # the page; None: the package's server/static/
    app_dir: Path | None = None  # page scripts; None: the package's server/pyodide_app/
    runtime_dir: Path | None = None  # Pyodide runtime; None: server.runtime.runtime_dir()
    bundle_file: Path | None = None  # a prebuilt pynode bundle; None: build from the package
    data_dir: Path | None = None  # persistent server state (token secret); None: default
    runtime_max_age: int = 86400  # Cache-Control max-age (s) of runtime files
    content_security_policy: str = DEFAULT_CSP  # sent with every response
    # --- signaling
    secret: str | None = None  # HMAC key of resume tokens; None: persisted in data_dir
    token_ttl_s: int = 7 * 86400  # lifetime of a resume token
    max_frame_bytes: int = 65536  # largest accepted frame (an SDP offer fits)
    hard_frame_bytes: int = 262144  # frames above this close the socket unread
    rate_per_s: float = 50.0  # sustained frames per second per connection
    rate_burst: int = 200  # frames a connection may send at once
    bytes_per_s: float = 262144.0  # sustained inbound bytes per second per connection
    max_strikes: int = 20  # rejected frames tolerated (refilling 1 per 5 s) before closing
    ws_ping_s: float = 25.0  # websocket ping interval; a peer silent for two is dropped
    send_queue: int = 512  # outbound frames buffered per peer; a peer that lags more is cut
    send_queue_bytes: int = 1 << 20  # outbound bytes buffered per peer; likewise
    max_ws_per_address: int = 64  # open signaling sockets per client address
    max_rooms_per_address: int = 16  # private rooms an address has created and that exist
    max_pending_per_address: int = 16  # pending joins of one address in one room
    max_rooms: int = 10000  # rooms held at once
    max_room_peers: int = 64  # connected peers per room, pending included
    room_idle_s: float = 120.0  # a room with nobody connected is forgotten after this
    # --- /dashboard: native runs that report their status (--dashboard URL)
    max_runs: int = 64  # runs held at once; the one reported least recently goes first
    run_idle_s: float = 3600.0  # a run that has not reported for this long is forgotten
    # --- /api/uploads: a text file a room's leader uploads for its run (server/uploads.py)
    max_upload_bytes: int = 64 << 20  # largest file accepted
    max_uploads: int = 8  # uploaded texts kept in data_dir; the oldest goes first
    # --- ICE (docs/NETWORKS.md): handed to peers once approved, never to pending ones
    ice_servers: tuple[str, ...] = ()  # stun:/stuns:/turn:/turns: URLs
    # coturn's static-auth-secret; None: $DAISYCHAIN_TURN_SECRET. Needed for turn: URLs.
    turn_secret: str | None = None
    turn_ttl_s: int = 3600  # lifetime of a peer's TURN credential
    ice_relay_only: bool = False  # peers use relayed (TURN) candidates only, for tests
    # --- /data
    data_urls: tuple[str, ...] = FINEWEB_EDU_10BT  # parquet shards: http(s) URLs or local paths
    data_timeout_s: float = 15.0  # per HTTP request to a shard
    data_cache_bytes: int = 256 << 20  # text of recently read row groups kept in memory
    data_retry_s: float = 30.0  # after a shard fails, serve the fallback this long untried
    data_max_bytes: int = 1 << 20  # largest slice a client may ask for
    corpus_path: Path | None = None  # built-in fallback text; None: pynode/data/corpus.txt
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # Flask config overrides

    def __post_init__(self) -> None:
        self._check_types()
        # Accept JSON-style values (str paths, a list or one str of URLs) from any caller.
        for name in PATH_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        urls = self.data_urls
        origins = self.allowed_origins
        object.__setattr__(self, "allowed_origins",
                           (origins,) if isinstance(origins, str) else tuple(origins))
        object.__setattr__(self, "data_urls", (urls,) if isinstance(urls, str) else tuple(urls))
        ice = self.ice_servers
        object.__setattr__(self, "ice_servers", (ice,) if isinstance(ice, str) else tuple(ice))
        if self.turn_secret is None and os.environ.get("DAISYCHAIN_TURN_SECRET"):
            object.__setattr__(self, "turn_secret", os.environ["DAISYCHAIN_TURN_SECRET"])
        self._check_ice()
        _check_positive(self, ("rate_per_s", "rate_burst", "bytes_per_s", "max_strikes",
                               "send_queue", "max_rooms", "max_room_peers", "token_ttl_s",
                               "data_timeout_s", "data_max_bytes", "proxy_hops", "ws_ping_s",
                               "data_retry_s", "max_conns_per_address", "header_timeout_s",
                               "send_queue_bytes", "max_ws_per_address",
                               "max_rooms_per_address", "max_pending_per_address",
                               "turn_ttl_s", "max_runs", "run_idle_s",
                               "max_upload_bytes", "max_uploads"))
        if self.max_connections < 0:
            raise ServerConfigError(f"max_connections must be >= 0, got {self.max_connections}")
        for origin in self.allowed_origins:
            if origin != "*" and not ORIGIN_PATTERN.fullmatch(origin):
                raise ServerConfigError(
                    f"allowed_origins entries are scheme://host[:port] or *, not {origin!r}")
        if not 0 <= self.port <= 65535:
            raise ServerConfigError(f"port must be in 0..65535, got {self.port}")
        if not 1024 <= self.max_frame_bytes <= self.hard_frame_bytes:
            raise ServerConfigError(
                f"need 1024 <= max_frame_bytes ({self.max_frame_bytes}) <= hard_frame_bytes "
                f"({self.hard_frame_bytes})"
            )
        if self.data_cache_bytes < 0 or self.room_idle_s < 0:
            raise ServerConfigError("data_cache_bytes and room_idle_s must be >= 0")
        if not self.data_urls:
            raise ServerConfigError("data_urls must name at least one parquet shard")
        if self.trust_proxy_header is not None and not self.trust_proxy_header.strip():
            raise ServerConfigError("trust_proxy_header must be a header name or None")

    def _check_types(self) -> None:
        """Each field of the kind its annotation names (a --config file's "port": "abc" was a
        TypeError's traceback): a named ServerConfigError otherwise."""
        for f in fields(self):
            value = getattr(self, f.name)
            kind = str(f.type).removesuffix(" | None")
            if value is None and str(f.type).endswith("| None"):
                continue
            if kind == "int" and isinstance(value, float) and value.is_integer():
                value = int(value)  # JSON's 1e6 (and 1000000.0) is a whole number
                object.__setattr__(self, f.name, value)
            wanted = FIELD_KINDS.get(kind)
            if wanted is not None and not wanted[1](value):
                raise ServerConfigError(f"{f.name} must be {wanted[0]}, got {value!r}")

    def _check_ice(self) -> None:
        for url in self.ice_servers:
            if not isinstance(url, str) or not url.startswith(ICE_SCHEMES) or " " in url:
                raise ServerConfigError(
                    f"ice_servers entries are stun:, stuns:, turn: or turns: URLs, not {url!r}")
        has_turn = any(u.startswith(TURN_SCHEMES) for u in self.ice_servers)
        if has_turn and not self.turn_secret:
            raise ServerConfigError("a turn: ICE server needs turn_secret (--turn-secret or "
                                    "$DAISYCHAIN_TURN_SECRET): coturn's static-auth-secret")
        if self.ice_relay_only and not has_turn:
            raise ServerConfigError("ice_relay_only needs a turn: ICE server to relay through")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerConfig:
        """Build from a mapping (JSON-style values: paths as str, lists for tuples)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ServerConfigError(f"unknown server config keys: {', '.join(unknown)}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view, for logs and /healthz (the secret is never included)."""
        out = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
        out["secret"] = None if self.secret is None else "<set>"
        out["turn_secret"] = None if self.turn_secret is None else "<set>"
        out["ice_servers"] = list(self.ice_servers)
        out["data_urls"] = list(self.data_urls)
        out["allowed_origins"] = list(self.allowed_origins)
        return out


def _text_or_texts(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, list | tuple)
                                      and all(isinstance(v, str) for v in value))


# A field's annotation -> (what it must be, in words; the test of a value)
FIELD_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "Path": ("a path (a string)", lambda v: isinstance(v, str | os.PathLike)),
    "tuple[str, ...]": ("a string or a list of strings", _text_or_texts),
}


def _check_positive(cfg: ServerConfig, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not is_real(value) or value <= 0:
            raise ServerConfigError(f"{name} must be a positive finite number, got {value!r}")


def as_config(config: ServerConfig | dict[str, Any] | None) -> ServerConfig:
    if config is None:
        return ServerConfig()
    if isinstance(config, ServerConfig):
        return config
    if isinstance(config, dict):
        return ServerConfig.from_dict(config)
    raise ServerConfigError(f"config must be a ServerConfig, dict or None, not {type(config)}")
