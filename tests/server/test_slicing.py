"""Slice choice and cutting as pure functions; RangeFile against a counting HTTP server."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_testkit import examples

from server import slicing
from server.rangefile import RangeFile, RangeRequestError


@settings(max_examples=examples(500), deadline=None)
@given(st.text(max_size=400), st.integers(1, 200), st.integers(0, 2**64 - 1))
def test_cut_window_is_whole_characters_of_the_source(text: str, nbytes: int, draw: int) -> None:
    data = text.encode("utf-8", "surrogatepass")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return  # lone surrogates are not text a parquet string column can hold
    window = slicing.cut_window(data, nbytes, draw)
    got = window.text.encode("utf-8")
    assert data[window.start:window.start + len(got)] == got
    assert len(got) <= nbytes
    if len(data) >= nbytes + 3:
        assert len(got) >= nbytes - 3


def test_row_groups_are_weighted_by_rows_and_empty_ones_skipped() -> None:
    counts = collections.Counter(
        slicing.pick_row_group(1, step, 0, (100, 0, 300)) for step in range(4000)
    )
    assert counts[1] == 0
    assert 0.2 < counts[0] / 4000 < 0.3  # expected 0.25
    with pytest.raises(ValueError):
        slicing.pick_row_group(1, 1, 0, (0, 0))


def test_draws_depend_on_every_key_part() -> None:
    base = slicing.draw("doc", 1, 2, 3)
    assert base == slicing.draw("doc", 1, 2, 3)
    assert len({base, slicing.draw("doc", 1, 2, 4), slicing.draw("doc", 1, 3, 3),
                slicing.draw("doc", 2, 2, 3), slicing.draw("offset", 1, 2, 3)}) == 5


def test_gather_wraps_around_the_row_group_once() -> None:
    docs = ["aa", "bbb", "c"]
    assert slicing.gather_documents(docs, 1, 4) == b"bbb\n\nc"
    assert slicing.gather_documents(docs, 2, 100) == b"c\n\naa\n\nbbb"
    assert slicing.gather_documents(docs, 0, 1) == b"aa"


def test_rangefile_reads_exact_ranges(shard_dir, range_server) -> None:
    served = range_server(shard_dir)
    path = shard_dir / "000_00000.parquet"
    data = path.read_bytes()
    f = RangeFile(f"{served.base}/{path.name}")
    assert f.size == len(data) and served.bytes_sent == 8
    for start, length in ((0, 4), (1000, 3000), (len(data) - 8, 8), (len(data) - 20, 100)):
        f.seek(start)
        assert f.read(length) == data[start:start + length]
    assert f.bytes_fetched == served.bytes_sent == 8 + 4 + 3000 + 20  # tail read once


def test_rangefile_refuses_a_server_without_ranges(shard_dir, range_server) -> None:
    plain = range_server(shard_dir, honor_range=False)
    with pytest.raises(RangeRequestError):
        assert RangeFile(f"{plain.base}/000_00000.parquet").size
