"""Input the command line refuses before it trains, in-process: one named line, exit 2.

(tests/core/test_cli.py runs the commands as subprocesses; these need no run at all.)
"""

from __future__ import annotations

import argparse
import json
import re

import pytest

from pynode.cli.main import main
from pynode.config import RunConfig
from pynode.run.trainer import Trainer, TrainState
from pynode.tasks.gpt import GPTTask


def refused(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def checkpoint_at(step: int, path) -> str:
    trainer = Trainer(RunConfig(steps=4, seed=1, width=32, layers=1, heads=2, seq=16), GPTTask(),
                      None)
    trainer.state = TrainState(step=step, params=trainer.state.params, opt=trainer.state.opt)
    path.write_bytes(trainer.state_bytes())
    return str(path)


@pytest.mark.parametrize("at,flags", [(4, []), (3, ["--steps", "3"]), (3, ["--steps", "2"])])
def test_a_resume_with_nothing_left_to_train_says_so(tmp_path, capsys, at, flags):
    """A checkpoint at the end of its own 4 steps, or --steps at or below its step."""
    saved = checkpoint_at(at, tmp_path / "saved.pt")
    err = refused(["train", "--resume", saved, "--no-progress", *flags], capsys)
    assert f"NothingToTrainError: the checkpoint is at step {at}" in err
    assert "nothing to train" in err and "Traceback" not in err


def test_a_checkpoint_that_does_not_fit_is_named_before_the_step_count(tmp_path, capsys):
    saved = checkpoint_at(4, tmp_path / "at4.pt")
    err = refused(["train", "--resume", saved, "--width", "64", "--no-progress"], capsys)
    assert "CheckpointError" in err and "nothing to train" not in err


def test_output_into_a_missing_folder_is_refused_before_training(tmp_path, capsys):
    for flag in ("--save", "--log", "--summary"):
        err = refused(["train", flag, str(tmp_path / "no" / "x"), "--steps", "1"], capsys)
        assert f"OutputError: {flag} " in err and "does not exist" in err
        assert "task " not in err  # refused before the run's header line


def test_outputs_that_cannot_be_written_are_refused_before_training(tmp_path, capsys):
    """A folder, a file's name used as a folder, a place nobody can write (/proc): named
    before the run (they used to fail after it, losing the run), nothing left behind."""
    (tmp_path / "dir.pt").mkdir()
    (tmp_path / "run.pt").write_bytes(b"kept")
    cases = [(str(tmp_path / "dir.pt"), "is a folder"),
             (str(tmp_path / "run.pt" / "x.pt"), "is not a folder"),
             ("/proc/x.pt", "cannot write there")]
    for path, reason in cases:
        for flag in ("--save", "--log", "--summary"):
            err = refused(["train", flag, path, "--steps", "1"], capsys)
            assert f"OutputError: {flag} {path}: " in err and reason in err, err
            assert "task " not in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.pt", "run.pt"]
    assert (tmp_path / "run.pt").read_bytes() == b"kept"
    err = refused(["train", "--save", "", "--steps", "1"], capsys)  # read "--save : a folder"
    assert err == "error: OutputError: --save needs a file name, got an empty one\n", err


def test_a_file_of_another_kind_is_not_replaced_by_an_output(tmp_path, capsys):
    """`--save train.py`, `--log notes.txt`, `kit -o report.html`: a file with something in
    it that the flag does not write is refused by name and kept; one of its own kind (a
    checkpoint saved over, a log appended to, a kit made again), an empty one and
    /dev/null are taken."""
    from pynode.cli.flags import check_replaceable
    from pynode.run.errors import OutputError

    script = tmp_path / "train.py"
    script.write_text("print('mine')\n")
    for flag in ("--save", "--log", "--summary"):
        err = refused(["train", flag, str(script), "--steps", "1"], capsys)
        assert f"OutputError: {flag} {script}: that file is there and is not " in err, err
        assert "task " not in err  # before the run
    err = refused(["kit", checkpoint_at(1, tmp_path / "one.pt"), "-o", str(script)], capsys)
    assert f"-o {script}: that file is there and is not a DaisyChain inference kit" in err
    assert script.read_text() == "print('mine')\n"
    saved = checkpoint_at(1, tmp_path / "saved.pt")
    assert main(["kit", saved, "-o", str(tmp_path / "kit.html")]) == 0
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "run.jsonl").write_text('{"step": 1}\n')
    for flag, path in (("--save", saved), ("-o", str(tmp_path / "kit.html")),
                       ("--log", str(tmp_path / "run.jsonl")), ("--save", "/dev/null"),
                       ("--summary", str(tmp_path / "empty")), ("--save", str(tmp_path / "new"))):
        check_replaceable(flag, path)
    with pytest.raises(OutputError, match="not a run's --summary"):
        check_replaceable("--summary", saved)  # a checkpoint is no summary


def test_a_new_run_does_not_replace_a_checkpoint(tmp_path, capsys, monkeypatch):
    """A command line run again (the shell's history) with --save over a finished run's
    checkpoint, then Ctrl-C, had replaced that model with a few steps of a new run. Saving
    over the --resume file is what continuing a run is; --elastic's ranks resume from
    theirs (checked once by its launcher, not by each attempt)."""
    from pynode.cli.flags import check_output_flags
    from pynode.run.errors import OutputError

    saved = checkpoint_at(2, tmp_path / "run.pt")
    kept = (tmp_path / "run.pt").read_bytes()
    err = refused(["train", "--save", saved, "--steps", "3"], capsys)
    assert f"OutputError: --save {saved}: a checkpoint is there, and this new run would " \
           f"replace it. To continue that run: --resume {saved} (with --save {saved}" in err
    other = checkpoint_at(1, tmp_path / "other.pt")
    err = refused(["train", "--resume", other, "--save", saved, "--steps", "3"], capsys)
    # a resumed run: not "this new run", nor "--resume" the file it would replace
    assert err == (f"error: OutputError: --save {saved}: another checkpoint is there, and "
                   f"this run (resuming {other}) would replace it. To keep the result with "
                   f"the run it continues: --save {other}; else give another name, or move "
                   f"{saved} away first\n"), err
    assert (tmp_path / "run.pt").read_bytes() == kept
    assert main(["train", "--resume", saved, "--save", saved, "--steps", "3", "--no-progress",
                 "--kernels", "numpy"]) == 0
    assert (tmp_path / "run.pt").read_bytes() != kept
    launcher = argparse.Namespace(save=saved, log=None, summary=None, resume=None,
                                  save_every=1, elastic="1:2")
    with pytest.raises(OutputError, match="a checkpoint is there"):  # a fresh launch
        check_output_flags(launcher, lock_log=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run")  # a rank its agent (re)started
    rank = argparse.Namespace(save=saved, log=None, summary=None, resume=None, save_every=1,
                              elastic=None)  # the launcher's flags are not the ranks'
    check_output_flags(rank, lock_log=False)


def test_a_joining_peer_told_to_resume_is_told_to_lead(tmp_path, capsys):
    """join's --resume needs --start: a peer that joins a room's run (no --start) was told
    `--resume PATH`, then refused that with "--resume needs --start"."""
    pytest.importorskip("aiortc")
    saved = checkpoint_at(2, tmp_path / "run.pt")
    err = refused(["join", "--server", "http://127.0.0.1:1", "--room", "a" * 22, "--save",
                   saved], capsys)
    assert f"To continue that run: --start --resume {saved} (with --save {saved}" in err


def test_a_log_that_exists_is_checked_by_appending_to_it(tmp_path):
    """--log /dev/stdout (no file can be made beside it) and a log that exists are fine."""
    from pynode.cli.flags import check_writable

    log = tmp_path / "run.jsonl"
    log.write_text("kept\n")
    for path in ("/dev/stdout", str(log)):
        check_writable("--log", path, append=True)
    assert log.read_text() == "kept\n" and sorted(tmp_path.iterdir()) == [log]


def test_two_outputs_in_one_file_are_refused(tmp_path, capsys):
    """--log and --save (or --summary) in one file would overwrite each other; --log into
    the checkpoint being resumed would spoil it. --save over --resume is what users do."""
    same = str(tmp_path / "same.pt")
    for first, second in (("--log", "--save"), ("--save", "--summary"), ("--log", "--summary")):
        err = refused(["train", first, same, second, same, "--steps", "1"], capsys)
        assert "ConfigError: " in err and "name the same file" in err, err
    saved = checkpoint_at(2, tmp_path / "at2.pt")
    err = refused(["train", "--resume", saved, "--log", saved, "--steps", "3"], capsys)
    assert "--log and --resume name the same file" in err
    assert not (tmp_path / "same.pt").exists()


def test_flags_given_with_resume_are_judged_against_the_checkpoints_config(tmp_path, capsys):
    """--heads with --resume fits or not the checkpoint's width, never the default's (64):
    3 heads divide a width of 48 and the run goes on; they do not divide 32, and the refusal
    names 32."""
    saved = checkpoint_at(2, tmp_path / "w32.pt")
    err = refused(["train", "--resume", saved, "--heads", "3", "--steps", "3"], capsys)
    assert "heads (3) must divide width (32)" in err
    trainer = Trainer(RunConfig(steps=4, seed=1, width=48, layers=1, heads=2, seq=16),
                      GPTTask(), None)
    (tmp_path / "w48.pt").write_bytes(trainer.state_bytes())
    assert main(["train", "--resume", str(tmp_path / "w48.pt"), "--heads", "3", "--steps", "1",
                 "--no-progress", "--save", str(tmp_path / "w48.pt")]) == 0
    assert "note:" in capsys.readouterr().err


def test_capacity_without_local_peers_is_refused(capsys):
    err = refused(["train", "--capacity", "1,2", "--steps", "1"], capsys)
    assert "ConfigError: --capacity sets the relative speeds of local peers" in err


def test_help_lists_the_commands_users_run_and_no_stray_names(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "{train,generate,kit,cluster,join,verify,bench}" in out and "_peer" not in out
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "rest" not in out and "the benchmark's own flags" in out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "--check-products" in capsys.readouterr().out


# --- what a command does that a user might not expect: it says so ---------------------------

def trained(argv: list[str], capsys) -> str:
    assert main(argv) == 0
    return capsys.readouterr().err


def test_a_resume_with_other_config_flags_says_what_changes(tmp_path, capsys):
    """The flags win (a lower --lr after a NonFiniteError is the fix), and the run says
    that from the checkpoint's step on it is not the checkpoint's own; equal values and
    a plain resume say nothing."""
    saved = checkpoint_at(3, tmp_path / "at3.pt")
    quick = ["--no-progress", "--kernels", "numpy"]
    err = trained(["train", "--resume", saved, "--lr", "0.001", "--seed", "7", "--steps", "5",
                   *quick], capsys)
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 4, err
    # without --save its result is dropped: said first (QUICKSTART's resume line had none)
    assert f"note: no --save: the state this run reaches is not kept (--save {saved} " \
           "writes it back over the checkpoint)" in notes
    assert any("--lr 0.001 replaces the checkpoint's 0.003: from step 3" in n for n in notes)
    assert any("--seed 7 replaces the checkpoint's 1" in n for n in notes)
    assert any("--steps 5 (the checkpoint's run has 4): from step 3 the learning rate "
               "follows the schedule of a run of 5 steps" in n for n in notes)
    assert "step 5  loss" in err
    err = trained(["train", "--resume", saved, "--seed", "1", "--width", "32", "--save", saved,
                   *quick], capsys)
    assert "note:" not in err and "step 4  loss" in err


@pytest.mark.parametrize("count,capacity,line", [
    (4, "1,2,5", "note: --capacity 1,2,5 of 4 microbatches: whole microbatches split 1/1/2 "
                 "(the capacities ask for 0.5/1/2.5); --microbatches 8 (or a multiple) splits "
                 "in exact proportion"),
    (2, "1,1,10", "note: --capacity 1,1,10 of 2 microbatches: whole microbatches split 0/0/2 "
                  "(the capacities ask for 0.167/0.167/1.67); ranks 0, 1 compute none; "
                  "--microbatches 12 (or a multiple) splits in exact proportion"),
    (8, "1,2,5", None),
    (6, "0.5,1", None),
])
def test_capacity_says_how_whole_microbatches_split(count, capacity, line):
    from pynode.cli.flags import capacity_note, parse_capacity

    peers = len(capacity.split(","))
    assert capacity_note(count, parse_capacity(capacity, peers)) == line


def test_a_stop_without_save_says_the_state_is_not_kept(capsys):
    """A Ctrl-C of a train without --save said only "interrupted": an hour of training gone
    without a word. A room's peer is not told so (the room keeps the run's state)."""
    import types

    from pynode.cli.report import Saver

    trainer = types.SimpleNamespace(state=types.SimpleNamespace(step=0),
                                    state_bytes=lambda: b"state")
    for owns, said in ((True, ["no --save: the state this run reached (step 7) is not kept"]),
                       (False, [])):
        saver = Saver(None, None, owns_state=owns)
        saver.tell_last_agreed()  # no step yet: nothing to lose
        hook = saver.hook(trainer)
        hook(types.SimpleNamespace(step=7))
        assert saver.tell_last_agreed() is False
        assert capsys.readouterr().err.splitlines() == said, owns


def test_fewer_microbatches_than_ranks_say_that_some_compute_none():
    """`train --peers 2 --microbatches 1`: rank 1 had 0 % of the work with no word."""
    from pynode.cli.flags import capacity_note

    assert capacity_note(1, None, 2) == (
        "note: --microbatches 1 for 2 ranks: each step's microbatches go to 1 of them and the "
        "other computes none (--microbatches 2 or more uses every rank)")
    assert capacity_note(2, None, 5).endswith("go to 2 of them and the other 3 compute none "
                                              "(--microbatches 5 or more uses every rank)")
    assert capacity_note(2, None, 2) is None and capacity_note(4, None, 1) is None


def test_a_mistyped_flag_is_told_with_its_commands_usage(capsys):
    """argparse told it with the top level's usage, which lists no flag of the command."""
    cases = [(["train", "--stpes", "3"], "train", "--stpes 3"),
             (["verify", "--bogus"], "verify", "--bogus"),
             (["generate", "--checkpoint", "x.pt", "--prompt", "a", "--tokns", "5"], "generate",
              "--tokns 5")]
    for argv, command, unknown in cases:
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        err = capsys.readouterr().err
        assert stopped.value.code == 2
        assert f"usage: python -m pynode {command} " in err
        assert f"python -m pynode {command}: error: unrecognized arguments: {unknown}" in err


def test_the_servers_data_flag_given_to_a_run_names_the_runs(capsys):
    """`train --data-url` (the server's flag) was a bare `unrecognized arguments` (a
    trial); the same refusal says which flag a run takes, and the data flags' choices."""
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--data-url", "x.parquet", "--steps", "1"])
    assert stopped.value.code == 2
    assert ("error: unrecognized arguments: --data-url x.parquet (--data-url is the server's; "
            "a run takes --data with the server's address, http://HOST:PORT, or a file)"
            ) in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--data-fallback", "maybe"])
    assert "invalid choice: 'maybe' (choose from 'none', 'builtin')" in capsys.readouterr().err


def test_a_mistyped_command_is_told_with_the_commands_users_run(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["trian"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "invalid choice: 'trian'" in err
    assert "'train', 'cluster', 'join'" in err and "_peer" not in err


def test_a_resume_into_a_log_that_went_further_says_so(tmp_path, capsys):
    """--log appends: after a crash past the last --save-every checkpoint, the resumed steps
    come again after rows of the same steps; a plot of the file would hold both."""
    saved = checkpoint_at(2, tmp_path / "c.pt")
    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 5.0, "hash": "h"}) + "\n"
                           for s in (1, 2, 3)))
    assert main(["train", "--resume", saved, "--steps", "3", "--log", str(log),
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"note: {log} already has rows up to step 3; this run's steps 3 on are appended" in err
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2, 3, 3]
    assert main(["train", "--resume", saved, "--steps", "4", "--log", str(tmp_path / "new.jsonl"),
                 "--no-progress"]) == 0
    assert "already has rows" not in capsys.readouterr().err


def test_an_interrupt_is_told_as_one_not_as_its_exception():
    """The dashboard showed "stopped: CancelledError: " for a run stopped with Ctrl-C."""
    import asyncio

    from pynode.cli.report import stop_reason

    assert stop_reason(asyncio.CancelledError()) == "interrupted (Ctrl-C)"
    assert stop_reason(KeyboardInterrupt()) == "interrupted (Ctrl-C)"
    assert stop_reason(ValueError("x")) == "ValueError: x"


@pytest.mark.parametrize("flags,said", [
    (["--warmup", "-2"], "--warmup must be an integer >= 0, got -2"),
    (["--clip", "-1"], "--clip must be a finite number >= 0, got -1.0"),
    (["--weight-decay", "nan"], "--weight-decay must be a finite number >= 0, got nan"),
])
def test_optimizer_settings_are_refused_before_anything_starts(tmp_path, capsys, flags, said):
    """AdamW's and the schedule's refusals, said by the config up front: before this, a
    `join --start` leader sent them to the room and every peer stopped at step 1, and
    `train` set the model up and left an empty --log behind."""
    log = tmp_path / "new.jsonl"
    err = refused(["train", "--steps", "2", "--log", str(log), "--no-progress", *flags], capsys)
    assert f"ConfigError: {said}" in err and "Traceback" not in err
    assert not log.exists()
    err = refused(["join", "--server", "http://127.0.0.1:9", "--create", "--start", *flags],
                  capsys)
    assert f"ConfigError: {said}" in err and "Traceback" not in err


def test_a_checkpoint_that_cannot_be_read_is_named_with_its_flag(tmp_path, capsys):
    missing = str(tmp_path / "missing.pt")
    for argv, said in [
        (["train", "--resume", missing], f"--resume {missing}: cannot read it (No such file"),
        (["train", "--resume", str(tmp_path)], f"--resume {tmp_path}: cannot read it (Is a"),
        (["generate", "--checkpoint", missing, "--prompt", "a"],
         f"--checkpoint {missing}: cannot read it (No such file"),
        (["kit", missing, "-o", str(tmp_path / "kit.html")],
         f"the checkpoint {missing}: cannot read it (No such file"),
    ]:
        err = refused(argv, capsys)
        assert f"CheckpointError: {said}" in err and "Traceback" not in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_malformed_server_or_room_code_is_refused_before_the_unit_checks(capsys):
    err = refused(["join", "--server", "notaurl"], capsys)
    assert "SignalingError: --server must look like http://HOST:PORT, got 'notaurl'" in err
    err = refused(["join", "--server", "http://127.0.0.1:9", "--room", "nosuchroom"], capsys)
    assert "SignalingError: --room 'nosuchroom' is not a room code" in err
    assert "verified" not in err and "Traceback" not in err


def test_a_rooms_share_link_given_as_server_joins_that_room(capsys):
    """The host prints `share this link: http://HOST:PORT/?room=CODE`; given as --server,
    its room was dropped and the peer sat in the automatic room, ready, forever."""
    import argparse

    from pynode.cli.join import take_room_from_link

    code = "pbrFFvQqwnM_IZBebRB1eg"
    link = f"http://10.79.0.1:8000/?room={code}"
    for room in (None, code):
        args = argparse.Namespace(server=link, room=room, create=False)
        take_room_from_link(args)
        assert (args.server, args.room) == ("http://10.79.0.1:8000/", code)
    assert capsys.readouterr().err.count(f"room {code}: from the link given as --server") == 1
    plain = argparse.Namespace(server="http://10.79.0.1:8000", room=None, create=False)
    take_room_from_link(plain)
    assert (plain.server, plain.room) == ("http://10.79.0.1:8000", None)
    other = "A" * 22
    for argv, said in [
        (["--create"], f"--create makes a new room, but --server is the link of room {code}"),
        (["--room", other], f"--server is the link of room {code}, --room names room "
                            f"{other}: give one"),
    ]:
        err = refused(["join", "--server", link, *argv], capsys)
        assert f"SignalingError: {said}" in err and "verified" not in err, err
    for odd in (f"{link}&create=1", "http://h:8000/?create=1", f"{link}#x",
                "http://h:8000/?room=short"):
        err = refused(["join", "--server", odd], capsys)
        assert "SignalingError: " in err and "Traceback" not in err, (odd, err)


def test_the_peers_room_code_form_is_the_servers():
    from pynode.comm.signaling import ROOM_CODE
    from server.protocol import CODE_PATTERN

    assert ROOM_CODE.pattern == CODE_PATTERN.pattern


def test_version_says_the_packages(capsys):
    import pynode

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"pynode {pynode.__version__}"


def test_an_integer_too_large_for_a_float_is_a_config_error_not_an_overflow():
    """A JSON number of 400 digits (a crafted checkpoint, a room's proposal) made
    math.isfinite raise OverflowError past every handler that expects ConfigError."""
    from pynode.config import ConfigError

    for name in ("clip", "weight_decay"):
        with pytest.raises(ConfigError, match=f"{name} must be a finite number >= 0"):
            RunConfig(**{name: 10**400})


@pytest.mark.parametrize("capacity", ["nan,1", "inf,1", "1,-inf", "0,1", "1"])
def test_capacity_that_is_not_positive_and_finite_is_one_line(capacity):
    """nan and inf passed the `v <= 0` test and ended in a ValueError traceback from the
    planner's fractions."""
    from pynode.cli.flags import parse_capacity
    from pynode.config import ConfigError

    with pytest.raises(ConfigError, match=r"--capacity needs 2 positive finite numbers, one "
                       r"per peer \(--peers 2\)"):  # the flag it must agree with, named
        parse_capacity(capacity, 2)


def test_more_local_peers_than_the_cores_can_hold_is_refused(capsys, monkeypatch):
    """`train --peers 200` on 2 cores started 199 interpreters, pushed the load to 153 and
    printed nothing."""
    from pynode import platform

    monkeypatch.setattr(platform, "cpu_count", lambda: 2)
    err = refused(["train", "--peers", "200", "--steps", "1"], capsys)
    assert "ConfigError: --peers 200 on 2 core(s): each local peer is a process holding the " \
           "whole model; at most 8 here" in err


def test_join_stay_is_refused_for_a_cluster(capsys):
    pytest.importorskip("aiortc")
    pytest.importorskip("torch")
    err = refused(["join", "--server", "http://127.0.0.1:9", "--cluster", "--stay"], capsys)
    assert err == ("error: ConfigError: --stay is for a peer of its own: a --cluster's ranks "
                   "end with their run (start them again for the next)\n"), err


def test_a_checkpoint_that_cannot_be_read_or_resumed_names_its_flag_file_and_cause(
        tmp_path, capsys):
    """A damaged file said only `not a readable .pt archive`, not which; a flag that changes
    the model's shape said `parameter 'wte' has shape (256, 64), the model needs (256, 32)`
    without the flag; --steps, which fits, is not named with it."""
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"garbage")
    # no archive at all (a run's --log given for its checkpoint, an easy slip) is not
    # "truncated or damaged?" with zipfile's "File is not a zip file"
    err = refused(["train", "--resume", str(bad), "--no-progress"], capsys)
    assert err == (f"error: CheckpointError: --resume {bad}: not a checkpoint: a .pt "
                   "checkpoint is a zip archive, and this file is text\n"), err
    err = refused(["generate", "--checkpoint", str(bad), "--prompt", "a"], capsys)
    assert err.startswith(f"error: CheckpointError: --checkpoint {bad}: not a checkpoint"), err
    err = refused(["kit", str(bad), "-o", str(tmp_path / "kit.html")], capsys)
    assert err.startswith(f"error: CheckpointError: the checkpoint {bad}: not a checkpoint"), err
    for content, what in ((b"", "empty"), (bytes(range(256)), "not one")):
        bad.write_bytes(content)
        err = refused(["train", "--resume", str(bad), "--no-progress"], capsys)
        assert err.endswith(f"and this file is {what}\n"), err
    with open(checkpoint_at(2, tmp_path / "cut.pt"), "rb") as whole:
        bad.write_bytes(whole.read()[:4096])  # an archive cut short
    err = refused(["train", "--resume", str(bad), "--no-progress"], capsys)
    assert err.startswith(f"error: CheckpointError: --resume {bad}: not a readable .pt "
                          "archive (truncated or damaged?)"), err
    saved = checkpoint_at(2, tmp_path / "saved.pt")  # width 32, 1 layer, 2 heads, seq 16
    err = refused(["train", "--resume", saved, "--steps", "9", "--width", "64", "--no-progress"],
                  capsys)
    assert err.startswith(f"error: CheckpointError: --resume {saved}: --width 64 (the "
                          "checkpoint's run has 32): the checkpoint's model does not fit that "
                          "run (parameter "), err
    assert err.endswith("); a resumed run keeps its model's shape: drop the flag\n"), err
    assert "--steps" not in err


def test_a_log_another_run_is_writing_is_refused(tmp_path, capsys):
    """Two runs given one --log both appended, their rows mixed (steps 1, 1, 2, 2, ...) with
    nothing to tell them apart. The file is locked while a run writes it."""
    from pynode.cli.flags import hold_log, release_logs

    pytest.importorskip("fcntl")
    log = tmp_path / "shared.jsonl"
    log.write_bytes(b'{"step": 1}\n')  # the other run's first row
    hold_log(str(log))  # another run's, as far as a new open of the file can tell
    try:
        err = refused(["train", "--steps", "1", "--log", str(log), "--no-progress"], capsys)
    finally:
        release_logs()
    assert err == (f"error: OutputError: --log {log}: another run is writing it (their rows "
                   "would mix): give each run its own --log\n"), err
    assert log.read_bytes() == b'{"step": 1}\n'


@pytest.mark.parametrize("flags,said", [
    (["--microbatch-size", "0"], "--microbatch-size must be a positive integer, got 0"),
    (["--eval-every", "-2"], "--eval-every must be an integer >= 0 (0: never), got -2"),
    # a plain key is a flag where the message starts with it, and a word elsewhere
    (["--heads", "3"], "--heads (3) must divide width (64)"),
    (["--replicas", "2"], "--replicas 2 needs --sync-every H > 1"),
])
def test_config_refusals_name_the_flags_a_user_typed(capsys, flags, said):
    """A config error of the command line names its flags: `--microbatch-size 0` read
    `microbatch_size must be a positive integer`, a key the user never typed."""
    err = refused(["train", "--steps", "2", "--no-progress", *flags], capsys)
    assert f"error: ConfigError: {said}" in err and "Traceback" not in err


def test_a_finished_checkpoints_resume_note_offers_no_run_to_continue():
    """`--steps 6` over a finished 4-step run: its note said a resume without --steps is
    the checkpoint's own run, which is refused (nothing to train)."""
    from pynode.cli.flags import resume_notes

    (finished,) = resume_notes({"steps": 4}, 4, {"steps": 6})
    assert finished.endswith("follows the schedule of a run of 6 steps"), finished
    (halfway,) = resume_notes({"steps": 4}, 2, {"steps": 6})
    assert halfway.endswith("without --steps the resume is the checkpoint's own run, bit for "
                            "bit"), halfway


def test_a_stop_before_any_agreed_step_says_nothing_was_saved(tmp_path, capsys):
    """A Ctrl-C before the first step said only `interrupted`, where the docs promise that
    a stop says what it wrote to --save."""
    from pynode.cli.report import Saver

    target = tmp_path / "run.pt"
    assert Saver(str(target), None).tell_last_agreed() is False
    assert capsys.readouterr().err == ("no step was agreed before the stop: nothing saved to "
                                       f"{target}\n")
    assert not target.exists()
    assert Saver(None, None).tell_last_agreed() is False
    assert capsys.readouterr().err == ""


def test_a_joins_stop_lines_carry_the_time_as_its_other_lines(tmp_path, capsys, monkeypatch):
    """join's lines start with HH:MM:SS (report.say); its "saved ..." and "interrupted"
    after a Ctrl-C came without it. train's stay as they were, untimed."""
    import pynode.cli.main as cli_main
    from pynode.cli.report import Saver, say

    timed = re.compile(r"^\d\d:\d\d:\d\d ")
    saved, log = tmp_path / "run.pt", tmp_path / "run.jsonl"
    saver = Saver(str(saved), None, tell=say, log=str(log))  # as NativePeer makes it
    saver.tell_last_agreed()
    saver.agreed, saver.agreed_step = b"state", 3
    saver.tell_last_agreed()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(timed.match(line) for line in lines), lines
    # the whole recipe: `--resume F` alone left the resumed run unsaved and its log short
    assert lines[1].endswith(f"saved the last agreed state (step 3) to {saved}: --resume "
                             f"{saved} --save {saved} --log {log} goes on from there"), lines
    Saver(str(saved), None, log=None).tell_last_agreed()  # nothing agreed yet: no recipe
    unlogged = Saver(str(saved), None)
    unlogged.agreed, unlogged.agreed_step = b"state", 3
    unlogged.tell_last_agreed()
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"saved the last agreed state (step 3) to {saved}: --resume {saved} --save {saved} "
        "goes on from there")

    def interrupt(args, argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "run_command", interrupt)
    assert main(["join", "--server", "http://127.0.0.1:9"]) == 130
    (line,) = capsys.readouterr().err.splitlines()
    assert timed.match(line) and line.endswith(" interrupted"), line
    assert main(["train", "--no-progress"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


@pytest.mark.parametrize("command", [["train"], ["cluster"],
                                     ["join", "--server", "http://127.0.0.1:9", "--start"]])
def test_a_learning_rate_float32_rounds_to_nothing_is_refused(command, capsys):
    """--lr 1e-300 is in (0, 1) and was taken: AdamW steps in float32, where it is 0, and
    the run trained nothing. Refused by its flag, with the least rate a run takes."""
    from pynode.config import MIN_LR

    for lr in ("1e-300", "1e-40"):
        err = refused([*command, "--lr", lr, "--no-progress"], capsys)
        assert f"ConfigError: --lr {float(lr)!r} is below 1.18e-38" in err, err
        assert "nothing would train; it must be at least 1.18e-38" in err, err
    assert RunConfig(lr=MIN_LR).lr == MIN_LR  # the bound itself, and above, train
    assert RunConfig(lr=1e-30).lr == 1e-30


def test_a_schedule_change_to_a_rate_float32_rounds_to_nothing_is_refused():
    from pynode.run.schedule import ScheduleError, change_from_dict

    with pytest.raises(ScheduleError, match=r"change at step 3: lr 1e-300 is below 1.18e-38"):
        change_from_dict({"step": 3, "lr": 1e-300}).apply(RunConfig())
    assert change_from_dict({"step": 3, "lr": 1e-4}).apply(RunConfig()).lr == 1e-4


def test_clip_0_is_said_to_turn_the_clip_off(capsys):
    """--clip 0 is legal and means no clip (pynode.core.optim.clip_by_global_norm), which a
    reader may take for a clip to norm 0: the run's first line (train, a cluster's rank 0)
    and a join leader's notes say which it is; a clip given as a norm says nothing."""
    from pynode.cli.join import start_plan
    from pynode.cli.main import build_parser, parse_args
    from pynode.cli.report import run_header

    def header(clip: float) -> str:
        cfg = RunConfig(steps=4, seed=1, width=32, layers=1, heads=2, seq=16, clip=clip)
        return run_header(Trainer(cfg, GPTTask(), None))

    off = "(--clip 0 turns the gradient-norm clip off: the gradients are not clipped at all)"
    assert header(0.0).endswith(f"from step 0  {off}"), header(0.0)
    assert header(0.5).endswith("from step 0"), header(0.5)

    def join_notes(*flags: str) -> str:
        args = parse_args(build_parser(), ["join", "--server", "http://127.0.0.1:9", "--start",
                                           "--steps", "4", *flags])
        cfg, _ = start_plan(args)
        assert cfg.clip == float(flags[-1] if flags else 1.0)
        return capsys.readouterr().err

    assert join_notes("--clip", "0").endswith(f" note: {off[1:-1]}\n")
    assert join_notes("--clip", "2") == join_notes() == ""


@pytest.mark.parametrize("command", [["train"], ["cluster"],
                                     ["join", "--server", "http://127.0.0.1:9", "--start"]])
def test_a_run_length_past_the_pages_bound_is_refused_by_its_flag(command, capsys, tmp_path):
    """--steps 10**30 was taken (a slip that trains forever) where the page refuses more
    than MAX_STEPS; --sync-every too. So is a resume's --steps and a --schedule change."""
    from pynode.config import MAX_STEPS

    for flag in ("--steps", "--sync-every"):
        err = refused([*command, flag, str(10**30), "--no-progress"], capsys)
        assert f"ConfigError: {flag} must be at most 10,000,000 (" in err, err
        assert err.rstrip().endswith(f"got {10**30:,}"), err
    assert MAX_STEPS == 10_000_000
    if command == ["train"]:
        saved = checkpoint_at(2, tmp_path / "saved.pt")
        err = refused(["train", "--resume", saved, "--steps", str(MAX_STEPS + 1)], capsys)
        assert "--steps must be at most 10,000,000" in err, err
        schedule = tmp_path / "s.json"
        schedule.write_text(f'[{{"step": 1, "steps": {MAX_STEPS + 1}}}]')
        err = refused(["train", "--steps", "3", "--schedule", str(schedule)], capsys)
        assert "change at step 1: steps must be at most 10,000,000" in err, err


def test_a_run_of_max_steps_is_taken():
    from pynode.cli.flags import config_from_values
    from pynode.config import MAX_STEPS
    from pynode.run.schedule import change_from_dict

    assert config_from_values({"steps": MAX_STEPS, "sync_every": MAX_STEPS}).steps == MAX_STEPS
    assert change_from_dict({"step": 1, "steps": MAX_STEPS}).steps == MAX_STEPS
