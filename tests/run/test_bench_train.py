"""`bench train`'s report names the config each task trained: its --steps timed steps after
one warm-up step, the float row under task "float" (it said the defaults' 200 steps)."""

from __future__ import annotations

import json
import subprocess
import types

import pytest

from pynode.bench import train as bench_train
from pynode.config import RunConfig

TINY = {"width": 16, "heads": 2, "layers": 1, "seq": 16, "microbatch_size": 2,
        "microbatches": 1}


def test_a_task_reports_the_config_it_trained():
    """measure() trains a warm-up step before the timed ones, under its task's name."""
    pytest.importorskip("torch")
    row = bench_train.measure("float", RunConfig.from_dict(TINY), 3)
    assert (row["task"], row["config"]["task"], row["config"]["steps"]) == ("float", "float", 4)
    assert all(row["config"][k] == v for k, v in TINY.items())


def fake_row(task: str) -> dict:
    """What `--one TASK` prints (the config as measure() would give it for --steps 7)."""
    return {"config": {"steps": 8, "task": task, "width": 32}, "task": task, "backend": "b",
            "tokens_per_s": 100.0 if task == "gpt" else 200.0, "seconds_per_step": 0.1,
            "peak_rss_mib": 10.0, "final_loss": 3.0, "gemm": "g", "kernels": "k",
            "check_overhead": 0.05 if task == "gpt" else None,
            "check_share": 0.04 if task == "gpt" else None}


@pytest.fixture
def measured(monkeypatch):
    """The two task processes, answered without training."""
    pytest.importorskip("torch")

    def run(cmd, **kwargs):
        assert cmd[cmd.index("--steps") + 1] == "7"
        return types.SimpleNamespace(stdout=json.dumps(fake_row(cmd[cmd.index("--one") + 1])))

    monkeypatch.setattr(subprocess, "run", run)


def test_the_json_rows_carry_the_config_each_task_trained(measured, capsys):
    assert bench_train.main(["--steps", "7", "--json", "--config", '{"width": 32}']) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["task"], r["config"]["task"], r["config"]["steps"]) for r in rows] == \
        [("gpt", "gpt", 8), ("float", "float", 8)]


def test_the_report_says_the_steps_trained_and_timed(measured, capsys):
    assert bench_train.main(["--steps", "7"]) == 0
    lines = capsys.readouterr().out.splitlines()
    config = json.loads(lines[1].removeprefix("config: "))
    assert config["steps"] == 8 and config["task"] == "gpt"
    assert lines[2].startswith("each task trains it in its own process: 1 warm-up step, "
                               "then 7 timed"), lines[2]
    assert lines[-1] == "int8 / float tokens per second: 0.500"


@pytest.mark.parametrize("fused", [False, True])
def test_the_check_line_says_whether_the_check_has_a_clock_of_its_own(monkeypatch, capsys,
                                                                       fused):
    """Where the check's sums ride in the kernels' passes its own clock sees only the
    products checked apart: the line says so instead of calling that its cost."""
    pytest.importorskip("torch")

    def run(cmd, **kwargs):
        row = fake_row(cmd[cmd.index("--one") + 1])
        row["check_fused"] = fused and row["task"] == "gpt"
        return types.SimpleNamespace(stdout=json.dumps(row))

    monkeypatch.setattr(subprocess, "run", run)
    assert bench_train.main(["--steps", "7"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("product check"))
    assert "+5.0 % step time" in line
    assert ("ride in the quantize and epilogue passes" in line) == fused
    assert ("the checks' own work: 4.0 %" in line) == (not fused)
