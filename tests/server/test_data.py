"""/data against FineWeb-Edu-shaped shards on a local range-capable server that counts bytes."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from server import create_app

B = 300  # bytes per slice in these tests
SHARDS = ("000_00000.parquet", "001_00000.parquet")
# What /data says of a shard it skips while it backs off from a failure: the same words.
RETRY = re.compile(r"shard \S+: .+; the server tries it again in ([1-9]|[12][0-9]|30) s")


def footer_bytes(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[-8:-4], "little") + 8


def chunk_bytes(path: Path, group: int, column: str | None = None) -> int:
    """Compressed size of one column chunk, or of the whole row group when column is None."""
    meta = pq.read_metadata(path).row_group(group)
    cols = [meta.column(i) for i in range(meta.num_columns)]
    return sum(c.total_compressed_size for c in cols if column in (None, c.path_in_schema))


@pytest.fixture
def served(shard_dir, range_server):
    return range_server(shard_dir)


@pytest.fixture
def data_app(make_config, served):
    def build(urls=None, **changes):
        urls = urls or tuple(f"{served.base}/{name}" for name in SHARDS)
        return create_app(make_config(data_urls=urls, **changes))

    return build


def get(app, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return app.test_client().get(f"/data?{query}")


def test_a_slice_costs_the_footer_and_one_text_chunk(data_app, served, shard_dir) -> None:
    app = data_app()
    body = get(app, seed=3, step=5, index=0, bytes=B).json
    assert body["source"] == "parquet"
    path = shard_dir / SHARDS[body["shard"]]
    group = body["row_group"]
    # The bound: footer plus the needed row group, never the whole file...
    assert served.bytes_sent <= footer_bytes(path) + chunk_bytes(path, group)
    assert served.bytes_sent < path.stat().st_size // 4
    # ...and in fact exactly the trailer, the footer and the text column chunk.
    assert served.bytes_sent == footer_bytes(path) + chunk_bytes(path, group, "text")
    assert all(r and r.startswith("bytes=") for r in served.requests)
    before = served.bytes_sent
    for index in range(1, 6):  # the other microbatches of the step come from the cache
        assert get(app, seed=3, step=5, index=index, bytes=B).json["row_group"] == group
    assert served.bytes_sent == before


def test_slice_matches_a_full_local_read(data_app, shard_dir) -> None:
    app = data_app()
    tables = {name: pq.read_table(shard_dir / name) for name in SHARDS}
    for step in range(6):
        for index in range(3):
            body = get(app, seed=11, step=step, index=index, bytes=B).json
            meta = pq.read_metadata(shard_dir / SHARDS[body["shard"]])
            first = sum(meta.row_group(g).num_rows for g in range(body["row_group"]))
            rows = meta.row_group(body["row_group"]).num_rows
            docs = tables[SHARDS[body["shard"]]].column("text").to_pylist()[first:first + rows]
            order = docs[body["row"]:] + docs[:body["row"]]
            joined = "\n\n".join(order).encode("utf-8")
            got = body["text"].encode("utf-8")
            assert joined[body["offset"]:body["offset"] + len(got)] == got
            assert B - 3 <= body["nbytes"] == len(got) <= B


def test_same_request_same_text_on_a_cold_server(data_app) -> None:
    first, second = data_app(), data_app()
    params = [dict(seed=s, step=t, index=i, bytes=B) for s in (1, 2) for t in (0, 7)
              for i in (0, 1)]
    answers = [get(first, **p).json for p in params]
    assert answers == [get(second, **p).json for p in params]
    assert len({a["text"] for a in answers}) == len(answers)


def test_unreachable_source_falls_back_with_a_marker(make_config, closed_port) -> None:
    app = create_app(make_config())  # make_config points at a closed loopback port
    body = get(app, seed=1, step=2, index=3, bytes=B).json
    assert body["source"] == "builtin"
    # in words, naming the shard: it was "shard 0 unavailable: URLError: <urlopen error
    # [Errno 111] Connection refused>" (a trial)
    assert body["reason"] == (f"shard http://127.0.0.1:{closed_port}/shard.parquet: "
                              "connection refused; the server tries it again in 30 s")
    corpus, _ = app.extensions["daisychain.data"].corpus()
    got = body["text"].encode("utf-8")
    assert corpus[body["offset"]:body["offset"] + len(got)] == got
    again = get(app, seed=1, step=2, index=3, bytes=B).json
    assert RETRY.fullmatch(again.pop("reason")), body["reason"]
    assert again == {k: v for k, v in body.items() if k != "reason"}
    strict = get(app, seed=1, step=2, index=3, bytes=B, fallback=0)
    assert strict.status_code == 503 and strict.json["error"] == "source_unavailable"
    assert strict.headers["Cache-Control"] == "no-store"


def test_a_failing_shard_is_not_retried_at_once(data_app, served) -> None:
    app = data_app(urls=(f"{served.base}/not_parquet.parquet",))
    body = get(app, seed=0, step=0, index=0, bytes=B).json
    assert body["source"] == "builtin" and body["reason"] == (
        f"shard {served.base}/not_parquet.parquet: not a parquet file (no PAR1 trailer); "
        "the server tries it again in 30 s")
    asked = len(served.requests)
    body = get(app, seed=0, step=1, index=0, bytes=B).json
    assert body["source"] == "builtin" and RETRY.fullmatch(body["reason"]), body["reason"]
    assert len(served.requests) == asked


def test_a_server_ignoring_range_is_refused_not_downloaded(make_config, shard_dir,
                                                           range_server) -> None:
    plain = range_server(shard_dir, honor_range=False)
    app = create_app(make_config(data_urls=(f"{plain.base}/{SHARDS[0]}",)))
    body = get(app, seed=0, step=0, index=0, bytes=B).json
    assert body["source"] == "builtin"
    assert body["reason"].startswith(f"shard {plain.base}/{SHARDS[0]}: {plain.base}/"
                                     f"{SHARDS[0]} answered 200 to a range request"), body


def test_redirects_and_local_paths_work(data_app, served, shard_dir) -> None:
    via_redirect = data_app(urls=(f"{served.base}/redirect/{SHARDS[0]}",))
    local = data_app(urls=(str(shard_dir / SHARDS[0]),))
    a = get(via_redirect, seed=4, step=4, index=4, bytes=B).json
    b = get(local, seed=4, step=4, index=4, bytes=B).json
    # the shards' kind, not FineWeb's name: an operator's own files are no FineWeb
    assert a["source"] == b["source"] == "parquet"
    assert a["text"] == b["text"] and a["row"] == b["row"]
    # a file on the server is named, not placed: its folder is the operator's business
    assert a["url"] == f"{served.base}/redirect/{SHARDS[0]}" and b["url"] == SHARDS[0]


def test_a_text_column_that_holds_no_text_is_a_named_shard_error(data_app, tmp_path) -> None:
    """Was a 500 with a traceback (the slicer encoded integers as text)."""
    import pyarrow as pa

    path = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": list(range(50))}), path)
    app = data_app(urls=(str(path),))
    body = get(app, seed=1, step=2, index=3, bytes=B).json
    assert body["source"] == "builtin"
    assert body["reason"] == ("shard numbers.parquet: its 'text' column holds int64, not "
                              "text; the server tries it again in 30 s")
    assert str(tmp_path) not in body["reason"]
    strict = get(app, seed=1, step=3, index=3, bytes=B, fallback=0)
    assert strict.status_code == 503 and strict.json["error"] == "source_unavailable"


def test_concurrent_requests_fetch_a_row_group_once(data_app, served, shard_dir) -> None:
    service = data_app().extensions["daisychain.data"]
    results = []

    def ask(index: int) -> None:
        results.append(service.slice(9, 9, index, B))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    path = shard_dir / SHARDS[results[0]["shard"]]
    assert {r["row_group"] for r in results} == {results[0]["row_group"]}
    assert served.bytes_sent == footer_bytes(path) + chunk_bytes(
        path, results[0]["row_group"], "text")


def test_custom_corpus_and_bad_queries(make_config, tmp_path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("héllo wörld " * 100)
    app = create_app(make_config(corpus_path=corpus, data_max_bytes=1000))
    body = get(app, seed=5, step=0, index=0, bytes=50).json
    assert body["corpus"] == "corpus.txt" and body["text"] in corpus.read_text()
    for query in ("seed=1&step=1", "seed=-1&step=0&index=0", "seed=x&step=0&index=0",
                  "seed=1&step=1&index=1&bytes=0", "seed=1&step=1&index=1&bytes=1001",
                  "seed=99999999999999999999&step=1&index=1"):
        response = app.test_client().get(f"/data?{query}")
        assert response.status_code == 400 and response.json["error"] == "bad_request"


def test_a_shard_too_short_for_a_trailer_is_named_as_no_parquet(data_app, tmp_path) -> None:
    """An empty file was `OSError: [Errno 22] Invalid argument` (a seek before its start)."""
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    body = get(data_app(urls=(str(empty),)), seed=0, step=0, index=0, bytes=B).json
    assert body["source"] == "builtin"
    assert body["reason"] == ("shard empty.parquet: not a parquet file (0 bytes); the server "
                              "tries it again in 30 s")


def test_text_stored_as_a_dictionary_is_text(data_app, tmp_path) -> None:
    """A pandas `category` column written to parquet: a dictionary of strings. The check
    for a text column must not refuse it (it trained before that check existed)."""
    import pyarrow as pa

    path = tmp_path / "category.parquet"
    docs = [f"document {i} " * 20 for i in range(40)]
    pq.write_table(pa.table({"text": pa.array(docs).dictionary_encode()}), path)
    body = get(data_app(urls=(str(path),)), seed=1, step=2, index=3, bytes=B).json
    assert body["source"] == "parquet" and body["text"] in "\n\n".join(docs * 2)


def test_a_local_shard_given_as_a_file_url_keeps_its_folder_to_itself(data_app,
                                                                      tmp_path) -> None:
    gone = f"file://{tmp_path}/gone.parquet"
    body = get(data_app(urls=(gone,)), seed=0, step=0, index=0, bytes=B).json
    assert body["source"] == "builtin" and "gone.parquet" in body["reason"]
    assert str(tmp_path) not in body["reason"], body["reason"]
    # in words, as a person reads it (it was Python's FileNotFoundError repr; a trial)
    assert body["reason"] == ("shard gone.parquet: No such file or directory; the server "
                              "tries it again in 30 s"), body["reason"]


def test_a_shard_that_cannot_be_read_is_named_with_its_cause_in_words(data_app,
                                                                      served) -> None:
    """It was "shard 0 unavailable: HTTPError: HTTP Error 404: NOT FOUND (retrying in 29 s)":
    an index nobody sees, Python's repr, and a retry the trainer read as its own."""
    missing = f"{served.base}/missing.parquet"
    app = data_app(urls=(missing,))
    said = f"shard {missing}: HTTP 404 Not Found; the server tries it again in"
    body = get(app, seed=0, step=0, index=0, bytes=B).json
    assert body["source"] == "builtin" and body["reason"] == f"{said} 30 s"
    again = get(app, seed=0, step=1, index=0, bytes=B).json
    assert again["reason"].startswith(said) and RETRY.fullmatch(again["reason"])
    # what a trainer without --data-fallback builtin prints: the 503's message
    strict = get(app, seed=0, step=2, index=0, bytes=B, fallback=0)
    assert strict.status_code == 503 and strict.json["error"] == "source_unavailable"
    assert strict.json["message"].startswith(said) and RETRY.fullmatch(strict.json["message"])
    for reply in (body["reason"], again["reason"], strict.json["message"]):
        assert "Error" not in reply and "shard 0" not in reply, reply


def test_an_empty_remote_shard_is_said_as_an_empty_local_one_is_at_start(
        data_app, range_server, tmp_path) -> None:
    """A shard with a text column and no rows: every slice failed with "the shard has no
    rows". A local one is refused at start (test_config_cli); a remote one is found when
    first read, and said in the same words."""
    import pyarrow as pa

    from server.__main__ import local_shard_problem

    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    url = f"{range_server(tmp_path).base}/empty.parquet"
    body = get(data_app(urls=(url,)), seed=0, step=0, index=0, bytes=B).json
    at_start = local_shard_problem((str(path),))
    assert at_start == f"{path}: no rows (its 'text' column is empty)"
    assert body["source"] == "builtin"
    assert body["reason"] == (f"shard {url}: {at_start.removeprefix(f'{path}: ')}; the server "
                              "tries it again in 30 s")
