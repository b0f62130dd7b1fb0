"""A shard whose row groups hold less text than a microbatch: the server joins documents
within one row group, so its slice comes back short, and the run stops saying why (it said
`data server returned 218 bytes, asked for 520`, naming neither the shard nor a cause)."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from pynode import datasource  # noqa: E402


def test_a_row_group_shorter_than_a_microbatch_is_named_with_its_cure(tmp_path):
    from server_testkit import LiveServer

    from server import ServerConfig, create_app

    shard = tmp_path / "rg1.parquet"
    docs = [f"paragraph {i}: a few words." for i in range(40)]  # ~26 bytes a row group
    pq.write_table(pa.table({"text": docs}), shard, row_group_size=1)
    live = LiveServer(create_app(ServerConfig(data_dir=tmp_path / "state",
                                              static_dir=tmp_path / "no-static",
                                              data_urls=(str(shard),))))
    try:
        with pytest.raises(datasource.DataSourceError) as caught:
            datasource.microbatch_bytes(live.url, 1, 0, 0, 2, 32)
    finally:
        live.stop()
    said = str(caught.value)
    assert said.startswith(f"data server {live.url} answered ") and " bytes for a microbatch " \
        "of 64 (2 rows of --seq 32): row group " in said, said
    assert " of rg1.parquet holds less text than that; the shard needs row groups of more " \
        "text (write it with a larger row_group_size), or the run a smaller --seq or " \
        "--microbatch-size" in said, said


def test_a_data_url_given_with_its_data_path_or_of_another_server_says_what_to_give(tmp_path):
    """`--data http://HOST:PORT/data` (SERVER.md's /data section read as the address) was
    answered `404 for http://HOST:PORT/data/data?...`, with no word of what to give."""
    from server_testkit import LiveServer

    from server import ServerConfig, create_app

    live = LiveServer(create_app(ServerConfig(data_dir=tmp_path / "state",
                                              static_dir=tmp_path / "no-static")))
    try:
        said = {}
        for given in (f"{live.url}/data", f"{live.url}/data/", f"{live.url}/other"):
            with pytest.raises(datasource.DataSourceError) as caught:
                datasource.microbatch_bytes(given, 1, 0, 0, 2, 32)
            said[given] = str(caught.value)
    finally:
        live.stop()
    for given in (f"{live.url}/data", f"{live.url}/data/"):
        assert said[given].endswith(f": --data takes the server's own address, {live.url}, "
                                    "not its /data"), said[given]
    assert said[f"{live.url}/other"].endswith(
        ": is it a DaisyChain server (python -m server)? --data takes its address, "
        "http://HOST:PORT"), said
