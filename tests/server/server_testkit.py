"""Test clients and servers of the server tier (imported by conftest.py and test_fuzz.py)."""

from __future__ import annotations

import itertools
import json
import os
import random
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import websocket

from server.app import make_threaded_server

POLL_S = 0.02
# The full suite (`make test`, CI) runs every property test's examples; a quick run
# (README, Tests) a quarter of them.
FULL_SUITE = os.environ.get("PYNODE_FULL_SUITE") == "1" or os.environ.get("CI") == "true"


def examples(full: int) -> int:
    """How many examples a property test runs now: `full` in the full suite."""
    return full if FULL_SUITE else max(100, full // 4)

# Multi-byte characters on purpose: slices must cut at character boundaries.
WORDS = ("the", "learning", "photosynthesis", "river", "équation", "naïve", "数学", "🌼",
         "energy", "students", "cell", "history", "über", "fraction", "Ωmega")


class LiveServer:
    """An app served by the real threaded server on a free loopback port."""

    def __init__(self, app: Any, port: int = 0) -> None:
        """`port`: 0 for a free one, or a stopped server's (this one is its restart)."""
        self.app = app
        self.httpd = make_threaded_server(app, "127.0.0.1", port)
        self.port = self.httpd.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws"
        # A short poll: shutdown() waits for the next poll, 0.5 s by default, in every test.
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(POLL_S,),
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)


class Peer:
    """A websocket client speaking the signaling protocol, with an ordering barrier."""

    _counter = itertools.count(1)

    def __init__(self, ws_url: str, address: str | None = None, source: str | None = None,
                 **options: Any) -> None:
        """``address``: claimed in X-Forwarded-For; ``source``: a loopback address to connect
        from (127.0.0.0/8 is all loopback on Linux), so the server sees it as the peer."""
        headers = [f"X-Forwarded-For: {address}"] if address else []
        if source is not None:
            options["socket"] = bound_socket(ws_url, source)
        self.ws = websocket.create_connection(ws_url, timeout=5, header=headers, **options)
        self.id: str | None = None
        self.token: str | None = None

    def send(self, kind: str, **fields: Any) -> None:
        self.ws.send(json.dumps({"v": 1, "type": kind, **fields}))

    def send_raw(self, raw: str | bytes) -> None:
        if isinstance(raw, bytes):
            self.ws.send_binary(raw)
        else:
            self.ws.send(raw)

    def recv(self) -> dict[str, Any]:
        return json.loads(self.ws.recv())

    def expect(self, kind: str) -> dict[str, Any]:
        msg = self.recv()
        assert msg["type"] == kind, msg
        return msg

    def sync(self) -> list[dict[str, Any]]:
        """Frames that arrive before the pong of a fresh ping: everything already queued."""
        stamp = next(self._counter)
        self.send("ping", t=stamp)
        frames = []
        while True:
            msg = self.recv()
            if msg["type"] == "pong" and msg.get("t") == stamp:
                return frames
            frames.append(msg)

    def join(self, room: str | None = None, token: str | None = None) -> dict[str, Any]:
        fields = {k: v for k, v in (("room", room), ("token", token)) if v is not None}
        self.send("join", **fields)
        joined = self.expect("joined")
        self.id, self.token = joined["peer"], joined["token"]
        return joined

    def create(self) -> str:
        self.send("create")
        joined = self.expect("joined")
        self.id, self.token = joined["peer"], joined["token"]
        return joined["room"]

    def is_closed(self, timeout: float = 5.0) -> bool:
        """True once the server closed the socket (frames still in flight are skipped)."""
        self.ws.settimeout(timeout)
        try:
            while True:
                if self.ws.recv() in ("", b""):
                    return True
        except websocket.WebSocketConnectionClosedException:
            return True
        except (TimeoutError, websocket.WebSocketTimeoutException):
            return False
        except OSError:
            return True

    def close(self) -> None:
        try:
            self.ws.close(timeout=0.5)
        except (OSError, websocket.WebSocketException):
            pass


def bound_socket(url: str, source: str, timeout: float = 5.0) -> socket.socket:
    """A TCP socket from ``source`` connected to the host and port of ``url``."""
    parsed = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as websocket-client's own
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect((parsed.hostname, parsed.port))
    return sock


class RangeServer:
    """Serves files of a folder over HTTP/1.1 with Range support and counts body bytes."""

    def __init__(self, root: Path, honor_range: bool = True) -> None:
        self.root = root
        self.honor_range = honor_range
        self.bytes_sent = 0
        self.requests: list[str | None] = []  # the Range header of each GET
        self._lock = threading.Lock()
        handler = type("Handler", (_RangeHandler,), {"owner": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_port}"
        # A short poll: shutdown() waits for the next poll, 0.5 s by default, in every test.
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(POLL_S,),
                                        daemon=True)
        self._thread.start()

    def count(self, nbytes: int, range_header: str | None) -> None:
        with self._lock:
            self.bytes_sent += nbytes
            self.requests.append(range_header)

    def reset(self) -> None:
        with self._lock:
            self.bytes_sent = 0
            self.requests.clear()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _RangeHandler(BaseHTTPRequestHandler):
    owner: RangeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/redirect/"):
            self.send_response(302)
            self.send_header("Location", "/" + self.path.removeprefix("/redirect/"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = self.owner.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        header = self.headers.get("Range")
        span = _parse_range(header, len(data)) if self.owner.honor_range else None
        if span is None:
            self.send_response(200)
            body = data
        else:
            first, last = span
            body = data[first : last + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        # Counted before writing: the client may act on the body before this thread resumes.
        self.owner.count(len(body), header)
        try:
            self.wfile.write(body)
        except OSError:
            pass


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    if not header or not header.startswith("bytes="):
        return None
    first, _, last = header.removeprefix("bytes=").partition("-")
    if not first:
        return max(0, size - int(last)), size - 1
    return int(first), min(size - 1, int(last)) if last else size - 1


def fineweb_table(rows: int, seed: int = 7) -> pa.Table:
    """Rows in FineWeb-Edu's schema (text, id, dump, url, ...), generated from ``seed``."""
    rnd = random.Random(seed)
    texts = []
    for _ in range(rows):
        words = [rnd.choice(WORDS) for _ in range(rnd.randint(3, 700))]
        texts.append(" ".join(words).capitalize() + ".")
    return pa.table({
        "text": texts,
        "id": [f"<urn:uuid:{rnd.getrandbits(128):032x}>" for _ in range(rows)],
        "dump": [rnd.choice(["CC-MAIN-2013-20", "CC-MAIN-2024-10"]) for _ in range(rows)],
        "url": [f"https://example.org/{i}" for i in range(rows)],
        "date": ["2024-02-21T10:00:00Z"] * rows,
        "file_path": ["s3://commoncrawl/crawl-data/x.warc.gz"] * rows,
        "language": ["en"] * rows,
        "language_score": [rnd.uniform(0.65, 1.0) for _ in range(rows)],
        "token_count": pa.array([len(t) // 4 for t in texts], pa.int64()),
        "score": [rnd.uniform(2.5, 5.0) for _ in range(rows)],
        "int_score": pa.array([rnd.randint(3, 5) for _ in range(rows)], pa.int64()),
    })
