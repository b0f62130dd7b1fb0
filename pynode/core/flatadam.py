"""The trainer's AdamW step on flat buffers: optim.adam_update's bits in a few passes.

optim.adam_update walks the model's tensors one by one, about a dozen numpy calls each,
and takes its gradients as a dict; the reduced gradient arrives as one flat vector. This
keeps the parameters and both moments as one flat float32 buffer each (the state's dicts
hold views of them, in the model's declared order), and has the step's kernels
(pynode.core.kernels: the numpy reference, or a gated fused one) update all of them at
once. The global norm sums the same squares in the same order (sorted names) with the
same pinned tree, so every bit equals optim.adam_update's; so do its refusals.

Legend: P parameters.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pynode.core import optim
from pynode.core.errors import NonFiniteError, ShapeError


class FlatAdamW:
    """AdamW over the parameters `shapes` (name -> shape, the model's declared order)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], kernels: Any) -> None:
        self.kernels = kernels  # pynode.core.kernels.Kernels: adamw, psum_rows
        self.shapes = dict(shapes)
        self.spans: dict[str, tuple[int, int]] = {}
        start = 0
        for name, shape in self.shapes.items():
            size = math.prod(shape)
            self.spans[name] = (start, start + size)
            start += size
        self.size = start
        self._by_name = [self.spans[name] for name in sorted(self.spans)]  # the norm's order
        # the last step's dicts, the views each held when made, and their flat buffers
        self._made: list[tuple[dict, dict, np.ndarray]] = []

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """name -> the view of `flat` (P,) that holds that tensor."""
        return {name: flat[a:b].reshape(self.shapes[name]) for name, (a, b) in self.spans.items()}

    def made(self, tensors: dict[str, np.ndarray]) -> np.ndarray | None:
        """The flat buffer behind `tensors` where this made them and they are still its
        views, every one of its shape and dtype; else None."""
        for made, views, flat in self._made:
            if (tensors is made and len(tensors) == len(views)
                    and all(tensors.get(n) is view and view.shape == self.shapes[n]
                            and view.dtype == np.float32 for n, view in views.items())):
                return flat
        return None

    def flat(self, tensors: dict[str, np.ndarray]) -> np.ndarray:
        """(P,) float32: tensors (that optim's checks passed) in declared order."""
        if not self.shapes:
            return np.zeros(0, np.float32)
        return np.concatenate([tensors[name].reshape(-1) for name in self.shapes])

    def global_norm(self, grads: np.ndarray) -> float:
        """optim.global_norm of the tensors of `grads` (P,): the same squares, order and tree."""
        if self.size == 0:
            return 0.0
        squares = np.concatenate([grads[a:b] for a, b in self._by_name]).astype(np.float64)
        squares *= squares
        return float(np.sqrt(np.float64(self.kernels.psum_rows(squares))))

    def update(
        self, params: dict[str, np.ndarray], state: optim.AdamState, grads: np.ndarray,
        lr: float, cfg: optim.AdamConfig,
    ) -> tuple[dict[str, np.ndarray], optim.AdamState]:
        """optim.adam_update(params, the tensors of `grads` (P,) f32, state, lr, cfg): the
        same bits and refusals. Pure: the inputs are never modified."""
        if not (optim.is_real(lr) and lr >= 0.0):
            raise optim.OptimConfigError(f"lr must be a finite number >= 0, got {lr!r}")
        if not (isinstance(grads, np.ndarray) and grads.dtype == np.float32
                and grads.shape == (self.size,)):
            raise ShapeError(f"grads: expected ({self.size},) float32, got "
                             f"{getattr(grads, 'dtype', type(grads).__name__)} {np.shape(grads)}")
        flats = [self.made(d) for d in (params, state.m, state.v)]
        if all(f is not None for f in flats):
            # this step's own state: its names, shapes and dtypes hold by construction
            if isinstance(state.step, bool) or not isinstance(state.step, int | np.integer) \
                    or state.step < 0:
                raise ShapeError(f"adam step must be an integer >= 0, got {state.step!r}")
            self._refuse_nonfinite(grads, "gradient {!r} has {} non-finite value(s); step "
                                          "refused")
        else:  # anything else: optim.adam_update's checks, in its order
            optim.check_tensors(params, self.views(grads), state)
            flats = [self.flat(d) for d in (params, state.m, state.v)]
        p, m, v = flats
        scale = None
        if cfg.clip > 0.0:
            coef = float(cfg.clip) / (self.global_norm(grads) + optim.CLIP_EPS)
            scale = np.float32(coef) if coef < 1.0 else None
        t = int(state.step) + 1
        scalars = optim.step_scalars(cfg, float(lr), t)
        new_p, new_m, new_v = self.kernels.adamw(p, grads, m, v, scalars, scale)
        self._refuse_nonfinite(new_p, "the step would make parameter {!r} non-finite; refused")
        made = [self.views(new_p), self.views(new_m), self.views(new_v)]
        self._made = [(d, dict(d), flat) for d, flat in zip(made, (new_p, new_m, new_v),
                                                              strict=True)]
        return made[0], optim.AdamState(m=made[1], v=made[2], step=t)

    def _refuse_nonfinite(self, flat: np.ndarray, message: str) -> None:
        """NonFiniteError naming the first tensor (sorted names) of `flat` with a NaN or Inf."""
        if np.isfinite(flat).all():
            return
        for name in sorted(self.spans):
            a, b = self.spans[name]
            bad = int(np.count_nonzero(~np.isfinite(flat[a:b])))
            if bad:
                raise NonFiniteError(message.format(name, bad))
