"""The page, the Pyodide runtime and the pynode bundle: MIME types, caching, one origin."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from server import ServerConfig, create_app
from server.pages import app_dir, static_dir

RUNTIME_TYPES = {
    "pyodide.js": "text/javascript",
    "pyodide.mjs": "text/javascript",
    "pyodide.asm.js": "text/javascript",
    "pyodide.asm.wasm": "application/wasm",
    "python_stdlib.zip": "application/zip",
    "pyodide-lock.json": "application/json",
    "numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl": "application/zip",
}
# Absolute or protocol-relative URLs naming a host, where a browser would fetch them.
HOST = r"""//[A-Za-z0-9\[]"""
FETCHING = re.compile(
    r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?""" + HOST
    + r"""|(?:import|from|fetch|importScripts|loadPyodide|new\s+(?:Worker|WebSocket|EventSource))"""
    r"""\s*\(?\s*[^)]{0,80}?["'`](?:https?|wss?):""" + HOST
    + r"""|indexURL\s*:\s*["'`](?:https?:)?""" + HOST
    + r"""|url\(\s*["']?(?:https?:)?""" + HOST,
    re.IGNORECASE,
)


@pytest.fixture
def fake_runtime(tmp_path: Path) -> Path:
    folder = tmp_path / "runtime"
    folder.mkdir()
    for name in RUNTIME_TYPES:
        (folder / name).write_bytes(b"\0asm\1\0\0\0" if name.endswith(".wasm") else b"{}")
    (folder / ".hidden").write_text("secret")
    return folder


def media_type(response) -> str:
    return response.headers["Content-Type"].split(";")[0].strip()


def test_runtime_files_have_browser_mime_types_and_cache(make_config, fake_runtime) -> None:
    client = create_app(make_config(runtime_dir=fake_runtime, runtime_max_age=600)).test_client()
    for name, expected in RUNTIME_TYPES.items():
        response = client.get(f"/runtime/{name}")
        assert response.status_code == 200, name
        assert media_type(response) == expected, name
        assert response.headers["Cache-Control"] == "public, max-age=600"
        etag = response.headers["ETag"]
        again = client.get(f"/runtime/{name}", headers={"If-None-Match": etag})
        assert again.status_code == 304
    assert client.get("/runtime/.hidden").status_code == 404
    assert client.get("/runtime/../../etc/passwd").status_code == 404
    assert client.get("/runtime/nope.js").status_code == 404
    assert client.get("/runtime/").json["files"] == sorted(RUNTIME_TYPES)


def test_missing_runtime_answers_503_with_the_setup_command(make_config, monkeypatch,
                                                             tmp_path) -> None:
    monkeypatch.setenv("DAISYCHAIN_CACHE", str(tmp_path / "empty-cache"))
    client = create_app(make_config()).test_client()
    for url in ("/runtime/pyodide.js", "/runtime/"):
        response = client.get(url)
        assert response.status_code == 503
        assert "python -m server.runtime fetch" in response.json["message"]
        assert response.headers["Cache-Control"] == "no-store"


def test_the_fetched_runtime_if_present(make_config) -> None:
    from server.runtime import RuntimeMissingError, runtime_dir

    try:
        folder = runtime_dir()
    except RuntimeMissingError:
        pytest.skip("Pyodide runtime not fetched (python -m server.runtime fetch)")
    client = create_app(make_config()).test_client()
    for name, expected in RUNTIME_TYPES.items():
        response = client.head(f"/runtime/{name}")
        assert response.status_code == 200 and media_type(response) == expected, name
        assert int(response.headers["Content-Length"]) == (folder / name).stat().st_size


def test_page_is_served_with_its_room_and_a_strict_policy(make_config, tmp_path) -> None:
    client = create_app(make_config()).test_client()
    code = "Abcdefghijklmnopqrstu_"
    page = client.get(f"/?room={code}")
    assert page.status_code == 200 and media_type(page) == "text/html"
    assert code in page.get_data(as_text=True)
    assert page.headers["Cache-Control"] == "no-cache"
    assert page.headers["Referrer-Policy"] == "no-referrer"
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp
    assert not re.search(r"https?://|\*", csp)
    assert "<script>alert" not in client.get("/?room=<script>alert(1)</script>").get_data(
        as_text=True)
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("<!doctype html><title>real page</title>")
    (static / "app.css").write_text("body{}")
    client = create_app(make_config(static_dir=static)).test_client()
    assert "real page" in client.get("/?room=" + code).get_data(as_text=True)
    assert media_type(client.get("/static/app.css")) == "text/css"


def _page_sources(make_config) -> dict[str, str]:
    sources = {"placeholder": create_app(make_config()).test_client().get("/").get_data(
        as_text=True)}
    for folder in (static_dir(ServerConfig()), app_dir(ServerConfig())):
        assert folder.is_dir(), f"{folder} (the page's files) is missing"
        for path in sorted(folder.rglob("*")):
            if path.suffix in (".html", ".js", ".mjs", ".css"):
                sources[str(path.relative_to(folder.parent))] = path.read_text(errors="replace")
    return sources


def test_no_page_file_loads_anything_from_another_origin(make_config) -> None:
    for name, text in _page_sources(make_config).items():
        hits = [m.group(0) for m in FETCHING.finditer(text)]
        assert not hits, f"{name} fetches from another origin: {hits}"


def test_the_origin_scan_catches_a_cdn() -> None:
    for bad in ('<script src="https://cdn.jsdelivr.net/pyodide/v0.27.7/full/pyodide.js">',
                "<link href='//fonts.example.com/x.css'>",
                'importScripts("https://cdn.jsdelivr.net/pyodide.js")',
                'loadPyodide({indexURL: "https://cdn.jsdelivr.net/pyodide/"})',
                "await import('https://esm.sh/x')"):
        assert FETCHING.search(bad), bad
    assert not FETCHING.search('<script src="/runtime/pyodide.js"></script>')
    assert not FETCHING.search('new WebSocket("wss://" + location.host + "/ws")')
    assert FETCHING.search('new WebSocket("wss://signal.example.com/ws")')


def test_bundle_is_served_with_its_hash(make_config, bundle_zip) -> None:
    client = create_app(make_config(bundle_file=bundle_zip)).test_client()
    digest = hashlib.sha256(bundle_zip.read_bytes()).hexdigest()
    response = client.get("/bundle/pynode.zip")
    assert media_type(response) == "application/zip"
    assert response.data == bundle_zip.read_bytes()
    assert response.headers["X-Content-SHA256"] == digest
    assert response.headers["ETag"] == f'"{digest}"'
    assert client.get("/bundle/pynode.zip", headers={"If-None-Match": f'"{digest}"'}
                      ).status_code == 304
    assert client.get("/bundle/manifest.json").json == {
        "url": "/bundle/pynode.zip", "sha256": digest, "size": len(bundle_zip.read_bytes())}


def test_default_bundle_is_built_from_the_installed_package(make_config) -> None:
    from server.bundle import bundle_sha256

    client = create_app(make_config()).test_client()
    response = client.get("/bundle/manifest.json")
    if response.status_code == 503:
        assert response.json["error"] == "bundle_unavailable"
        return
    assert response.json["sha256"] == bundle_sha256()


def test_healthz_reveals_counts_only(make_config) -> None:
    body = create_app(make_config()).test_client().get("/healthz").json
    assert body == {"ok": True, "protocol": 1, "rooms": 0, "peers": 0}


def test_the_pages_run_length_bound_is_pynodes() -> None:
    """The page's MAX_STEPS (app.js) and pynode.config.MAX_STEPS are one bound in two
    languages: a run a native leader may start, the page may start too, and back."""
    from pynode.config import MAX_STEPS

    app = (static_dir(ServerConfig()) / "app.js").read_text()
    (page,) = re.findall(r"^const MAX_STEPS = ([\d_]+);$", app, re.MULTILINE)
    assert int(page.replace("_", "")) == MAX_STEPS
