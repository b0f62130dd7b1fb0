"""`train --schedule FILE`: changes at step boundaries replay bit for bit as the resume chain
they stand for, are in the log and the checkpoint, and bad files are refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pynode.core.checkpoint import load_checkpoint
from pynode.run.schedule import ScheduleError, change_from_dict, read_schedule

REPO = Path(__file__).resolve().parents[2]
CONFIG = ["--width", "32", "--layers", "1", "--heads", "2", "--seq", "16",
          "--microbatch-size", "2", "--microbatches", "4", "--no-progress", "--kernels", "numpy",
          "--warmup", "2"]


def pynode(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "pynode", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    return done


def test_a_schedule_replays_the_resume_chain_it_stands_for(tmp_path):
    """lr 0.001 from step 2 and a stop at step 5 of an 8-step run == train 2 steps, resume
    with --lr 0.001 to step 4 of 8 ... : the same hash at every step (past the warm-up, so
    the total matters)."""
    schedule = tmp_path / "s.json"
    schedule.write_text(json.dumps([{"step": 2, "lr": 0.001}, {"step": 4, "steps": 5}]))
    log, saved = tmp_path / "a.jsonl", tmp_path / "a.pt"
    done = pynode("train", "--steps", "8", *CONFIG, "--schedule", str(schedule),
                  "--log", str(log), "--save", str(saved))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert rows[2]["change"] == {"step": 2, "lr": 0.001}
    assert rows[4]["change"] == {"step": 4, "steps": 5}
    ckpt = load_checkpoint(saved.read_bytes())
    assert ckpt.config["schedule"] == [{"step": 2, "lr": 0.001}, {"step": 4, "steps": 5}]
    assert ckpt.config["lr"] == 0.001 and ckpt.config["steps"] == 5

    first, second = tmp_path / "b2.pt", tmp_path / "b4.pt"
    assert pynode("train", "--steps", "2", *CONFIG, "--save", str(first)).returncode == 0
    chain = pynode("train", "--resume", str(first), "--lr", "0.001", "--steps", "8", *CONFIG,
                   "--save", str(second), "--log", str(tmp_path / "b.jsonl"))
    assert chain.returncode == 0, chain.stderr
    chained = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [r["hash"] for r in chained[:2]] == [r["hash"] for r in rows[2:4]]
    assert chained[2]["hash"] != rows[4]["hash"]  # the stop's total changed the decay
    assert done.stdout.split()[-1] == rows[4]["hash"]


@pytest.mark.parametrize("content, match", [
    ("{", "--schedule"),
    ('{"step": 1}', "a JSON list"),
    ('[{"step": 1}]', "changes nothing"),
    ('[{"step": 1, "lr": 3}]', "lr must be in"),
    ('[{"step": 4, "steps": 2}]', "steps must be an integer >= 4"),
    ('[{"step": 1, "seed": 2}]', "only lr and steps"),
    ('[{"step": 3, "lr": 0.1}, {"step": 1, "lr": 0.2}]', "step order"),
    ('[{"step": "x", "lr": 0.1}]', "step must be an integer"),
])
def test_bad_schedules_are_refused_by_name(tmp_path, content, match):
    path = tmp_path / "s.json"
    path.write_text(content)
    with pytest.raises(ScheduleError, match=match) as refused:
        read_schedule(str(path))
    assert str(refused.value).startswith(f"--schedule {path}: ")  # every refusal names the file


def test_a_schedule_with_several_local_peers_is_refused_before_anything_starts(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('[{"step": 1, "lr": 0.001}]')
    done = pynode("train", "--steps", "2", *CONFIG, "--peers", "2", "--schedule", str(path))
    assert done.returncode == 2 and "drop --peers" in done.stderr


def test_a_change_keeps_its_json_form():
    change = change_from_dict({"step": 3, "lr": 0.002})
    assert change.to_dict() == {"step": 3, "lr": 0.002}


def test_a_change_the_run_never_reaches_is_refused(tmp_path, capsys):
    """A change at or past the run's last step (as the changes before it leave that) used
    to be dropped without a word."""
    from pynode.cli.main import main
    from pynode.run.schedule import check_reached

    def changes(*items):
        return [change_from_dict(item) for item in items]

    check_reached(changes({"step": 1, "steps": 10}, {"step": 5, "lr": 0.001}), 3)  # extended
    for items, steps in ((({"step": 10, "lr": 0.001},), 3),
                         (({"step": 3, "lr": 0.001},), 3),
                         (({"step": 1, "steps": 2}, {"step": 2, "lr": 0.001}), 8)):
        with pytest.raises(ScheduleError, match="is never reached: the run ends at step"):
            check_reached(changes(*items), steps)
    path = tmp_path / "s.json"
    path.write_text('[{"step": 10, "lr": 0.001}]')
    assert main(["train", "--steps", "3", *CONFIG, "--schedule", str(path)]) == 2
    err = capsys.readouterr().err
    assert "change at step 10 is never reached: the run ends at step 3" in err
    assert "task " not in err  # before the run
