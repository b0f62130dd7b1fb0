"""The page and the Pyodide runtime load from our server alone: no other origin is asked.

Every request of the page and its worker is recorded; any request to another origin is
aborted (as a network limited to the server would), and the page must still boot,
verify its units and gates, and be ready to train.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from browser_helpers import CHROMIUM_FLAGS, status, wait_booted


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def test_page_boots_with_the_network_limited_to_the_server(browser, server_url):
    assert "--disable-background-networking" in CHROMIUM_FLAGS
    requested: list[str] = []
    refused: list[str] = []
    context = browser.new_context()

    def only_our_server(route, request) -> None:
        if request.url.startswith(("data:", "blob:")) or origin(request.url) == server_url:
            route.continue_()
        else:
            refused.append(request.url)
            route.abort()

    context.route("**/*", only_our_server)
    context.on("request", lambda request: requested.append(request.url))
    try:
        page = context.new_page()
        page.goto(f"{server_url}/?create=1")
        wait_booted(page)
        state = status(page)
    finally:
        context.close()
    assert state["state"] == "ready", state
    assert refused == [], f"the page asked other origins: {refused}"
    fetched = [u for u in requested if not u.startswith(("data:", "blob:"))]
    assert fetched and all(origin(u) == server_url for u in fetched), fetched
    names = {urlsplit(u).path.rsplit("/", 1)[-1] for u in fetched}
    assert {"pyodide.asm.wasm", "python_stdlib.zip"} <= names, names
    assert any(name.startswith("numpy-") and name.endswith(".whl") for name in names), names
    assert any(urlsplit(u).path.startswith("/bundle/") for u in fetched), fetched
