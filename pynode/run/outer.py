"""--sync-every H: low-communication training over virtual replicas, the same bits anywhere.

A run of `replicas` R virtual replicas (fixed by the config, never by the number of peers)
advances in outer steps of H inner steps. In each, every replica starts from the shared
weights and the shared AdamW second moment v (its first moment m restarts at zero) and
takes H inner steps of the run's AdamW (the run's learning-rate
schedule, clip and weight decay) on its own microbatches: at global step s,
replica r takes microbatches r*M/R .. (r+1)*M/R - 1 of step s, the very microbatches (and
stochastic-rounding keys) a per-step run has at step s, so R replicas together read the
tokens a per-step run reads. Then each replica's pseudo-gradient (start minus end weights)
becomes int64 fixed point, its end v integer log2 codes (optim.second_moment_code), and
the collective sums both exactly, as a per-step run sums gradients; the mean
pseudo-gradient updates the shared weights by SGD with Nesterov momentum (DiLoCo: outer
lr 0.7, momentum 0.9; optim.nesterov_update) and the mean code is the next shared v.
Restarting v too (fresh AdamW every outer step) cost 2-6 % of final loss in the runs of
benchmarks/README.md; keeping it costs a second integer vector per outer step.

The capacity plan assigns whole replicas to peers; a replica's owner that is lost has its
replica recomputed by another peer from the last boundary (Trainer.reduce re-plans it), so
the result is the same for 1 peer, N peers of any capacities, gloo, rooms and mixed groups.
State, hashes, checkpoints and joins are at outer-step boundaries: TrainState.step counts
inner steps (a multiple of H, or the run's last step), and its optimizer state holds the
outer momentum in `m`, the shared second moment in `v` and the outer steps done in `step`,
so checkpoints, state hashes and re-syncs take it unchanged.

Not (yet) in this mode: the cross-peer recomputation of sampled microbatches (cross_check).

Legend: P = parameters (flattened in the model's declared order), R = replicas.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from pynode.core import fixedpoint, optim
from pynode.core.errors import NonFiniteError
from pynode.core.plan import microbatch_plan, replica_microbatches
from pynode.core.probe import probe_hash
from pynode.run.trainer import LOSS_FRAC_BITS, StepResult, Trainer, TrainState, task_loss


def stop_if_cancelled(task: asyncio.Task | None = None) -> None:
    """Raise CancelledError where this step's task (or `task`: a room peer's command, which
    Ctrl-C cancels instead) was asked to stop (Ctrl-C or SIGTERM cancel the command's task):
    an outer step computes its H inner steps without awaiting anything, so a cancel waited
    for all of them (minutes at a large H) and, in the last outer step, arrived after the
    run had said it finished. The state is still the last boundary's: nothing is applied
    before the reduce. Nothing to do off the event loop's thread (a recomputation in a
    worker thread)."""
    if task is None:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+; 3.10's asyncio.run
    if cancelling is not None and cancelling():      # raises KeyboardInterrupt mid-step
        raise asyncio.CancelledError


class OuterTrainer(Trainer):
    """A Trainer whose step() is one outer step of --sync-every (cfg.sync_every > 1).

    Built by pynode.run.assemble.build_trainer for such a config, and driven by the same
    loop, hooks, agreement check and re-sync as a per-step trainer.
    """

    def initial_state(self) -> TrainState:
        params = self.initial_params()
        return TrainState(step=0, params=params, opt=optim.AdamState.zeros(params))

    def inner_steps(self) -> int:
        """Inner steps of the next outer step: H, or what is left of the run."""
        return min(self.cfg.sync_every, self.cfg.steps - self.state.step)

    # --- who computes which replica ------------------------------------------------------
    def replica_plan(self) -> dict[int, list[int]]:
        """rank -> the replicas it computes in the next outer step (capacity-weighted)."""
        return microbatch_plan(self.cfg.replicas, self.worker_capacities())

    def plan(self) -> dict[int, list[int]]:
        """rank -> the microbatch indices (of every inner step) of its replicas."""
        cfg = self.cfg
        return {rank: [i for r in replicas
                       for i in replica_microbatches(r, cfg.microbatches, cfg.replicas)]
                for rank, replicas in self.replica_plan().items()}

    def deadline(self) -> float:
        expected = self.microbatch_seconds * self.cfg.microbatches * self.inner_steps()
        return max(self.options.min_deadline, 4.0 * expected)

    def counts(self, total: np.ndarray) -> np.ndarray:
        """The coverage count of each replica in a reduced vector, (R,)."""
        return total[2 * self.size + 1 : 2 * self.size + 1 + self.cfg.replicas]

    # --- one replica ---------------------------------------------------------------------
    def microbatch_partial(self, indices: list[int]) -> np.ndarray:
        """Fixed-point pseudo-gradients, second-moment code changes, losses and coverage counts of
        the replicas `indices` over the next outer step: (2P + 1 + R,) int64.
        With a `share` of (i, c) only every c-th of them from the i-th is computed here."""
        index, count = self.options.share
        indices = indices[index::count]
        for hook in self.before_compute:
            hook(self.state.step + 1, indices)
        size = self.size
        partial = np.zeros(2 * size + 1 + self.cfg.replicas, dtype=np.int64)
        done = self.inner_steps() * self.cfg.microbatches // self.cfg.replicas  # a replica's
        for replica in indices:
            started = time.perf_counter()
            delta, codes, loss = self.replica_delta(replica)
            self.meter.record(time.perf_counter() - started, done)
            partial[:size] += delta
            partial[size : 2 * size] += codes
            partial[2 * size] += loss
            partial[2 * size + 1 + replica] += 1
        return partial

    def replica_delta(self, replica: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Replica `replica`'s inner steps from the shared state: its (P,) int64 fixed-point
        pseudo-gradient (start minus end weights), (P,) int64 codes of its end second
        moments (less the shared ones') and the fixed-point sum of its microbatches' mean
        losses."""
        cfg, start = self.cfg, self.state.step
        picks = replica_microbatches(replica, cfg.microbatches, cfg.replicas)
        params = self.state.params
        # m restarts at zero, v is the replicas' shared second moment; both bias-corrected
        # for the run's steps (a bias-corrected restart of m alone divides a single noisy
        # gradient by a settled v: much worse, measured)
        zeros = {name: np.zeros_like(p) for name, p in params.items()}
        adam = optim.AdamState(m=zeros, v=self.state.opt.v, step=start)
        loss_sum = 0
        for step in range(start, start + self.inner_steps()):
            total = np.zeros(self.size, dtype=np.int64)  # (P,) int64
            for index in picks:
                batch = self.task.sample(cfg, step, index)
                loss, grads = task_loss(self.task, self.model, params, batch,
                                        (cfg.seed, step, index))
                total += fixedpoint.to_fixed(self.flatten(grads), cfg.frac_bits)
                loss_sum += int(fixedpoint.to_fixed(np.asarray([loss], np.float32),
                                                    LOSS_FRAC_BITS)[0])
            grads = self.kernels.from_fixed(total, cfg.frac_bits, len(picks))
            lr = optim.lr_schedule(step, cfg.lr, cfg.warmup, cfg.steps)
            params, adam = self.optimizer.update(
                params, adam, grads, lr,
                optim.AdamConfig(weight_decay=cfg.weight_decay, clip=cfg.clip))
            for hook in self.after_inner:
                hook(replica, step + 1)
            stop_if_cancelled()
        delta = np.asarray(self.flatten(self.state.params) - self.flatten(params))  # (P,) f32
        # relative to the shared v's codes: small integers, which pack to a few bits each
        codes = optim.second_moment_code(self.flatten(adam.v)) - self.shared_codes()
        return fixedpoint.to_fixed(delta, cfg.frac_bits), codes, loss_sum

    def shared_codes(self) -> np.ndarray:
        """(P,) int64 codes of the shared second moment at the last boundary."""
        return optim.second_moment_code(self.flatten(self.state.opt.v))

    # --- one outer step ------------------------------------------------------------------
    async def step(self) -> StepResult:
        """Compute this peer's replicas, reduce the pseudo-gradients exactly, apply the
        outer step; returns what every peer must agree on (at the outer boundary)."""
        started = time.perf_counter()
        marks = [started]  # the end of each phase, stepclock.PHASES in order
        cfg, inner = self.cfg, self.inner_steps()
        replicas = self.replica_plan()
        plan = self.plan()
        partial = self.microbatch_partial(replicas.get(self.rank(), []))
        marks.append(time.perf_counter())
        total, _, _ = await self.reduce(partial, replicas)
        marks += [time.perf_counter()] * 2  # no cross-peer checks in outer steps (verify)
        size = self.size
        delta = self.unflatten(fixedpoint.from_fixed(total[:size], cfg.frac_bits, cfg.replicas))
        codes = total[size : 2 * size] + self.shared_codes() * cfg.replicas  # (P,) int64
        second = self.unflatten(optim.second_moment_from_codes(codes, cfg.replicas))
        loss = float(fixedpoint.from_fixed(total[2 * size : 2 * size + 1], LOSS_FRAC_BITS,
                                           inner * cfg.microbatches)[0])
        if not np.isfinite(loss):
            raise NonFiniteError(f"step {self.state.step + inner}: the reduced loss is {loss}")
        params, momentum = optim.nesterov_update(self.state.params, delta, self.state.opt.m,
                                                 cfg.outer_lr, cfg.outer_momentum)
        opt = optim.AdamState(m=momentum, v=second, step=self.state.opt.step + 1)
        self.state = TrainState(step=self.state.step + inner, params=params, opt=opt)
        for hook in self.after_update:
            hook(self)
        marks.append(time.perf_counter())
        state_hash = self.state.hash()
        marks.append(time.perf_counter())
        probe = probe_hash(self.gemm, self.probe)
        marks.append(time.perf_counter())
        seconds = marks[-1] - started
        heldout = self.heldout_loss() if self.evaluates_outer(inner) else None
        marks.append(time.perf_counter())
        result = StepResult(
            step=self.state.step, loss=loss, hash=state_hash, probe=probe, plan=plan,
            seconds=seconds, heldout=heldout, change=self._change, inner=inner,
        )
        self._change = None
        await self.check_agreement(result)
        marks.append(time.perf_counter())
        if inner == cfg.sync_every:  # a run's shorter last outer step is not a typical one
            self.clock.record(marks, self.state.step, False, 0.0)
        return result

    def evaluates_outer(self, inner: int) -> bool:
        """Whether the held-out loss is measured after the outer step of `inner` steps just
        applied: it passed a multiple of eval_every, or ended the run."""
        every, step = self.cfg.eval_every, self.state.step
        return every > 0 and (step // every > (step - inner) // every or step == self.cfg.steps)
