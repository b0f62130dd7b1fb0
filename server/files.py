"""Sending files with the MIME types browsers insist on and explicit caching headers.

``mimetypes`` depends on the host (/etc/mime.types, the Windows registry); WebAssembly
streaming compilation refuses anything but application/wasm and module scripts need a
JavaScript type, so the types that matter are fixed here.
"""

from __future__ import annotations

from pathlib import Path

from flask import Response, abort, send_from_directory

MIME_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".json": "application/json",
    ".map": "application/json",
    ".wasm": "application/wasm",
    ".zip": "application/zip",
    ".whl": "application/zip",
    ".tar": "application/x-tar",
    ".py": "text/x-python",
    ".txt": "text/plain",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".npz": "application/octet-stream",
}
REVALIDATE = "no-cache"  # cache, but ask (ETag) every time: the page and our own scripts


def mime_type(name: str) -> str:
    return MIME_TYPES.get(Path(name).suffix.lower(), "application/octet-stream")


def send_file_from(folder: Path, name: str, cache_control: str) -> Response:
    """``folder/name`` (no traversal, no dotfiles) with a fixed MIME type and caching."""
    if any(part.startswith(".") for part in Path(name).parts):
        abort(404)
    response = send_from_directory(folder, name, mimetype=mime_type(name), conditional=True,
                                   etag=True, max_age=None)
    response.headers["Cache-Control"] = cache_control
    return response
