"""Input the command line refuses before it trains, in-process: one named line, exit 2.

(tests/core/test_cli.py runs the commands as subprocesses; these need no run at all.)
"""

from __future__ import annotations

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
    assert f"ConfigError: the checkpoint is at step {at}" in err
    assert "nothing to train" in err and "Traceback" not in err


def test_a_checkpoint_that_does_not_fit_is_named_before_the_step_count(tmp_path, capsys):
    saved = checkpoint_at(4, tmp_path / "at4.pt")
    err = refused(["train", "--resume", saved, "--width", "64", "--no-progress"], capsys)
    assert "CheckpointError" in err and "nothing to train" not in err


def test_output_into_a_missing_folder_is_refused_before_training(tmp_path, capsys):
    for flag in ("--save", "--log"):
        err = refused(["train", flag, str(tmp_path / "no" / "x"), "--steps", "1"], capsys)
        assert f"ConfigError: {flag}: folder" in err and "does not exist" in err
        assert "task " not in err  # refused before the run's header line


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
