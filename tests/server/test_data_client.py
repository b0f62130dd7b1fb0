"""`python -m pynode train --data URL` against a real server whose shards are, or are not,
reachable: the run never trains on other text than it asked for without saying so.

The server is the real threaded one (LiveServer); its shard is a FineWeb-Edu-shaped
parquet file on disk, or a closed port.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the run harness
from pynode_runs import Launched  # noqa: E402

pytestmark = pytest.mark.slow  # four training interpreters at once

TINY = ["--width", "32", "--layers", "1", "--heads", "2", "--seq", "16", "--microbatch-size",
        "2", "--microbatches", "2", "--no-progress", "--kernels", "numpy"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shard_dir):
    """The same 2-step run against a server without reachable shards (alone, as a group,
    and with --data-fallback builtin) and against one serving a local parquet file (what
    `python -m server --data-url FILE.parquet` does; tests/server/test_data.py reads shards
    over HTTP ranges)."""
    from server_testkit import LiveServer

    from server import ServerConfig, create_app

    folder = tmp_path_factory.mktemp("data-client")
    config = {"data_dir": folder / "state", "static_dir": folder / "no-static"}
    down = LiveServer(create_app(ServerConfig(**config, data_urls=("http://127.0.0.1:9/x",))))
    up = LiveServer(create_app(ServerConfig(
        **config, data_urls=(str(shard_dir / "000_00000.parquet"),))))
    train = ["train", "--steps", "2", *TINY]
    try:
        started = {
            "down": Launched(folder, "down", [*train, "--data", down.url,
                                              "--save", str(folder / "down.pt")]),
            "down_group": Launched(folder, "down_group", [*train, "--data", down.url,
                                                          "--peers", "2"]),
            "fallback": Launched(folder, "fallback", [*train, "--data", down.url,
                                                      "--data-fallback", "builtin"]),
            "up": Launched(folder, "up", [*train, "--data", up.url]),
        }
        done = {name: run.wait() for name, run in started.items()}
    finally:
        down.stop()
        up.stop()
    done["folder"] = folder
    return done


def test_a_server_without_its_shards_stops_the_run_naming_the_flag(runs):
    done = runs["down"]
    assert done.rc == 2, done.err[-3000:]
    last = done.err.strip().splitlines()[-1]
    assert last.startswith("error: DataSourceError: data server http://127.0.0.1:"), last
    assert "cannot read its shards" in last and "--data-fallback builtin" in last
    # the shard by its URL, the cause in words, and who retries (it was "shard 0
    # unavailable: URLError: <urlopen error [Errno 111] Connection refused>")
    assert "(shard http://127.0.0.1:9/x: connection refused; the server tries it again in " \
        in last, last
    assert "Traceback" not in done.err and done.log == []
    assert not (runs["folder"] / "down.pt").exists()


def test_a_group_does_not_mix_in_other_text_either(runs):
    done = runs["down_group"]
    assert done.rc != 0, done.err[-3000:]
    assert "DataSourceError" in done.err and "cannot read its shards" in done.err
    assert "Traceback" not in done.err and done.log == []


def test_with_the_flag_the_built_in_text_serves_and_says_so_once(runs):
    done = runs["fallback"]
    assert done.rc == 0, done.err[-3000:]
    warnings = [line for line in done.err.splitlines() if "serves the built-in corpus" in line]
    assert len(warnings) == 1, done.err
    assert warnings[0].startswith("WARNING") and "--data-fallback builtin" in warnings[0]
    assert [row["step"] for row in done.log] == [1, 2]


def test_reachable_shards_train_without_a_word_about_fallbacks(runs):
    done, fallback = runs["up"], runs["fallback"]
    assert done.rc == 0, done.err[-3000:]
    assert "built-in" not in done.err and "WARNING" not in done.err
    assert [row["step"] for row in done.log] == [1, 2]
    assert done.hashes != fallback.hashes  # it really trained on the shard's text


def test_the_server_refuses_a_local_shard_that_is_not_there(tmp_path, capsys):
    from server.__main__ import main

    missing = tmp_path / "none.parquet"
    assert main(["--port", "0", "--data-dir", str(tmp_path), "--data-url", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"error: data shard {missing}: no such file" in err
    # a folder of shards is named as a folder, not as missing (a trial)
    folder = tmp_path / "shards"
    folder.mkdir()
    assert main(["--port", "0", "--data-dir", str(tmp_path), "--data-url", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"error: data shard {folder}: is a folder: give each parquet file in it" in err, err


def test_a_data_server_nobody_runs_is_said_as_such(capsys):
    """--data at a port where nothing listens: the run is refused saying so and what to do
    (it showed urllib's `<urlopen error [Errno 111] ...>` after an internal /data URL)."""
    import socket

    from pynode.cli.main import main

    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert main(["train", "--data", f"http://127.0.0.1:{port}", "--steps", "1",
                 "--kernels", "numpy", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"data server http://127.0.0.1:{port} cannot be reached: nothing listens there " \
           "(connection refused): is the server running" in err, err
    assert "urlopen" not in err and "/data?" not in err and "Traceback" not in err


@pytest.mark.parametrize("in_page", [False, True])
def test_what_to_do_about_a_data_server_is_said_in_the_words_of_its_runtime(monkeypatch,
                                                                           in_page):
    """A server that cannot be reached, or cannot read its shards: the hint named --data
    builtin and --data-fallback, flags that mean nothing in the page (pynode.browser runs
    the same code); a tab is told of its run form's text field instead."""
    import io
    from urllib.error import HTTPError, URLError

    from pynode import datasource, platform

    monkeypatch.setattr(platform, "IN_PYODIDE", in_page)
    flags = ("--data builtin", "--data-fallback", "python -m server")
    page = 'a run with text "built-in corpus" (the run form) needs'

    def refused(*_args, **_kwargs):
        raise URLError(ConnectionRefusedError(111, "Connection refused"))

    def unreadable(url, *_args, **_kwargs):
        body = b'{"error": "source_unavailable", "message": "shard 0 unavailable"}'
        raise HTTPError(url, 503, "Service Unavailable", None, io.BytesIO(body))  # type: ignore[arg-type]

    for answer, what in ((refused, "cannot be reached: nothing listens there"),
                         (unreadable, "cannot read its shards (shard 0 unavailable)")):
        monkeypatch.setattr(datasource, "http_get_text", answer)
        with pytest.raises(datasource.DataSourceError) as caught:
            datasource.server_slice("http://127.0.0.1:9", {"seed": 1}, "none")
        said = str(caught.value)
        assert f"data server http://127.0.0.1:9 {what}" in said, said
        if in_page:
            assert page in said and not any(flag in said for flag in flags), said
        else:
            assert page not in said and any(flag in said for flag in flags[:2]), said


@pytest.mark.parametrize("read", ["server", "text"])
def test_a_server_that_takes_the_connection_and_never_answers_is_said(monkeypatch, caplog,
                                                                       read):
    """A data server (--data http://HOST:PORT) or a run's text URL (URL#sha256=...) that
    accepts and hangs: a line once it is slow, then the timeout in words (the run sat
    silent for the whole 30 s, a trial)."""
    import socket
    import time

    from pynode import datasource, platform

    hangs = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), never answers
    address = f"http://127.0.0.1:{hangs.getsockname()[1]}"
    monkeypatch.setattr(platform, "SLOW_ANSWER_S", 0.2)
    monkeypatch.setattr(platform, "HTTP_TIMEOUT_S", 1.5)
    started = time.monotonic()
    try:
        with caplog.at_level("WARNING", logger="pynode.datasource"), \
                pytest.raises(datasource.DataSourceError) as raised:
            if read == "server":
                datasource.server_slice(address, {"rows": 1, "length": 8}, "none")
            else:
                datasource.url_text(f"{address}/t.txt#sha256={'0' * 64}")
    finally:
        hangs.close()
    assert 1.4 < time.monotonic() - started < 10
    what, failed = ((f"data server {address}", "cannot be reached") if read == "server" else
                    (f"the run's text {address}/t.txt", "could not be read"))
    assert f"{what} {failed}: no answer in time (timed out)" in str(raised.value), raised.value
    slow = [r.getMessage() for r in caplog.records if "has not answered" in r.getMessage()]
    assert slow == [f"{what} has not answered in 0.2 s; waiting up to 1.5 s in all"], \
        caplog.text
