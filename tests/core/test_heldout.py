"""Held-out loss (RunConfig.eval_every): when it is measured, on which text, and that it is
the same bits alone, in a group of any split, and after a resume (the Pyodide run checks
wasm against native: tests/pyodide/trainer_cases.py)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from pynode import datasource
from pynode.comm import loopback
from pynode.config import ConfigError, RunConfig
from pynode.run.assemble import build_trainer, read_resume
from pynode.run.trainer import StepResult, Trainer, TrainOptions

TINY = RunConfig(steps=5, seed=1, width=32, layers=1, heads=2, seq=16, microbatch_size=2,
                 microbatches=4, eval_every=2)


def run(trainer: Trainer, until: int) -> list[StepResult]:
    async def loop() -> list[StepResult]:
        return [await trainer.step() for _ in range(trainer.state.step, until)]

    return asyncio.run(loop())


@pytest.fixture(scope="module")
def alone() -> list[StepResult]:
    return run(build_trainer(TINY), TINY.steps)


def test_heldout_loss_every_nth_step_and_at_the_last(alone):
    measured = {r.step: r.heldout for r in alone if r.heldout is not None}
    assert sorted(measured) == [2, 4, 5]
    assert all(np.isfinite(v) and 0 < v < 6 for v in measured.values())
    assert measured[2] != measured[4]  # the weights moved: the loss is of the live weights


def test_heldout_off_by_default_and_training_text_unchanged():
    cfg = dataclasses.replace(TINY, eval_every=0)
    assert RunConfig().eval_every == 0
    results = run(build_trainer(cfg), 2)
    assert [r.heldout for r in results] == [None, None]
    whole = datasource.microbatch_bytes("builtin", 1, 0, 0, 2, 17)
    assert np.array_equal(build_trainer(cfg).task.sample(cfg, 0, 0), whole)


def test_held_out_text_never_trains(monkeypatch):
    """A corpus whose training part is bytes < 128 and whose held-out tail is bytes >= 128:
    with eval_every on, no training window reaches the tail, every held-out one lies in it."""
    n = 4096
    corpus = np.full(n, 65, dtype=np.uint8)
    corpus[n - n // datasource.HELDOUT_SHARE:] = 200
    monkeypatch.setattr(datasource, "builtin_corpus", lambda: corpus)
    task = build_trainer(TINY).task
    for step in range(20):
        for index in range(TINY.microbatches):
            assert task.sample(TINY, step, index).max() < 128
    for index in range(TINY.microbatches):
        assert task.heldout(TINY, index).min() >= 128
    assert task.sample(dataclasses.replace(TINY, eval_every=0), 0, 0).shape == (2, 17)


def test_the_same_heldout_bits_in_a_group_of_any_split(alone, tmp_path):
    async def group() -> list[list[StepResult]]:
        members = await asyncio.gather(*(loopback.connect(r, 3, str(tmp_path / "hub.sock"),
                                                          timeout=30) for r in range(3)))
        options = TrainOptions(capacities={0: 1.0, 1: 2.0, 2: 5.0})
        trainers = [build_trainer(TINY, m, options=options) for m in members]

        async def drive(t: Trainer) -> list[StepResult]:
            return [await t.step() for _ in range(TINY.steps)]

        try:
            return await asyncio.gather(*(drive(t) for t in trainers))
        finally:
            for m in members:
                await m.close()

    for results in asyncio.run(group()):
        assert [(r.hash, r.heldout) for r in results] == [(r.hash, r.heldout) for r in alone]


def test_resume_measures_the_same_heldout_loss(alone):
    first = build_trainer(TINY)
    run(first, 3)
    cfg, ckpt = read_resume(first.state_bytes(), {})
    assert cfg == TINY  # the checkpoint carries eval_every: the resume measures the same steps
    rest = run(build_trainer(cfg, resume=ckpt), TINY.steps)
    assert [(r.hash, r.heldout) for r in rest] == [(r.hash, r.heldout) for r in alone[3:]]


def test_bad_eval_every_and_a_task_without_heldout_data_are_refused():
    with pytest.raises(ConfigError, match="eval_every"):
        RunConfig(eval_every=-1)
    with pytest.raises(ConfigError, match="held-out"):
        build_trainer(RunConfig(task="mlp", width=8, eval_every=2))
