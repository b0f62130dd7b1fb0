"""`bench train`'s report names the config each task trained: its --steps timed steps after
one warm-up step, the float row under task "float" (it said the defaults' 200 steps)."""

from __future__ import annotations

import json
import subprocess
import types

import pytest

from pynode.bench import train as bench_train


def fake_row(task: str) -> dict:
    return {"task": task, "backend": "b", "tokens_per_s": 100.0 if task == "gpt" else 200.0,
            "seconds_per_step": 0.1, "peak_rss_mib": 10.0, "final_loss": 3.0, "gemm": "g",
            "kernels": "k", "check_overhead": 0.05 if task == "gpt" else None,
            "check_share": 0.04 if task == "gpt" else None}


@pytest.fixture
def measured(monkeypatch):
    """The two task processes, answered without training."""
    pytest.importorskip("torch")

    def run(cmd, **kwargs):
        task = cmd[cmd.index("--one") + 1]
        assert cmd[cmd.index("--steps") + 1] == "7"
        return types.SimpleNamespace(stdout=json.dumps(fake_row(task)) + "\n")

    monkeypatch.setattr(subprocess, "run", run)


def test_the_json_rows_carry_the_config_each_task_trained(measured, capsys):
    assert bench_train.main(["--steps", "7", "--json", "--config", '{"width": 32}']) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["task"], r["config"]["task"], r["config"]["steps"], r["config"]["width"])
            for r in rows] == [("gpt", "gpt", 8, 32), ("float", "float", 8, 32)]


def test_the_report_says_the_steps_trained_and_timed(measured, capsys):
    assert bench_train.main(["--steps", "7"]) == 0
    lines = capsys.readouterr().out.splitlines()
    config = json.loads(lines[1].removeprefix("config: "))
    assert config["steps"] == 8 and config["task"] == "gpt"
    assert lines[2].startswith("each task trains it in its own process: 1 warm-up step, "
                               "then 7 timed"), lines[2]
    assert lines[-1] == "int8 / float tokens per second: 0.500"
