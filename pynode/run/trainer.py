"""One training step, for one peer or many (async; the transport decides who the others are).

A step is a fixed list of microbatches. Each peer computes the ones the plan gives it,
turns each gradient into int64 fixed point and adds it to its partial sum. The partials
are summed exactly by the collective, so the step's result does not depend on how many
peers there are, how the work was split, or in what order anything was added.

Legend: P = number of parameters (flattened in the model's declared order), n = microbatches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pynode.config import ConfigError, RunConfig
from pynode.core import checkpoint, fixedpoint, optim
from pynode.core.errors import NonFiniteError, ShapeError
from pynode.core.flatadam import FlatAdamW
from pynode.core.kernels import REFERENCE
from pynode.core.layers import check_params
from pynode.core.plan import microbatch_plan
from pynode.core.probe import probe_hash, probe_operands
from pynode.core.statehash import state_hash
from pynode.run.errors import ContributionError, ForkError
from pynode.run.peercheck import PeerCheck, same_length
from pynode.run.speed import SpeedMeter, planning_speeds
from pynode.run.stepclock import StepClock
from pynode.tasks.base import Task, check_task_data

log = logging.getLogger("pynode.run")

# Each microbatch's mean loss travels as fixed point too, so the logged loss is exact.
LOSS_FRAC_BITS = 32


@dataclass(frozen=True)
class TrainOptions:
    """How a trainer takes part in its group (every field has the single-peer default)."""

    min_deadline: float = 30.0  # least seconds to wait for the others in a collective
    capacities: dict[int, float] | None = None  # fixed relative speed per rank (--capacity);
    #                                             None: planned by the speeds peers measure
    share: tuple[int, int] = (0, 1)  # (index, count): compute every count-th of this rank's
    #                                  microbatches, from the index-th (a cluster behind a rank)


ALONE = TrainOptions()  # the defaults: alone, or planned by measured speeds


@dataclass
class TrainState:
    step: int                          # optimizer steps done
    params: dict[str, np.ndarray]      # name -> float32, model's declared order
    opt: optim.AdamState               # moments and Adam's own step counter

    def hash(self) -> str:
        return state_hash(self.params, self.opt, self.step)


@dataclass
class StepResult:
    step: int                          # the step number just completed (1-based)
    loss: float                        # exact mean of the microbatch losses
    hash: str                          # state hash after the update
    probe: str                         # kernel-probe hash of this peer's live backend
    plan: dict[int, list[int]] = field(default_factory=dict)  # rank -> microbatch indices
    seconds: float = 0.0               # wall time of the step on this peer
    heldout: float | None = None       # held-out loss after the update (cfg.eval_every), or None
    change: dict | None = None         # the schedule change applied before this step, if any
    inner: int = 1                     # the steps it advanced (an outer step's inner steps)


def check_initial(params: Any, shapes: dict[str, Any]) -> None:
    """ContributionError for a model's init_params that do not fit its param_shapes (a
    custom task's slips: another dtype, other names), in the core check's words."""
    if not isinstance(params, dict):
        raise ContributionError(f"init_params returned a {type(params).__name__}, not a dict "
                                "of parameter name -> float32 array")
    try:
        check_params(params, {name: tuple(shape) for name, shape in shapes.items()})
    except (ShapeError, NonFiniteError) as exc:
        raise ContributionError(f"init_params: {exc}") from None


def task_loss(task: Any, model: Any, params: dict[str, np.ndarray], batch: Any,
              key: tuple[int, ...]) -> tuple[Any, Any]:
    """The task's loss(model, params, batch, key) as (loss, gradients), or ContributionError
    naming what it returned instead (a dict of gradients alone read as its two keys)."""
    result = task.loss(model, params, batch, key)
    if not isinstance(result, tuple | list) or len(result) != 2:
        what = (f"a {type(result).__name__} of {len(result)}" if isinstance(result, tuple | list)
                else f"a {type(result).__name__}")
        raise ContributionError(f"the task's loss() returned {what}, not (loss, gradients): "
                                "the microbatch's mean loss and a dict of parameter name -> "
                                "float32 gradient")
    return result[0], result[1]


def not_finite(grads: dict[str, np.ndarray]) -> str:
    """Which gradient holds a value that is not finite: its name, how many, the first's place."""
    for name, g in grads.items():
        bad = ~np.isfinite(g)
        if bad.any():
            first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), g.shape))
            return (f"the gradient of {name!r} holds {int(bad.sum())} non-finite value(s), "
                    f"the first {g[first]} at {first}")
    return "every gradient is finite"


class Trainer:
    """Trains `task` under `cfg`. Alone when `collective` is None, else as one member.

    `units` are the verified units the GEMM was gated on (None for a float task); they count
    every invocation. Build one with pynode.run.assemble.build_trainer, drive it with
    pynode.run.loop.train.
    """

    def __init__(
        self,
        cfg: RunConfig,
        task: Task,
        gemm: Any,
        collective: Any = None,
        state: TrainState | None = None,
        *,
        units: Any = None,
        options: TrainOptions = ALONE,
    ) -> None:
        self.cfg = cfg
        self.task = task
        self.gemm = gemm
        self.units = units
        self.collective = collective
        self.options = options
        if cfg.eval_every and not all(hasattr(task, m) for m in ("heldout", "eval_loss")):
            raise ConfigError(f"task {cfg.task} has no held-out data (heldout, eval_loss): "
                              "train it with eval_every 0")
        check_task_data(task, cfg)  # its data readable here, before any step
        self.model = task.build_model(cfg, gemm)
        self.shapes = self.model.param_shapes()
        if not self.shapes:  # it would train, then fail to save: no checkpoint holds nothing
            raise ContributionError(f"task {cfg.task}: its model has no parameters "
                                    "(param_shapes is empty): there is nothing to train")
        self.state = state if state is not None else self.initial_state()
        self.size = sum(int(np.prod(s)) for s in self.shapes.values())  # P
        # the step's gated hot kernels (the reference for a task without int8 GEMMs), and
        # the update on flat buffers they make
        self.kernels = getattr(gemm, "kernels", None) or REFERENCE
        self.optimizer = FlatAdamW(self.shapes, self.kernels)
        self.capacities: dict[int, float] = dict(options.capacities or {})
        # Ranks whose recomputed work disagreed with the majority's: they compute no more
        # microbatches in this run (crosscheck.py); the same set on every peer.
        self.distrusted: set[int] = set()
        self.meter = SpeedMeter()  # its microbatch times and the speed it reports (speed.py)
        self.probe = probe_operands()  # the kernel probe's fixed operands, drawn once
        self.clock = StepClock()  # where its steps go (stepclock.py)
        self.peers = PeerCheck(self)  # the cross-peer check of its steps (peercheck.py)
        # Changes applied to cfg at step boundaries (pynode.run.schedule), in order; the
        # checkpoints carry them. `_change`: the one the next StepResult reports.
        self.schedule: list[dict] = []
        self._change: dict | None = None
        # Observers (fault injection in tests): before_compute(step about to run, own
        # microbatches) as the step starts computing; after_update(trainer) once applied;
        # after_inner(replica, step) as this peer finishes inner step `step` (1-based, the
        # run's count) of a --sync-every replica (a per-step trainer has no inner steps).
        self.before_compute: list[Callable[[int, list[int]], None]] = []
        self.after_update: list[Callable[[Trainer], None]] = []
        self.after_inner: list[Callable[[int, int], None]] = []

    def initial_params(self) -> dict[str, np.ndarray]:
        """The model's parameters at step 0, checked against its param_shapes."""
        params = self.model.init_params(self.cfg.seed)
        check_initial(params, self.shapes)
        return params

    def initial_state(self) -> TrainState:
        params = self.initial_params()
        return TrainState(step=0, params=params, opt=optim.AdamState.zeros(params))

    # --- one microbatch -------------------------------------------------------------
    def microbatch_partial(self, indices: list[int]) -> np.ndarray:
        """Sum of the fixed-point gradients, losses, coverage counts and digests of `indices`.

        Returns (P + 1 + 2n,) int64: gradient sum, loss sum, one count per microbatch, then
        one digest per microbatch (crosscheck.py; zero alone or with cross_check 0).
        With a `share` of (i, c) only every c-th of `indices` from the i-th is computed here.
        """
        indices = self.shared(indices)
        for hook in self.before_compute:
            hook(self.state.step + 1, indices)
        size, n = self.size, self.cfg.microbatches
        partial = np.zeros(size + 1 + 2 * n, dtype=np.int64)
        for index in indices:
            started = time.perf_counter()
            fixed, loss = self.contribution(index)
            self.meter.record(time.perf_counter() - started)
            partial[:size] += fixed
            partial[size] += loss
            partial[size + 1 + index] += 1
            partial[size + 1 + n + index] = self.peers.digest(index, fixed, loss)
        return partial

    @property
    def microbatch_seconds(self) -> float:
        """The measured seconds of one microbatch here (0.0 before any; speed.py)."""
        return self.meter.seconds()

    def shared(self, indices: list[int]) -> list[int]:
        """The part of this rank's `indices` computed here: with a `share` of (i, c), every
        c-th from the i-th (a cluster behind one room rank splits that rank's work, its
        microbatches and its cross-check recomputations alike); else all of them."""
        index, count = self.options.share
        return indices[index::count]

    def contribution(self, index: int) -> tuple[np.ndarray, int]:
        """Microbatch `index` of the next step: (P,) int64 fixed-point gradients and its
        fixed-point mean loss."""
        cfg, step = self.cfg, self.state.step
        batch = self.task.sample(cfg, step, index)
        loss, grads = task_loss(self.task, self.model, self.state.params, batch,
                                (cfg.seed, step, index))
        flat = self.flatten(grads)
        try:
            fixed = fixedpoint.to_fixed(flat, cfg.frac_bits)
        except NonFiniteError:  # said again with the parameter it is in (found only now)
            raise NonFiniteError(f"step {step + 1}, microbatch {index}: "
                                 f"{not_finite(self.unflatten(flat))}") from None
        mean = np.asarray([loss], np.float32)
        if not np.isfinite(mean[0]):
            raise NonFiniteError(f"step {step + 1}, microbatch {index}: the task's loss is "
                                 f"{float(mean[0])}")
        return fixed, int(fixedpoint.to_fixed(mean, LOSS_FRAC_BITS)[0])

    def flatten(self, grads: dict[str, np.ndarray]) -> np.ndarray:
        if not isinstance(grads, dict):
            raise ContributionError(f"task returned its gradients as a {type(grads).__name__}, "
                                    "not a dict of parameter name -> float32 array")
        missing = [name for name in self.shapes if name not in grads]
        if missing:
            raise ContributionError(f"task returned no gradient for {', '.join(missing)}")
        unknown = [str(name) for name in grads if name not in self.shapes]
        if unknown:  # a misspelled name would train nothing where it was meant
            raise ContributionError(f"task returned gradients for {', '.join(unknown)}, which "
                                    "are not parameters of its model (param_shapes)")
        parts = []
        for name, shape in self.shapes.items():
            g = np.asarray(grads[name])
            if g.shape != tuple(shape) or g.dtype != np.float32:
                raise ContributionError(
                    f"gradient {name}: expected {tuple(shape)} float32, got {g.shape} {g.dtype}"
                )
            parts.append(g.reshape(-1))
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        out, start = {}, 0
        for name, shape in self.shapes.items():
            size = int(np.prod(shape))
            out[name] = flat[start : start + size].reshape(shape)
            start += size
        return out

    # --- one step ---------------------------------------------------------------------
    def plan(self) -> dict[int, list[int]]:
        return microbatch_plan(self.cfg.microbatches, self.worker_capacities())

    def worker_capacities(self) -> dict[int, float]:
        """The planning speed of each worker (1.0 where none is known)."""
        return {r: self.capacities.get(r, 1.0) for r in self.workers()}

    def workers(self) -> tuple[int, ...]:
        """The members that compute microbatches: all but the distrusted (if any is left)."""
        trusted = tuple(r for r in self.members() if r not in self.distrusted)
        return trusted or self.members()

    def members(self) -> tuple[int, ...]:
        return (0,) if self.collective is None else tuple(self.collective.members)

    def rank(self) -> int:
        return 0 if self.collective is None else self.collective.rank

    def deadline(self) -> float:
        """Seconds to wait for the others: generous against the measured step time."""
        expected = self.microbatch_seconds * self.cfg.microbatches
        return max(self.options.min_deadline, 4.0 * expected)

    def adopt_capacities(self, capacities: dict[int, float]) -> None:
        """The planning speeds of the group (a joiner's from the leader, a cluster rank's
        from its bridge), so this peer plans the next step like the others."""
        self.capacities = {int(r): float(v) for r, v in capacities.items()}

    def counts(self, total: np.ndarray) -> np.ndarray:
        """The coverage counts of a reduced vector, (n,)."""
        n = self.cfg.microbatches
        return total[self.size + 1 : self.size + 1 + n]

    async def reduce(
        self, partial: np.ndarray, plan: dict[int, list[int]]
    ) -> tuple[np.ndarray, np.ndarray, dict[int, int]]:
        """Exact sum of every member's partial, re-planning microbatches nobody delivered.

        Returns (total, what this peer contributed, owner rank of each microbatch)."""
        owners = {i: r for r, indices in plan.items() for i in indices}
        if self.collective is None:
            return partial, partial, owners
        reduced = await self.collective.allreduce_int64(partial, timeout=self.deadline())
        total = same_length(reduced.total, partial)
        for _ in range(self.cfg.microbatches + 1):
            counts = self.counts(total)
            if np.any(counts > 1):
                raise ContributionError(f"microbatches counted twice: {np.flatnonzero(counts > 1)}")
            missing = [int(i) for i in np.flatnonzero(counts == 0)]
            if not missing:
                return total, partial, owners
            log.warning("step %d: re-planning lost microbatches %s", self.state.step + 1, missing)
            await self.peers.settle()  # the model computes one thing at a time
            repair = microbatch_plan(len(missing), self.worker_capacities())
            owners.update({missing[i]: r for r, picks in repair.items() for i in picks})
            extra = self.microbatch_partial([missing[i] for i in repair.get(self.rank(), [])])
            partial = partial + extra
            reduced = await self.collective.allreduce_int64(extra, timeout=self.deadline())
            total = total + same_length(reduced.total, partial)
        raise ContributionError("could not complete the step's microbatches")

    def recheck(self, index: int) -> int:
        """The digest of microbatch `index` of the next step, recomputed here."""
        return self.peers.digest(index, *self.contribution(index))

    async def step(self) -> StepResult:
        """Compute, reduce and apply one step; returns what every peer must agree on."""
        started = time.perf_counter()
        marks = [started]  # the end of each phase, stepclock.PHASES in order
        cfg = self.cfg
        plan = self.plan()
        self.peers.sample(self.state.step + 1, plan)
        round_share = self.peers.round_share(plan)
        partial = self.microbatch_partial(plan.get(self.rank(), []))
        self.peers.start(plan)
        marks.append(time.perf_counter())
        try:
            total, mine, owners = await self.reduce(partial, plan)
        except BaseException:  # the worker thread ends before anything else computes
            await asyncio.gather(self.peers.settle(), return_exceptions=True)
            raise
        marks.append(time.perf_counter())
        total = await self.peers.verify(total, mine, owners, await self.peers.settle())
        marks.append(time.perf_counter())
        size = self.size
        grads = self.kernels.from_fixed(total[:size], cfg.frac_bits, cfg.microbatches)
        loss_sum = total[size : size + 1]
        loss = float(fixedpoint.from_fixed(loss_sum, LOSS_FRAC_BITS, cfg.microbatches)[0])
        if not np.isfinite(loss):
            raise NonFiniteError(f"step {self.state.step + 1}: the reduced loss is {loss}")
        lr = optim.lr_schedule(self.state.step, cfg.lr, cfg.warmup, cfg.steps)
        params, opt = self.optimizer.update(
            self.state.params, self.state.opt, grads, lr,
            optim.AdamConfig(weight_decay=cfg.weight_decay, clip=cfg.clip),
        )
        self.state = TrainState(step=self.state.step + 1, params=params, opt=opt)
        for hook in self.after_update:
            hook(self)
        marks.append(time.perf_counter())
        state_hash = self.state.hash()
        marks.append(time.perf_counter())
        probe = probe_hash(self.gemm, self.probe)
        marks.append(time.perf_counter())
        seconds = marks[-1] - started  # up to the probe: no held-out loss, no agreement round
        heldout = self.heldout_loss() if self.evaluates(self.state.step) else None
        marks.append(time.perf_counter())
        result = StepResult(
            step=self.state.step, loss=loss, hash=state_hash, probe=probe, plan=plan,
            seconds=seconds, heldout=heldout, change=self._change,
        )
        self._change = None
        await self.check_agreement(result)
        marks.append(time.perf_counter())
        self.clock.record(marks, self.state.step, self.peers.round_step == self.state.step,
                          round_share)
        return result

    def rewind(self, state: TrainState, cfg: RunConfig, schedule: list[dict]) -> None:
        """Back to a step boundary the group agreed on (a room's leader failover): its
        state, and the config and schedule it was computed under; nothing of the step
        under way is kept."""
        self.state, self.cfg, self.schedule = state, cfg, list(schedule)
        self._change, self.peers = None, PeerCheck(self)

    def apply_change(self, change: Any) -> None:
        """A schedule change (pynode.run.schedule.Change) at this step boundary: from the
        next step on, this is the run of the changed config, on every peer alike."""
        if change.step != self.state.step:
            raise ConfigError(f"change for step {change.step} offered at step {self.state.step}")
        self.cfg = change.apply(self.cfg)
        self.schedule.append(change.to_dict())
        self._change = change.to_dict()
        log.info("step %d: config changed (%s)", change.step, change.to_dict())

    def evaluates(self, step: int) -> bool:
        """Whether the held-out loss is measured after `step` (every eval_every, the last)."""
        every = self.cfg.eval_every
        return every > 0 and (step % every == 0 or step == self.cfg.steps)

    def heldout_loss(self) -> float:
        """Mean loss of the cfg.microbatches held-out microbatches under the current weights.

        Every peer computes all of them (forward only) and sums in fixed point, as the
        training loss: the same bits on every runtime, whatever the group's shape."""
        cfg = self.cfg
        total = np.zeros(1, dtype=np.int64)
        for index in range(cfg.microbatches):
            batch = self.task.heldout(cfg, index)
            loss = self.task.eval_loss(self.model, self.state.params, batch)
            total += fixedpoint.to_fixed(np.asarray([loss], np.float32), LOSS_FRAC_BITS)
        return float(fixedpoint.from_fixed(total, LOSS_FRAC_BITS, cfg.microbatches)[0])

    async def check_agreement(self, result: StepResult) -> None:
        """Every member publishes (state hash, probe); any disagreement stops this peer."""
        if self.collective is None:
            return
        mine = f"{result.hash}:{result.probe}".encode()
        self.meter.end_step()
        speed = self.meter.speed()
        seen = await self.collective.allgather_bytes(
            mine + b"|" + repr(speed).encode(), timeout=self.deadline()
        )
        votes, speeds = [], {}
        for rank, entry in enumerate(seen):
            if entry is None:
                continue
            vote, _, peer_speed = entry.partition(b"|")
            votes.append(vote)
            speeds[rank] = float(peer_speed)
        if self.options.capacities is None:
            self.capacities = planning_speeds(speeds, self.distrusted)
        # the same decision on every peer (it hangs on `seen` and `distrusted` only): the
        # trusted agree on (state, probe), and the distrusted, who compute nothing, on state
        trusted = {e.partition(b"|")[0] for r, e in enumerate(seen)
                   if e is not None and r not in self.distrusted}
        states = {v.partition(b":")[0] for v in votes}
        if len(trusted) > 1 or len(states) > 1:
            await self.resolve_fork(result, mine, seen)

    async def resolve_fork(self, result: StepResult, mine: bytes, seen: list) -> None:
        """Re-sync a minority of diverged states from the leader, or stop.

        Re-sync only when a strict majority agrees, the leader is in it, and the diverged
        peers' kernel probes are right (a wrong probe means broken arithmetic: that peer
        leaves). A distrusted peer's probe is not asked (its work is left out already).
        Anything else stops every peer: nobody trains past a fork.
        """
        votes = {r: e.partition(b"|")[0] for r, e in enumerate(seen) if e is not None}
        ballot = list(votes.values())
        majority = max(set(ballot), key=ballot.count)
        want_hash, _, want_probe = majority.decode().partition(":")
        described = (f"step {result.step}: replicas disagree; {len(set(ballot))} distinct "
                     f"(state, probe) hashes among {len(ballot)} peers")
        probes_ok = all(v.decode().partition(":")[2] == want_probe
                        for r, v in votes.items() if r not in self.distrusted)
        if not (2 * ballot.count(majority) > len(ballot) and votes.get(0) == majority
                and probes_ok):
            who = "this peer" if mine != majority else "another peer"
            raise ForkError(f"{described} ({who} diverged); stopping")
        blob = await self.collective.broadcast_bytes(
            self.state_bytes() if self.rank() == 0 else None, timeout=self.deadline()
        )
        if mine.partition(b":")[0] != want_hash.encode():
            self.load_state_bytes(blob, want_hash)
            log.warning("%s: this peer diverged and re-synced from the leader", described)
        else:
            log.warning("%s: re-synced the diverged peer(s) from the leader", described)

    def state_bytes(self) -> bytes:
        """This peer's state as .pt bytes: weights, Adam state, step, config (+ vocab)."""
        state = self.state
        config = json.loads(self.cfg.to_json())
        vocab = getattr(self.task, "vocab", None)
        if vocab is not None:
            config["vocab"] = vocab
        if self.schedule:
            config["schedule"] = list(self.schedule)
        return checkpoint.save_checkpoint(checkpoint.CheckpointState(
            task=self.cfg.task, config=config, step=state.step,
            params=state.params, adam_m=state.opt.m, adam_v=state.opt.v,
            adam_step=state.opt.step, data_cursor=state.step, state_hash=state.hash(),
        ))

    def load_state_bytes(self, blob: bytes, want_hash: str) -> None:
        ckpt = checkpoint.load_checkpoint(blob, expect={"param_shapes": self.shapes})
        if ckpt.state_hash != want_hash:
            raise ForkError(f"re-sync state has hash {ckpt.state_hash[:16]}, "
                            f"the group agreed on {want_hash[:16]}")
        self.state = TrainState(step=ckpt.step, params=dict(ckpt.params),
                                opt=ckpt.adam_state())

