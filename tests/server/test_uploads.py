"""/api/uploads and /uploads/<sha256>: a text file a room's leader uploads trains every peer
on exactly the windows `train --data FILE` cuts from that file: the same hashes (natively
here over real HTTP; in the page, e2e/test_page_dashboard.py's sibling runs the same code)."""

from __future__ import annotations

import hashlib
import json
import sys
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pynode_runs import Launched  # noqa: E402

TEXT = "".join(f"line {i}: an uploaded note, é and 数 in it. " for i in range(400)).encode()
CONFIG = ["--steps", "3", "--width", "32", "--layers", "1", "--heads", "2", "--seq", "16",
          "--microbatch-size", "2", "--microbatches", "4", "--no-progress", "--kernels",
          "numpy", "--eval-every", "2"]


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/octet-stream"},
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body.startswith(b"{") else {}


def test_an_uploaded_text_trains_on_the_hashes_of_train_data_file(live, make_config, tmp_path):
    server = live(make_config())
    status, answer = post(f"{server.url}/api/uploads", TEXT)
    assert status == 201 and answer["sha256"] == hashlib.sha256(TEXT).hexdigest()
    assert answer["data"] == f"{server.url}/uploads/{answer['sha256']}#sha256={answer['sha256']}"
    with urllib.request.urlopen(f"{server.url}{answer['url']}") as reply:
        assert reply.read() == TEXT and reply.headers.get_content_charset() == "utf-8"
    local = tmp_path / "notes.txt"
    local.write_bytes(TEXT)
    runs = [Launched(tmp_path, "file", ["train", *CONFIG, "--data", str(local)]),
            Launched(tmp_path, "upload", ["train", *CONFIG, "--data", answer["data"]])]
    file_run, upload_run = (run.wait() for run in runs)
    assert file_run.rc == 0 and upload_run.rc == 0, file_run.err[-2000:] + upload_run.err[-2000:]
    assert [(r["hash"], r.get("heldout")) for r in upload_run.log] == \
        [(r["hash"], r.get("heldout")) for r in file_run.log]
    assert len(file_run.log) == 3 and file_run.log[1]["heldout"] is not None
    builtin = Launched(tmp_path, "builtin", ["train", *CONFIG]).wait()
    assert builtin.hashes != file_run.hashes  # the text mattered


@pytest.mark.parametrize("body, match", [
    (b"", "holds no text"),
    (b"\xff\xfe not utf-8", "not UTF-8 text"),
    (b"\xef\xbb\xbfwith a BOM", "byte-order mark"),
    (b"PAR1 not really parquet", "text"),
    ("int-column", "its 'text' column holds int64, not text"),
])
def test_unusable_uploads_are_refused_by_name(live, make_config, body, match):
    if body == "int-column":  # parquet, with a `text` column of numbers (was a 500)
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"text": [1, 2, 3]}), sink)
        body = sink.getvalue().to_pybytes()
    server = live(make_config())
    status, answer = post(f"{server.url}/api/uploads", body)
    assert status == 400 and answer["error"] == "bad_upload" and match in answer["message"]


def test_an_upload_over_a_mebibyte_is_taken_up_to_max_upload_bytes(live, make_config):
    """The app's 1 MiB limit on request bodies refused every upload of 1 MiB or more with
    Werkzeug's HTML 413, whatever max_upload_bytes said (64 MiB by default)."""
    server = live(make_config())
    text = b"a line of text to train on\n" * (3 << 16)  # 1.7 MiB
    status, answer = post(f"{server.url}/api/uploads", text)
    assert status == 201, (status, answer)
    assert answer["sha256"] == hashlib.sha256(text).hexdigest()
    small = live(make_config(max_upload_bytes=2 << 20))
    assert post(f"{small.url}/api/uploads", b"x" * ((2 << 20) + 1)) == (413, {
        "error": "too_big", "message": f"an upload holds at most {2 << 20} bytes"})


def test_a_big_upload_is_refused_and_the_oldest_text_goes_first(live, make_config):
    server = live(make_config(max_upload_bytes=1000, max_uploads=2))
    assert post(f"{server.url}/api/uploads", b"x" * 1001)[0] == 413
    digests = [post(f"{server.url}/api/uploads", f"text {i} ".encode() * 10)[1]["sha256"]
               for i in range(3)]
    codes = []
    for digest in digests:
        try:
            codes.append(urllib.request.urlopen(f"{server.url}/uploads/{digest}").status)
        except urllib.error.HTTPError as exc:
            codes.append(exc.code)
    assert codes == [404, 200, 200]


def test_a_changed_text_is_refused_by_every_peer(live, make_config):
    from pynode.datasource import DataSourceError, microbatch_bytes

    server = live(make_config())
    answer = post(f"{server.url}/api/uploads", TEXT)[1]
    other = answer["data"].replace(answer["sha256"][-8:], "0" * 8)
    with pytest.raises(DataSourceError, match="answered 404|not the run's text"):
        microbatch_bytes(other, 1, 0, 0, 2, 17)
    windows = microbatch_bytes(answer["data"], 1, 0, 0, 2, 17)
    assert windows.shape == (2, 17)


def post_chunked(url: str, body: bytes, piece: int = 300) -> tuple[int, dict]:
    """POST `body` with Transfer-Encoding: chunked (no Content-Length), as curl does for a
    stream."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    conn.putrequest("POST", where.path)
    conn.putheader("Transfer-Encoding", "chunked")
    conn.putheader("Content-Type", "application/octet-stream")
    conn.endheaders()
    for at in range(0, len(body), piece):
        part = body[at:at + piece]
        conn.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
    conn.send(b"0\r\n\r\n")
    reply = conn.getresponse()
    answer = reply.read()
    conn.close()
    return reply.status, json.loads(answer) if answer.startswith(b"{") else {}


def test_a_chunked_upload_past_the_limit_is_refused_not_cut(live, make_config):
    """A chunked body has no Content-Length: it was cut at max_upload_bytes and stored (a
    text nobody sent). The 413 is JSON like every other refusal; a form's envelope (curl -F)
    is refused, not stored as the text."""
    server = live(make_config(max_upload_bytes=1000))
    status, answer = post_chunked(f"{server.url}/api/uploads", b"x" * 1001)
    assert status == 413 and answer["error"] == "too_big", (status, answer)
    assert post(f"{server.url}/api/uploads", b"x" * 1001) == (413, {
        "error": "too_big", "message": "an upload holds at most 1000 bytes"})
    status, answer = post_chunked(f"{server.url}/api/uploads", b"y" * 1000)
    assert status == 201 and answer["sha256"] == hashlib.sha256(b"y" * 1000).hexdigest()
    form = urllib.request.Request(f"{server.url}/api/uploads", b"--b\r\n\r\ntext\r\n--b--\r\n",
                                  {"Content-Type": "multipart/form-data; boundary=b"},
                                  method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(form, timeout=10)
    assert refused.value.code == 400 and b"--data-binary" in refused.value.read()
