"""Run configuration: what the leader broadcasts so every peer trains the same model."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace

from pynode.core.errors import DaisyError
from pynode.datafile import is_file_spec, split_spec


class ConfigError(DaisyError, ValueError):
    """A run configuration that cannot be trained (named field, reason)."""


# The smallest learning rate a run takes: float32's smallest normal number (2**-126). AdamW
# steps in float32 (pynode.core.optim.step_scalars); below it a rate loses its digits, and
# from about 1.4e-45 it is 0.
MIN_LR = 2.0**-126

# The most steps (and sync_every) a run may be given: 10**30 was taken, a slip that trains
# forever; 10,000,000 steps are days even at 0.1 s a step. The page has the same bound,
# MAX_STEPS in server/static/app.js (tests/server/test_pages.py keeps the two equal).
MAX_STEPS = 10_000_000


@dataclass(frozen=True)
class RunConfig:
    task: str = "gpt"            # registered task name or module:Class
    steps: int = 200             # optimizer steps of the run
    seed: int = 1                # keys init, data sampling and stochastic rounding
    width: int = 64              # model width (embedding size)
    layers: int = 2              # transformer blocks
    heads: int = 4               # attention heads; must divide width
    seq: int = 64                # context length in bytes
    microbatch_size: int = 8     # sequences per microbatch
    microbatches: int = 4        # microbatches per step (the global batch)
    lr: float = 3e-3             # peak learning rate
    warmup: int = 10             # linear warm-up steps before the cosine decay
    weight_decay: float = 0.0    # decoupled (AdamW) weight decay
    clip: float = 1.0            # global gradient-norm clip; 0 disables
    frac_bits: int = 32          # F of the int64 fixed-point gradient format
    data: str = "builtin"        # "builtin" corpus, a DaisyChain server URL serving /data,
    #                              or file:PATH#sha256=HEX (--data FILE; pynode.datafile)
    # What a /data server may send when it cannot read its shards: "none" (the run stops,
    # its text never silently changes) or "builtin" (the built-in corpus, said in a warning)
    data_fallback: str = "none"
    eval_every: int = 0          # held-out loss every N steps and at the last; 0: never. On,
    #                              the last 1/32 of a builtin or file text is held out of training
    cross_check: int = 32        # each microbatch recomputed by another peer with chance 1/N
    #                              (pynode/run/crosscheck.py, docs/VERIFICATION.md); 0: never
    # Low-communication training (pynode/run/outer.py, docs/QUICKSTART.md). H > 1: the run
    # has `replicas` virtual replicas, each takes H AdamW steps on microbatches/replicas of
    # every step's microbatches, then their pseudo-gradients are summed exactly and the outer
    # Nesterov step updates the shared weights. 1: the whole gradient is reduced every step.
    sync_every: int = 1          # H: inner steps between two exact reductions
    replicas: int = 1            # R: virtual replicas (fixed here, not by the number of peers)
    outer_lr: float = 0.7        # outer Nesterov learning rate (DiLoCo's 0.7)
    outer_momentum: float = 0.9  # outer Nesterov momentum (DiLoCo's 0.9)

    def __post_init__(self) -> None:
        positive = ("steps", "width", "layers", "heads", "seq", "microbatch_size", "microbatches")
        for name in positive:
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        if self.width % self.heads:
            raise ConfigError(f"heads ({self.heads}) must divide width ({self.width})")
        if not 0 < self.lr < 1:
            raise ConfigError(f"lr must be in (0, 1), got {self.lr}")
        if self.lr < MIN_LR:  # 1e-300 passed, and the run trained nothing
            raise ConfigError(f"lr {self.lr!r} is below {MIN_LR:.3g}, the smallest float32 "
                              "number of full precision: AdamW steps in float32, where such "
                              "a rate rounds to 0 or next to it and nothing would train; it "
                              f"must be at least {MIN_LR:.3g} (the default is "
                              f"{_DEFAULTS['lr']})")
        self._check_optimizer()
        if is_file_spec(self.data):
            try:
                split_spec(self.data)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        elif self.data != "builtin" and not self.data.startswith(("http://", "https://")):
            raise ConfigError(f"data must be 'builtin', an http(s) server URL or "
                              f"file:PATH#sha256=HEX, got {self.data!r}")
        if self.data_fallback not in ("none", "builtin"):
            raise ConfigError(f"data_fallback must be 'none' or 'builtin', got "
                              f"{self.data_fallback!r}")
        if not isinstance(self.cross_check, int) or self.cross_check < 0:
            raise ConfigError(f"cross_check must be an integer >= 0 (0: off), got "
                              f"{self.cross_check!r}")
        if not isinstance(self.eval_every, int) or self.eval_every < 0:
            raise ConfigError(f"eval_every must be an integer >= 0 (0: never), got "
                              f"{self.eval_every!r}")
        self._check_sync_every()
        if not 16 <= self.frac_bits <= 40:
            raise ConfigError(f"frac_bits must be in 16..40, got {self.frac_bits}")

    def _check_optimizer(self) -> None:
        """What AdamW and the schedule refuse (pynode.core.optim, asked here), refused before
        anything starts: a room would otherwise stop every peer at its first step."""
        from pynode.core import optim

        try:
            optim.AdamConfig(weight_decay=self.weight_decay, clip=self.clip)
            optim.lr_schedule(0, self.lr, self.warmup, self.steps)
        except optim.OptimConfigError as exc:
            raise ConfigError(str(exc)) from None

    def _check_sync_every(self) -> None:
        for name in ("sync_every", "replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.replicas > 1 and self.sync_every == 1:
            raise ConfigError(f"replicas {self.replicas} needs sync_every H > 1 (with 1 the "
                              "whole batch is reduced every step: there are no replicas)")
        if self.microbatches % self.replicas:
            raise ConfigError(f"replicas ({self.replicas}) must divide microbatches "
                              f"({self.microbatches}): each replica takes microbatches/replicas "
                              "of every step's microbatches")
        if not 0 < self.outer_lr <= 2:
            raise ConfigError(f"outer_lr must be in (0, 2], got {self.outer_lr!r}")
        if not 0 <= self.outer_momentum < 1:
            raise ConfigError(f"outer_momentum must be in [0, 1), got {self.outer_momentum!r}")

    @property
    def outer(self) -> bool:
        """Whether this run syncs every sync_every steps (pynode.run.outer)."""
        return self.sync_every > 1

    def to_json(self) -> str:
        # The fields of --sync-every are written only when set, so a per-step run's config
        # (and its checkpoints) keep the bytes they had before those fields existed.
        data = asdict(self)
        for name in OUTER_FIELDS:
            if data[name] == _DEFAULTS[name]:
                del data[name]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(unknown)}")
        return cls(**data)

    def with_(self, **changes) -> RunConfig:
        return replace(self, **changes)


OUTER_FIELDS = ("sync_every", "replicas", "outer_lr", "outer_momentum")


def check_outer_given(given: dict, cfg: RunConfig) -> None:
    """ConfigError for an outer learning rate or momentum someone gave (`given`: the flags
    or fields set) to a run with no outer step (sync_every 1): a per-step run took them
    silently into its config. Judged where they are given, not in RunConfig itself, so a
    checkpoint or a room config that already holds them still loads."""
    named = [f"{name} {given[name]!r}" for name in ("outer_lr", "outer_momentum") if name in given]
    if named and cfg.sync_every == 1:
        raise ConfigError(f"{' and '.join(named)} set the outer step of a run that syncs every "
                          "H > 1 steps: with sync_every 1 there is none (give sync_every H, "
                          "or leave them out)")


def check_run_length(given: dict) -> None:
    """ConfigError for steps or sync_every given (`given`: the flags or fields set) past
    MAX_STEPS. Judged where they are given, not in RunConfig itself, so a checkpoint or a
    room config that already holds more still loads."""
    for name in ("steps", "sync_every"):
        value = given.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_STEPS:
            raise ConfigError(f"{name} must be at most {MAX_STEPS:,} (days of a run even at "
                              f"0.1 s a step; the page has the same bound), got {value:,}")


_DEFAULTS = {f.name: f.default for f in fields(RunConfig)}
