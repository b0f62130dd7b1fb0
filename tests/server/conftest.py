"""Fixtures of the server tier: an app on a free loopback port, websocket peers, a
range-capable HTTP server that counts the bytes it sends, and a FineWeb-Edu-shaped shard."""

from __future__ import annotations

import socket
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from server_testkit import LiveServer, Peer, RangeServer, fineweb_table

from server import ServerConfig, create_app

ROWS_PER_GROUP = 120
ROW_GROUPS = 6


# ------------------------------------------------------------------ servers
@pytest.fixture
def make_config(tmp_path: Path, closed_port: int) -> Callable[..., ServerConfig]:
    """A config whose state lives in tmp and whose shard URL refuses connections."""

    def build(**changes: Any) -> ServerConfig:
        values: dict[str, Any] = {
            "data_dir": tmp_path / "state",
            "static_dir": tmp_path / "no-static",
            "data_urls": (f"http://127.0.0.1:{closed_port}/shard.parquet",),
        }
        values.update(changes)
        return ServerConfig(**values)

    return build


@pytest.fixture
def live(make_config: Callable[..., ServerConfig]) -> Iterator[Callable[..., LiveServer]]:
    started: list[LiveServer] = []

    def start(config: ServerConfig | None = None, **changes: Any) -> LiveServer:
        server = LiveServer(create_app(config or make_config(**changes)))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ websocket peers
@pytest.fixture
def peers() -> Iterator[Callable[..., Peer]]:
    opened: list[Peer] = []

    def connect(ws_url: str, address: str | None = None) -> Peer:
        peer = Peer(ws_url, address)
        opened.append(peer)
        return peer

    yield connect
    for peer in opened:
        peer.close()


# ------------------------------------------------------------------ parquet over HTTP
@pytest.fixture
def range_server(tmp_path: Path) -> Iterator[Callable[..., RangeServer]]:
    started: list[RangeServer] = []

    def start(root: Path, honor_range: bool = True) -> RangeServer:
        server = RangeServer(root, honor_range)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def shard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two FineWeb-Edu-shaped shards of several row groups each, plus a non-parquet file."""
    folder = tmp_path_factory.mktemp("shards")
    for i in range(2):
        table = fineweb_table(ROWS_PER_GROUP * ROW_GROUPS, seed=i)
        pq.write_table(table, folder / f"{i:03d}_00000.parquet", row_group_size=ROWS_PER_GROUP)
    (folder / "not_parquet.parquet").write_bytes(b"this is not a parquet file at all" * 10)
    return folder


@pytest.fixture
def bundle_zip(tmp_path: Path) -> Path:
    path = tmp_path / "bundle.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pynode/__init__.py", "__version__ = 'test'\n")
    return path
