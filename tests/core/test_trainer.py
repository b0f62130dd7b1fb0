"""The training loop in one process: reproducible bits, order-free microbatches, resume,
refusals that leave the state untouched, and an int8 GPT that learns as well as float.

Every "state unchanged" check compares the raw bits of params, Adam moments and step
(NaN-safe), and then finishes the run from that state: it must still reach the reference
run's hashes, so nothing hidden (data cursor, RNG keys, Adam's counter) moved either.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from pynode.comm.base import ReduceResult
from pynode.config import RunConfig
from pynode.core import checkpoint
from pynode.core.errors import DaisyError, FixedPointOverflowError, NonFiniteError, ShapeError
from pynode.run.assemble import (
    build_trainer,
    checkpoint_expectations,
    state_from_checkpoint,
)
from pynode.run.trainer import ContributionError, StepResult, Trainer
from pynode.tasks import UnknownTaskError, load_task
from pynode.tasks.gpt import GPTTask

# A few seconds per run: 4 steps of a 1-block GPT, 4 microbatches of 2 x 16 bytes.
TINY = RunConfig(
    steps=4, seed=1, width=32, layers=1, heads=2, seq=16, microbatch_size=2, microbatches=4
)


def train(trainer: Trainer, until: int) -> list[StepResult]:
    results: list[StepResult] = []

    async def loop() -> None:
        while trainer.state.step < until:
            results.append(await trainer.step())

    asyncio.run(loop())
    return results


def one_step(trainer: Trainer) -> StepResult:
    return asyncio.run(trainer.step())


@pytest.fixture(scope="module")
def reference() -> list[StepResult]:
    """The uninterrupted TINY run with the best gated backend: every test's yardstick."""
    return train(build_trainer(TINY), TINY.steps)


@pytest.fixture(scope="module")
def gemm(reference):
    return build_trainer(TINY).gemm


def snapshot(trainer: Trainer) -> tuple:
    """Everything a step may change, as raw bytes (NaN compares equal to itself)."""
    state = trainer.state
    arrays = [state.params, state.opt.m, state.opt.v]
    raw = tuple(tuple((k, d[k].tobytes()) for k in d) for d in arrays)
    return state.step, state.opt.step, raw


def assert_refused_unchanged(trainer: Trainer, error: type[Exception], match: str) -> None:
    before = snapshot(trainer)
    with pytest.raises(error, match=match):
        one_step(trainer)
    assert snapshot(trainer) == before


# --- the same bits, whatever runs it ---------------------------------------------------------

def test_each_step_after_the_first_is_timed_phase_by_phase():
    """phase_ms_per_step: every phase of PHASES, over the steps after the first (which
    starts up); the phases add up to the steps' time, none of which is counted twice."""
    import time

    from pynode.run.stepclock import PHASES

    trainer = build_trainer(TINY.with_(eval_every=2))
    assert trainer.clock.phase_ms_per_step() == {}
    one_step(trainer)
    assert trainer.clock.timed_steps == 0 and trainer.clock.phase_ms_per_step() == {}
    started = time.perf_counter()
    results = train(trainer, TINY.steps)
    took = time.perf_counter() - started
    assert trainer.clock.timed_steps == len(results) == TINY.steps - 1
    ms = trainer.clock.phase_ms_per_step()
    assert list(ms) == list(PHASES) and all(v >= 0 for v in ms.values())
    assert ms["compute"] > 0 and ms["eval"] > 0  # steps 2 and 4 measured the held-out loss
    total = sum(ms.values()) * trainer.clock.timed_steps / 1000
    assert sum(r.seconds for r in results) < total <= took
    # StepResult.seconds ends at the probe: the held-out loss and agreement are outside it
    assert sum(r.seconds for r in results) <= total - ms["eval"] * trainer.clock.timed_steps / 1000
    # each timed step kept on its own, whole: alone, never a check round, share 0
    kept = list(trainer.clock.steps)
    assert [s for s, _, _, _ in kept] == [r.step for r in results]
    assert sum(ms for _, ms, _, _ in kept) == pytest.approx(1000 * total)
    assert all(not checked and share == 0.0 for _, _, checked, share in kept)


def test_hashes_change_every_step_and_loss_is_finite(reference):
    hashes = [r.hash for r in reference]
    assert [r.step for r in reference] == [1, 2, 3, 4]
    assert len(set(hashes)) == len(hashes)
    assert all(np.isfinite(r.loss) for r in reference)


def test_same_config_gives_the_same_hashes(reference):
    again = train(build_trainer(TINY), TINY.steps)
    assert [r.hash for r in again] == [r.hash for r in reference]
    assert [r.loss for r in again] == [r.loss for r in reference]


@pytest.mark.parametrize("backend", ["numpy_int", "reference"])
def test_forced_backend_gives_the_same_hashes(reference, backend):
    trainer = build_trainer(TINY, backend=backend)
    assert trainer.gemm.backend_name == backend
    assert [r.hash for r in train(trainer, TINY.steps)] == [r.hash for r in reference]


def test_a_kernel_wrong_at_a_live_shape_never_changes_a_step(reference, caplog):
    """With the per-call product check (on by default), a backend that goes wrong at the
    model's own shapes (every product of inner size = width, which no start-up case meets)
    is caught on its first wrong product and replaced: the run ends on the reference
    hashes. Off, the same backend trains on to other hashes."""
    from pynode.cli.faults import WrongAtWidth

    hashes = {}
    for check in (True, False):
        trainer = build_trainer(TINY, check_products=check)
        gemm = trainer.gemm
        assert (gemm.check is not None) == check
        gemm.routes.clear()
        gemm.backend = WrongAtWidth(gemm.backend, TINY.width)
        with caplog.at_level("WARNING"):
            hashes[check] = [r.hash for r in train(trainer, TINY.steps)]
        if check:
            assert gemm.check.failures == 1 and not gemm.backend_name.startswith("wrong_")
            assert "wrong_" in caplog.text and "gave a wrong product" in caplog.text
    assert hashes[True] == [r.hash for r in reference]
    assert hashes[False][-1] != reference[-1].hash


def test_microbatches_in_any_order_or_split_give_the_same_partial_sum(reference):
    trainer = build_trainer(TINY)
    train(trainer, 1)  # away from init, so the partials exercise a trained state
    n = TINY.microbatches
    whole = trainer.microbatch_partial(list(range(n)))  # (P + 1 + 2n,) int64
    permuted = trainer.microbatch_partial([2, 0, 3, 1])
    split = sum(trainer.microbatch_partial([i]) for i in (3, 1, 0, 2))
    halves = trainer.microbatch_partial([3, 1]) + trainer.microbatch_partial([2, 0])
    assert whole.dtype == np.int64 and np.any(whole[: trainer.size] != 0)
    assert np.array_equal(trainer.counts(whole), np.ones(n, np.int64))
    for other in (permuted, split, halves):
        assert np.array_equal(other, whole)
    assert trainer.state.step == 1  # computing partials never moves the state
    assert [r.hash for r in train(trainer, TINY.steps)] == [r.hash for r in reference[1:]]


# --- resume ----------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2])
def test_resume_from_checkpoint_continues_bit_identically(reference, k):
    first = build_trainer(TINY)
    train(first, k)
    blob = first.state_bytes()
    ckpt = checkpoint.load_checkpoint(blob, expect=checkpoint_expectations(TINY))
    assert ckpt.step == k and ckpt.state_hash == reference[k - 1].hash
    resumed = build_trainer(TINY, resume=ckpt)
    assert resumed.state.hash() == reference[k - 1].hash
    assert [r.hash for r in train(resumed, TINY.steps)] == [r.hash for r in reference[k:]]


def test_state_from_checkpoint_copies_the_state():
    ckpt = checkpoint.load_checkpoint(build_trainer(TINY).state_bytes())
    state = state_from_checkpoint(ckpt)
    assert state.hash() == ckpt.state_hash and state.step == 0


# --- refusals: a named error and nothing changed ---------------------------------------------

def test_nan_weight_is_refused_and_state_untouched(reference):
    trainer = build_trainer(TINY)
    train(trainer, 1)
    good = trainer.state.params["wte"][3, 5]
    trainer.state.params["wte"][3, 5] = np.nan
    assert_refused_unchanged(trainer, NonFiniteError, "wte")
    trainer.state.params["wte"][3, 5] = good
    assert [r.hash for r in train(trainer, TINY.steps)] == [r.hash for r in reference[1:]]


def test_out_of_range_token_is_refused_and_state_untouched(reference, monkeypatch):
    trainer = build_trainer(TINY)
    train(trainer, 1)
    sample = trainer.task.sample

    def bad_sample(cfg, step, index):
        batch = sample(cfg, step, index).copy()  # (B, T+1) int32
        batch[0, 4] = 256
        return batch

    monkeypatch.setattr(trainer.task, "sample", bad_sample)
    assert_refused_unchanged(trainer, ShapeError, r"token values must lie in \[0, 256\)")
    monkeypatch.undo()
    assert [r.hash for r in train(trainer, TINY.steps)] == [r.hash for r in reference[1:]]


def test_nan_in_float_data_is_refused(monkeypatch):
    cfg = TINY.with_(task="mlp")
    trainer = build_trainer(cfg)
    sample = trainer.task.sample

    def bad_sample(cfg, step, index):
        x, y = sample(cfg, step, index)
        x = x.copy()  # (B, 16) float32
        x[1, 2] = np.nan
        return x, y

    monkeypatch.setattr(trainer.task, "sample", bad_sample)
    assert_refused_unchanged(trainer, NonFiniteError, "NaN")


def test_unknown_task_is_refused_by_name():
    with pytest.raises(UnknownTaskError, match="use one of float, gpt, mlp"):
        build_trainer(TINY.with_(task="gtp"))
    with pytest.raises(UnknownTaskError, match="cannot import"):
        load_task("no_such_module_xyz:Task")
    with pytest.raises(UnknownTaskError, match="has no 'Nope'"):
        load_task("pynode.tasks.gpt:Nope")
    with pytest.raises(UnknownTaskError, match=r"Task interface \(it has no name, "
                       r"build_model, sample, loss: docs/CUSTOM_TASK.md\)"):
        load_task("pynode.config:RunConfig")
    # what a slip in module:Class names: no traceback, a named refusal
    with pytest.raises(UnknownTaskError, match="cannot be made with no arguments"):
        load_task("pynode.core.layers:LinearCache")  # a class that needs arguments
    with pytest.raises(UnknownTaskError, match="is not a class .its type is int"):
        load_task("pynode.tasks.mlp:DATA_PURPOSE")
    with pytest.raises(UnknownTaskError, match="is not a class .its type is module"):
        load_task("os:path")
    for name in (":GPTTask", "pynode.tasks.gpt:"):
        with pytest.raises(UnknownTaskError, match="give it as module:Class"):
            load_task(name)
    assert isinstance(UnknownTaskError("x"), DaisyError)


def test_a_task_module_that_fails_to_import_is_named_with_its_error(tmp_path, monkeypatch):
    """A SyntaxError in a task module, or an exception raised while it imports, was a
    traceback through load_task (exit 1), where a missing dependency was one line."""
    (tmp_path / "syntaxslip.py").write_text("class T:\n    def x(:\n        pass\n")
    (tmp_path / "raiser.py").write_text("X = 1\nraise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UnknownTaskError, match=r"task 'syntaxslip:T': importing 'syntaxslip' "
                       r"failed: SyntaxError: .*syntaxslip.py, line 2"):
        load_task("syntaxslip:T")
    with pytest.raises(UnknownTaskError, match=r"task 'raiser:T': importing 'raiser' failed: "
                       r"RuntimeError: boom at import \(.*raiser.py, line 2\)$"):
        load_task("raiser:T")


class DataCheckTask(GPTTask):
    """A task whose check_data raises the researcher's own kind of error."""

    def check_data(self, cfg):
        raise ValueError("my dataset /data/x.npy is missing")


def test_a_check_data_error_of_any_kind_is_said_in_one_named_line(gemm):
    from pynode.tasks.base import TaskDataError

    with pytest.raises(TaskDataError, match=r"^task 'gpt': check_data: ValueError: my dataset "
                       r"/data/x.npy is missing$"):
        Trainer(TINY, DataCheckTask(), gemm)
    assert issubclass(TaskDataError, DaisyError)  # main() prints it as one line


class DictLossTask(GPTTask):
    """loss() returns its gradients alone: a dict, which unpacked into its first two keys."""

    def loss(self, model, params, batch, key):
        return super().loss(model, params, batch, key)[1]


class NoParamsTask(GPTTask):
    """A model with no parameters: it trained, then failed to save at the end."""

    def build_model(self, cfg, gemm):
        model = super().build_model(cfg, gemm)
        model.param_shapes = dict
        model.init_params = lambda seed: {}
        return model


def test_a_loss_that_returns_something_else_and_a_model_without_parameters_are_named(gemm):
    assert_refused_unchanged(Trainer(TINY, DictLossTask(), gemm), ContributionError,
                             r"the task's loss\(\) returned a dict, not \(loss, gradients\)")
    with pytest.raises(ContributionError, match="its model has no parameters"):
        Trainer(TINY, NoParamsTask(), gemm)


class GradientTask(GPTTask):
    """The GPT task, with its gradients passed through `edit` before the trainer sees them."""

    def __init__(self, edit) -> None:
        self.edit = edit

    def loss(self, model, params, batch, key):
        loss, grads = super().loss(model, params, batch, key)
        return loss, self.edit(dict(grads))


def transposed(g):
    return {**g, "wte": np.ascontiguousarray(g["wte"].T)}


def without_wpe(g):
    return {k: v for k, v in g.items() if k != "wpe"}


def as_float64(g):
    return {**g, "wpe": g["wpe"].astype(np.float64)}


def with_extra(g):  # a misspelled name was accepted, and its parameter trained on nothing
    return {**g, "wpe_typo": g["wpe"]}


def as_list(g):  # gave numpy's "truth value of an array is ambiguous"
    return list(g.values())


def too_large(g):
    return {**g, "wpe": np.full_like(g["wpe"], 1e9)}  # |g| * 2**32 > 2**53


def nan_in_wpe(g):
    wpe = g["wpe"].copy()
    wpe[3, 5] = np.nan
    return {**g, "wpe": wpe}


class NanLossTask(GPTTask):
    """Finite gradients, a loss that is not: a custom task's slip."""

    def loss(self, model, params, batch, key):
        return float("nan"), super().loss(model, params, batch, key)[1]


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        (transposed, ContributionError, r"gradient wte: expected \(256, 32\)"),
        (without_wpe, ContributionError, "no gradient for wpe"),
        (as_float64, ContributionError, "float64"),
        (with_extra, ContributionError, r"gradients for wpe_typo, which are not parameters"),
        (as_list, ContributionError, "gradients as a list, not a dict"),
        (too_large, FixedPointOverflowError, "fixed-point bound"),
        # the parameter named, its place as plain integers (it said "a gradient value at
        # index (np.int64(1221),)" of the flat vector)
        (nan_in_wpe, NonFiniteError, r"step 1, microbatch 0: the gradient of 'wpe' holds 1 "
                                     r"non-finite value\(s\), the first nan at \(3, 5\)"),
    ],
)
def test_bad_gradient_is_refused_and_state_untouched(gemm, edit, error, match):
    trainer = Trainer(TINY, GradientTask(edit), gemm)
    assert_refused_unchanged(trainer, error, match)


def test_a_loss_that_is_not_finite_is_named_as_the_loss(gemm):
    assert_refused_unchanged(Trainer(TINY, NanLossTask(), gemm), NonFiniteError,
                             "step 1, microbatch 0: the task's loss is nan")


class ScriptedCollective:
    """A one-member group whose all-reduce hands back `edit(partial)`: a faulty transport."""

    rank = 0
    members = (0,)

    def __init__(self, edit) -> None:
        self.edit = edit

    async def allreduce_int64(self, x: np.ndarray, *, timeout: float) -> ReduceResult:
        return ReduceResult(self.edit(x.copy()), (0,))

    async def allgather_bytes(self, data: bytes, *, timeout: float) -> list[bytes | None]:
        return [data]


def test_faithful_scripted_collective_reaches_the_reference(gemm, reference):
    trainer = Trainer(TINY, GPTTask(), gemm, collective=ScriptedCollective(lambda x: x))
    assert [r.hash for r in train(trainer, TINY.steps)] == [r.hash for r in reference]


def doubled(x):
    return x + x  # every microbatch counted twice


def one_longer(x):
    return np.concatenate([x, np.ones(1, np.int64)])  # coverage counts still read all-ones


def one_shorter(x):
    return x[1:]


@pytest.mark.parametrize(
    ("edit", "match"),
    [(doubled, "counted twice"), (one_longer, "this model needs"), (one_shorter, "model needs")],
)
def test_bad_reduced_gradient_is_refused_and_state_untouched(gemm, reference, edit, match):
    trainer = Trainer(TINY, GPTTask(), gemm, collective=ScriptedCollective(lambda x: x))
    train(trainer, 1)
    trainer.collective = ScriptedCollective(edit)
    assert_refused_unchanged(trainer, ContributionError, match)
    trainer.collective = ScriptedCollective(lambda x: x)
    assert [r.hash for r in train(trainer, TINY.steps)] == [r.hash for r in reference[1:]]


def test_config_refuses_bad_values_by_name():
    with pytest.raises(DaisyError, match="heads"):
        TINY.with_(heads=3)
    with pytest.raises(DaisyError, match="frac_bits"):
        dataclasses.replace(TINY, frac_bits=60)


# --- it learns ----------------------------------------------------------------------------------

# A few seconds per task; the 2 % bound is the issue's. Measured at seeds 1, 2, 3: mean loss
# of the last 10 steps int8 / float = 1.0010, 0.9999, 1.0000 (both near 3.07-3.10, from
# ln 256 = 5.55 at step 1).
LEARN = RunConfig(
    steps=150, seed=1, width=32, layers=1, heads=2, seq=32, microbatch_size=4,
    microbatches=2, lr=3e-3,
)


@pytest.fixture
def one_torch_thread():
    """torch's pool spin-waits for idle cores; on a shared machine that costs 20x here."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_int8_gpt_learns_as_well_as_float(one_torch_thread):
    means = {}
    for task in ("gpt", "float"):
        # Every backend gives the same bits (tested above); numpy_int has no BLAS thread pool
        # spinning for cores that a shared machine does not have.
        trainer = build_trainer(LEARN.with_(task=task), backend="numpy_int")
        results = train(trainer, LEARN.steps)
        means[task] = sum(r.loss for r in results[-10:]) / 10
    assert means["gpt"] < 4.0, f"the int8 GPT did not learn: {means}"
    assert abs(means["gpt"] / means["float"] - 1) <= 0.02, means


def test_the_planning_speed_leaves_out_the_warm_up_and_one_slow_microbatch(gemm):
    """The first microbatch (numba compiling on a fresh install) and one slow microbatch (a
    core busy for a moment) must not move the group's plan (pynode/run/speed.py)."""
    import time

    trainer = Trainer(TINY, GPTTask(), gemm)
    fixed = np.zeros(trainer.size, np.int64)
    slow = {0: 0.3, 3: 0.08}  # the warm-up, then one slow one among quick ones

    def contribution(index: int) -> tuple[np.ndarray, int]:
        time.sleep(slow.pop(index, 0.0))
        return fixed, 0

    trainer.contribution = contribution
    trainer.microbatch_partial([0])
    assert trainer.microbatch_seconds >= 0.3  # shown as it was
    assert trainer.meter.speed() == 0.0  # but reported as unknown
    trainer.microbatch_partial([0, 1, 2, 3])
    assert trainer.microbatch_seconds < 0.02
    assert trainer.meter.speed() > 50


class InitTask(GPTTask):
    """The GPT task, with its initial parameters passed through `edit`."""

    def __init__(self, edit) -> None:
        self.edit = edit

    def build_model(self, cfg, gemm):
        model = super().build_model(cfg, gemm)
        init = model.init_params
        model.init_params = lambda seed: self.edit(dict(init(seed)))
        return model


@pytest.mark.parametrize(("edit", "match"), [
    (lambda p: {**p, "wpe": p["wpe"].astype(np.float64)},
     r"init_params: parameter 'wpe': expected float32 \(16, 32\), got float64 \(16, 32\)"),
    (lambda p: {("w1" if k == "wpe" else k): v for k, v in p.items()},
     r"init_params: .* missing \['wpe'\], extra \['w1'\]"),
    (lambda p: list(p.values()), "returned a list, not a dict"),
])
def test_initial_parameters_a_task_gets_wrong_are_named(gemm, edit, match):
    """A custom task's init_params slips (float64, other names, no dict) were a ShapeError
    from deep in a kernel or a KeyError traceback."""
    with pytest.raises(ContributionError, match=match):
        Trainer(TINY, InitTask(edit), gemm)


def test_a_sync_every_run_checks_its_initial_parameters_too(gemm):
    from pynode.run.outer import OuterTrainer

    with pytest.raises(ContributionError, match="init_params: parameter 'wpe'"):
        OuterTrainer(TINY.with_(sync_every=2, replicas=2),
                     InitTask(lambda p: {**p, "wpe": p["wpe"].astype(np.float64)}), gemm)
