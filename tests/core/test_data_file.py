"""`--data FILE`: a run's text from a local text or parquet file, named with its digest.

The runs go through main() in this process (a small model, the numpy kernels); the group
runs with --data FILE are in tests/comm/test_group.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pynode.cli.main import main
from pynode.config import ConfigError, RunConfig
from pynode.datafile import DataFileError, file_spec
from pynode.tasks.gpt import GPTTask

SMALL = ["--width", "32", "--layers", "1", "--heads", "2", "--seq", "16", "--microbatch-size",
         "2", "--microbatches", "2", "--no-progress", "--kernels", "numpy"]
DOCS = [f"Document {i}: " + " ".join(f"word{i * 7 + j}" for j in range(40)) for i in range(30)]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text(" ".join(DOCS), encoding="utf-8")
    return path


@pytest.fixture
def parquet_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": DOCS, "id": list(range(len(DOCS)))}), path,
                   row_group_size=7)
    return path


def run(argv: list[str], capsys, tmp_path, name: str) -> tuple[int, list[str], str]:
    """rc, per-step hashes and stderr of `python -m pynode` ARGV, in this process."""
    log = tmp_path / f"{name}.jsonl"
    rc = main([*argv, "--log", str(log)])
    hashes = [json.loads(row)["hash"] for row in log.read_text().splitlines()] \
        if log.exists() else []
    return rc, hashes, capsys.readouterr().err


def rows_of(cfg: RunConfig) -> list[bytes]:
    task = GPTTask()
    task.build_model(cfg, None)
    batch = np.concatenate([task.sample(cfg, step, i) for step in range(3) for i in range(2)])
    return [bytes(row.astype(np.uint8)) for row in batch]  # (rows, seq + 1) bytes


def test_every_sequence_comes_from_the_text_file(text_file):
    cfg = RunConfig(seq=16, data=file_spec(str(text_file)))
    text = text_file.read_bytes()
    rows = rows_of(cfg)
    assert len(rows) == 6 * cfg.microbatch_size and all(row in text for row in rows)
    assert len(set(rows)) > 1


def test_every_sequence_comes_from_one_document_or_its_neighbour_of_the_parquet(parquet_file):
    cfg = RunConfig(seq=16, data=file_spec(str(parquet_file)))
    joined = "\n\n".join(DOCS).encode("utf-8")
    assert all(row in joined for row in rows_of(cfg))


def test_train_on_a_file_is_reproducible_and_is_not_the_built_in_text(text_file, tmp_path,
                                                                      capsys):
    argv = ["train", "--steps", "2", *SMALL]
    rc1, first, said = run([*argv, "--data", str(text_file)], capsys, tmp_path, "a")
    rc2, again, _ = run([*argv, "--data", str(text_file)], capsys, tmp_path, "b")
    rc3, builtin, said_builtin = run(argv, capsys, tmp_path, "c")
    assert rc1 == rc2 == rc3 == 0
    assert first == again and len(first) == 2
    assert first != builtin
    # the header says which text (a wrong file was seen nowhere); the default, nothing
    assert f"from step 0  data {text_file}\n" in said, said
    assert "  data " not in said_builtin, said_builtin


def test_a_resume_refuses_a_data_file_that_changed(text_file, tmp_path, capsys):
    saved = str(tmp_path / "run.pt")
    rc, _, _ = run(["train", "--steps", "1", *SMALL, "--data", str(text_file), "--save", saved],
                   capsys, tmp_path, "first")
    assert rc == 0
    text_file.write_text("other words " * 100, encoding="utf-8")
    rc, hashes, err = run(["train", "--resume", saved, "--steps", "2", *SMALL[-3:]], capsys,
                          tmp_path, "resumed")
    assert rc == 2 and hashes == []
    assert f"error: DataFileError: the run's data file {text_file} has sha256 " in err
    assert "the file changed, or this peer has another" in err


def test_a_resume_elsewhere_reads_the_same_file_by_another_path(text_file, tmp_path, capsys,
                                                                monkeypatch):
    """A run on a relative --data path, resumed from another folder: the refusal says the
    path is relative and how to give it; given so, the resume is the same run (no note that
    it replaces the checkpoint's file, whose internal form it showed), bit for bit."""
    monkeypatch.chdir(tmp_path)
    saved = str(tmp_path / "run.pt")
    rc, _, _ = run(["train", "--steps", "1", *SMALL, "--data", text_file.name, "--save", saved],
                   capsys, tmp_path, "first")
    assert rc == 0
    rc, straight, _ = run(["train", "--resume", saved, "--steps", "2", *SMALL[-3:]], capsys,
                          tmp_path, "straight")
    assert rc == 0 and len(straight) == 1
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    rc, hashes, err = run(["train", "--resume", saved, "--steps", "2", *SMALL[-3:]], capsys,
                          tmp_path, "lost")
    assert rc == 2 and hashes == []
    assert ("the run's data file notes.txt cannot be read here (No such file or directory): "
            "every peer needs it at that path (a relative path, read from the folder the "
            "command runs in; a resume can give --data") in err, err
    rc, hashes, err = run(["train", "--resume", saved, "--steps", "2", *SMALL[-3:], "--data",
                           f"../{text_file.name}"], capsys, tmp_path, "elsewhere")
    assert rc == 0 and hashes == straight
    assert "replaces the checkpoint's" not in err, err
    other = tmp_path / "other.txt"
    other.write_text("other words " * 100, encoding="utf-8")
    rc, _, err = run(["train", "--resume", saved, "--steps", "2", *SMALL[-3:], "--data",
                      "../other.txt"], capsys, tmp_path, "other")
    assert rc == 0 and "note: --data ../other.txt (sha256 " in err, err
    assert "replaces the checkpoint's 'notes.txt (sha256 " in err and "file:" not in err, err


def test_generate_and_the_kit_need_no_data_file(text_file, tmp_path, capsys):
    """A model trained on a file samples without it: generate and kit read the checkpoint
    alone (they refused, naming the moved file, since building the model read the data);
    a resume still refuses the file that moved."""
    saved = str(tmp_path / "run.pt")
    rc, _, _ = run(["train", "--steps", "1", *SMALL, "--data", str(text_file), "--save", saved],
                   capsys, tmp_path, "first")
    assert rc == 0
    text_file.unlink()
    kit = tmp_path / "kit.html"
    assert main(["generate", "--checkpoint", saved, "--prompt", "The ", "--tokens", "5"]) == 0
    assert main(["kit", saved, "-o", str(kit)]) == 0 and kit.stat().st_size > 0
    capsys.readouterr()
    rc, hashes, err = run(["train", "--resume", saved, "--steps", "2", *SMALL[-3:]], capsys,
                          tmp_path, "resumed")
    assert rc == 2 and hashes == [] and "DataFileError" in err, err


@pytest.mark.parametrize("case", ["missing", "short", "no_text_column", "numbers", "damaged",
                                  "lfs_pointer", "page"])
def test_an_unusable_data_file_is_one_line_and_exit_2(tmp_path, capsys, case):
    path = tmp_path / "data.txt"
    if case in ("lfs_pointer", "page"):  # named .parquet, not one: it trained on as text
        path = tmp_path / "000_00000.parquet"
        path.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"ab" * 32
                         + b"\nsize 2151000000\n" if case == "lfs_pointer"
                         else b"<!DOCTYPE html><html><body>" + b"Not found. " * 300)
        expected = ("000_00000.parquet is named .parquet but is not a parquet file ("
                    + ("135 bytes, no PAR1 at its start): a Git LFS pointer, not the shard"
                       if case == "lfs_pointer" else "3,327 bytes"))
    elif case == "short":
        path.write_text("too short", encoding="utf-8")
        expected = "holds 9 bytes of text, not more than one sequence (17)"
    elif case == "no_text_column":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"body": DOCS}), path)
        expected = "no readable 'text' column (its columns: body)"  # not pyarrow's internals
    elif case == "numbers":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": [1, 2, 3]}), path)
        expected = "its 'text' column holds int64, not text"
    elif case == "damaged":  # magic bytes and footer intact, a page zeroed: pyarrow's OSError
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": [f"document {i}: " * 20 for i in range(200)]}), path)
        raw = path.read_bytes()
        path.write_bytes(raw[:4] + bytes(200) + raw[204:])
        expected = "no readable 'text' column ("
    else:
        expected = "is not a file; give builtin, a DaisyChain server"
    rc, hashes, err = run(["train", "--steps", "1", *SMALL, "--data", str(path)], capsys,
                          tmp_path, case)
    assert rc == 2 and hashes == []
    assert err.startswith("error: DataFileError: ") and expected in err, err
    assert "Traceback" not in err


def test_join_refuses_a_data_file_its_tabs_cannot_read(text_file, capsys):
    pytest.importorskip("aiortc")
    rc = main(["join", "--server", "http://127.0.0.1:9", "--start", "--data", str(text_file)])
    assert rc == 2
    assert "ConfigError: --data FILE is read by each peer from its own disk" in \
        capsys.readouterr().err


def test_a_leader_refuses_a_text_it_cannot_read_before_joining(capsys):
    """The model no longer reads the data (generate needs none), so `join --start` asks the
    task's check_data itself: an uploaded text it cannot read is named before the room hears."""
    pytest.importorskip("aiortc")
    text = "http://127.0.0.1:9/uploads/" + "a" * 64 + "#sha256=" + "a" * 64
    rc = main(["join", "--server", "http://127.0.0.1:9", "--start", "--data", text])
    err = capsys.readouterr().err
    assert rc == 2 and "DataSourceError" in err and "127.0.0.1:9/uploads/" in err, err
    assert "SignalingError" not in err  # the room's server was never asked


def test_the_config_accepts_only_a_well_formed_file_value():
    with pytest.raises(ConfigError, match="file:PATH#sha256="):
        RunConfig(data="file:notes.txt")
    with pytest.raises(DataFileError):
        file_spec("/no/such/file")


def test_a_leader_refuses_a_text_too_short_for_a_sequence_before_any_step(tmp_path):
    """GPTTask.check_data (a trainer and a room's leader ask it before the run starts) read
    a whole text but left its length to the first microbatch: a 2-byte upload started a
    room's run that every peer then stopped at step 1. Each part the run reads counts:
    with eval_every the held-out 1/32 must hold a sequence too."""
    from pynode.datasource import DataSourceError, whole_text_part

    short = tmp_path / "short.txt"
    short.write_bytes(b"ab")
    with pytest.raises(DataFileError, match=r"holds 2 bytes of text, not more than one "
                       r"sequence \(17\)"):
        GPTTask().check_data(RunConfig(seq=16, data=file_spec(str(short))))
    small = tmp_path / "small.txt"
    small.write_bytes(b"x" * 100)  # 97 bytes to train on, 3 held out
    GPTTask().check_data(RunConfig(seq=16, data=file_spec(str(small))))
    with pytest.raises(DataFileError, match=r"holds 3 bytes in its heldout part"):
        GPTTask().check_data(RunConfig(seq=16, eval_every=5, data=file_spec(str(small))))
    with pytest.raises(DataSourceError, match="expected URL#sha256="):
        whole_text_part("http://127.0.0.1:9/uploads/x#sha256=zz", "all", 17)
