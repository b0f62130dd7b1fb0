"""A text file the host uploads for its room: POST /api/uploads, served as /uploads/<sha256>.

The page's leader uploads a text file (or a parquet file with a `text` column, turned into
its text here as `--data FILE.parquet` does); the server keeps the text under its sha256 and
answers with the run's data value ``<server>/uploads/<hex>#sha256=<hex>``. Every peer
reads that whole text once, checks the digest, and slices it exactly as `train --data FILE`
slices the file (pynode.datasource): the same windows, so the same bits. The text must be
UTF-8 (the page reads it as text). The server keeps at most `max_uploads` of them, in its
data folder, the oldest going first.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from flask import Blueprint, Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue

from pynode.datafile import PARQUET_MAGIC, DataFileError, parquet_text

bp = Blueprint("uploads", __name__)
EXTENSION = "daisychain.uploads"
FOLDER = "uploads"


class UploadStore:
    """Uploaded texts by sha256 in `folder` (thread-safe), at most `keep` of them."""

    def __init__(self, folder: Path, keep: int) -> None:
        self.folder, self.keep = folder, keep
        self._lock = threading.Lock()

    def add(self, raw: bytes) -> str:
        """Store the text of `raw`; its sha256. ValueError (the reason) for no usable text."""
        if raw.startswith(PARQUET_MAGIC):
            try:
                raw = parquet_text("the uploaded parquet file", raw)
            except DataFileError as exc:
                raise ValueError(str(exc)) from None
        if not raw:
            raise ValueError("the file holds no text")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"the file is not UTF-8 text (byte {exc.start}): upload a text "
                             "file, or a parquet file with a text column") from None
        if raw.startswith(b"\xef\xbb\xbf"):
            raise ValueError("the file starts with a byte-order mark, which a page's reading "
                             "drops: save it as UTF-8 without one")
        digest = hashlib.sha256(raw).hexdigest()
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / digest
            if not path.exists():
                tmp = path.with_suffix(".part")
                tmp.write_bytes(raw)
                tmp.replace(path)
            path.touch()
            stored = sorted((p for p in self.folder.iterdir() if p.suffix != ".part"),
                            key=lambda p: p.stat().st_mtime)
            for old in stored[:-self.keep]:
                old.unlink(missing_ok=True)
        return digest

    def path(self, digest: str) -> Path | None:
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            return None
        path = self.folder / digest
        return path if path.is_file() else None


def _store() -> UploadStore:
    return current_app.extensions[EXTENSION]


@bp.post("/api/uploads")
def upload() -> ResponseReturnValue:
    cfg = current_app.extensions["daisychain.config"]
    if request.mimetype.startswith("multipart/"):  # a form's envelope is not the text
        return jsonify(error="bad_upload", message="send the file itself as the request "
                       "body (curl --data-binary @FILE), not as a form"), 400
    # the app refuses bodies over 1 MiB (MAX_CONTENT_LENGTH), which refused every upload of
    # 1 MiB or more: this route's limit is max_upload_bytes (read_body reads one byte past it)
    request.max_content_length = cfg.max_upload_bytes + 1
    raw = read_body(cfg.max_upload_bytes)
    if raw is None:
        return jsonify(error="too_big", message=f"an upload holds at most "
                       f"{cfg.max_upload_bytes} bytes"), 413
    try:
        digest = _store().add(raw)
    except ValueError as exc:
        return jsonify(error="bad_upload", message=str(exc)), 400
    base = request.host_url.rstrip("/")
    response = jsonify(sha256=digest, url=f"/uploads/{digest}",
                       data=f"{base}/uploads/{digest}#sha256={digest}")
    response.headers["Cache-Control"] = "no-store"
    return response, 201


def read_body(limit: int) -> bytes | None:
    """The request's body, or None if it holds more than `limit` bytes: read up to one byte
    past the limit, whether its length was announced or it came in chunks (a chunked body
    used to be cut at the limit and accepted)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks, size = [], 0
    while size <= limit:
        chunk = request.stream.read(min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return None if size > limit else b"".join(chunks)


@bp.get("/uploads/<digest>")
def uploaded(digest: str) -> ResponseReturnValue:
    path = _store().path(digest)
    if path is None:
        return jsonify(error="unknown_upload", message=f"no uploaded text {digest[:16]}... "
                       "here (the server keeps the latest few): upload it again"), 404
    response = Response(path.read_bytes(), mimetype="text/plain")
    response.charset = "utf-8"
    response.headers["Cache-Control"] = "public, max-age=31536000, immutable"  # by its digest
    return response
