"""Deterministic AdamW with global-norm clipping and a warm-up + cosine learning-rate schedule.

Every peer applies the same update to the same reduced gradient and must get the same bits,
so every float operation here is one elementwise IEEE op in a fixed order (no fused ops, no
numpy reductions, no libm): the global norm is a pinned pairwise tree (detmath.psum), powers
are repeated multiplication, and the cosine is a polynomial written below.
Parameters, gradients and moments are float32; per-step scalars are formed in float64 and
rounded to float32 once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pynode.core import detmath
from pynode.core.errors import DaisyError, NonFiniteError, ShapeError

# Taylor coefficients of cos(pi*y) and sin(pi*y)/y in powers of y*y: (-1)^k pi^2k / (2k)!
# and (-1)^k pi^(2k+1) / (2k+1)!, each the float64 nearest the exact value (checked against
# decimal in tests). Ten terms reach below 2**-60 for |y| <= 1/4.
_COS_PI = (
    1.0, -4.934802200544679, 4.0587121264167685, -1.3352627688545895, 0.2353306303588932,
    -0.02580689139001406, 0.0019295743094039231, -0.0001046381049248457,
    4.303069587032947e-06, -1.3878952462213771e-07,
)
_SIN_PI = (
    3.141592653589793, -5.16771278004997, 2.5501640398773455, -0.5992645293207921,
    0.08214588661112823, -0.0073704309457143504, 0.00046630280576761255,
    -2.1915353447830217e-05, 7.952054001475513e-07, -2.2948428997269873e-08,
)
# torch.nn.utils.clip_grad_norm_ adds this to the norm before dividing.
CLIP_EPS = 1e-6


class OptimConfigError(DaisyError, ValueError):
    """An optimizer or schedule setting out of range (named, with the allowed range)."""


@dataclass(frozen=True)
class AdamConfig:
    beta1: float = 0.9          # decay of the first moment (torch's AdamW default)
    beta2: float = 0.999        # decay of the second moment
    eps: float = 1e-8           # added to sqrt(v_hat) so the step stays finite
    weight_decay: float = 0.0   # decoupled: p *= 1 - lr * weight_decay before the step
    clip: float = 1.0           # global gradient-norm limit; 0 disables clipping

    def __post_init__(self) -> None:
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not (is_real(value) and 0.0 <= value < 1.0):
                raise OptimConfigError(f"{name} must be in [0, 1), got {value!r}")
        if not (is_real(self.eps) and self.eps > 0.0):
            raise OptimConfigError(f"eps must be a positive finite number, got {self.eps!r}")
        for name in ("weight_decay", "clip"):
            value = getattr(self, name)
            if not (is_real(value) and value >= 0.0):
                raise OptimConfigError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class AdamState:
    m: dict[str, np.ndarray]    # name -> first moment, float32, shape of the parameter
    v: dict[str, np.ndarray]    # name -> second moment, float32
    step: int                   # updates applied so far (drives bias correction)

    @classmethod
    def zeros(cls, params: dict[str, np.ndarray]) -> AdamState:
        """Fresh state for `params`: zero moments, step 0."""
        m = {name: np.zeros(np.shape(p), np.float32) for name, p in params.items()}
        v = {name: np.zeros(np.shape(p), np.float32) for name, p in params.items()}
        return cls(m=m, v=v, step=0)


def adam_update(
    params: dict[str, np.ndarray],
    grads: dict[str, np.ndarray],
    state: AdamState,
    lr: float,
    cfg: AdamConfig | None = None,
    *,
    beta1: float | None = None,
    beta2: float | None = None,
    eps: float | None = None,
    weight_decay: float | None = None,
    clip: float | None = None,
) -> tuple[dict[str, np.ndarray], AdamState]:
    """One AdamW step: (new params, new state). Pure: the inputs are never modified.

    cfg: hyper-parameters (AdamConfig() if None); keyword arguments override single fields.
    Refuses mismatched names/shapes/dtypes (ShapeError), a non-finite gradient or a step
    whose result would be non-finite (NonFiniteError) and bad settings (OptimConfigError);
    a refused step returns nothing and, the function being pure, changes nothing.
    """
    cfg = _merged_config(cfg, beta1=beta1, beta2=beta2, eps=eps,
                         weight_decay=weight_decay, clip=clip)
    if not (is_real(lr) and lr >= 0.0):
        raise OptimConfigError(f"lr must be a finite number >= 0, got {lr!r}")
    check_tensors(params, grads, state)
    grads, _ = clip_by_global_norm(grads, cfg.clip)
    t = int(state.step) + 1
    scalars = step_scalars(cfg, float(lr), t)
    new_params, new_m, new_v = {}, {}, {}
    for name, p in params.items():
        new_params[name], new_m[name], new_v[name] = adamw_elementwise(
            p, grads[name], state.m[name], state.v[name], scalars)
    for name in sorted(new_params):
        if not np.isfinite(new_params[name]).all():
            raise NonFiniteError(f"the step would make parameter {name!r} non-finite; refused")
    return new_params, AdamState(m=new_m, v=new_v, step=t)


def adamw_elementwise(
    p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, scalars: tuple[np.float32, ...],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p', m', v') of one AdamW step of p, g, m, v (...) float32 with the step's float32
    `scalars` (b1, 1-b1, b2, 1-b2, step size, sqrt(bias2), eps, decay; step_scalars):
    m' = m*b1 + g*(1-b1), v' = v*b2 + (g*g)*(1-b2), denom = sqrt(v')/sqrt(bias2) + eps,
    p' = p*decay - (m'/denom)*step size. Each line below is one float32 op of that formula,
    in its order, on a fresh array (never on the inputs); a fused kernel
    (Kernels.adamw) performs the same ops element by element. Non-finite results are the
    caller's to refuse."""
    b1, one_minus_b1, b2, one_minus_b2, step_size, sqrt_bias2, eps32, decay = scalars
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # asarray: numpy turns 0-d results into scalars, and state must stay arrays.
        m = np.asarray(m * b1)
        m += g * one_minus_b1
        v = np.asarray(v * b2)
        gg = np.asarray(g * g)
        gg *= one_minus_b2
        v += gg
        denom = np.asarray(np.sqrt(v))
        denom /= sqrt_bias2
        denom += eps32
        update = np.asarray(m / denom)
        update *= step_size
        new_p = np.asarray(p * decay)
        new_p -= update
    return new_p, m, v


def nesterov_update(
    params: dict[str, np.ndarray],
    delta: dict[str, np.ndarray],
    momentum: dict[str, np.ndarray],
    lr: float,
    mu: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One outer step of --sync-every (DiLoCo): SGD with Nesterov momentum on the mean
    pseudo-gradient `delta` (start weights minus the replicas' end weights). Pure.

    As torch.optim.SGD(nesterov=True), one float32 op at a time in this order:
    u = u*mu + delta,  p' = p - (u*mu + delta)*lr. Returns (new params, new momentum u).
    ShapeError for mismatched tensors, NonFiniteError for a non-finite result.
    """
    if not (is_real(lr) and lr > 0.0):
        raise OptimConfigError(f"outer lr must be a finite number > 0, got {lr!r}")
    if not (is_real(mu) and 0.0 <= mu < 1.0):
        raise OptimConfigError(f"outer momentum must be in [0, 1), got {mu!r}")
    check_tensors(params, delta, AdamState(m=momentum, v=momentum, step=0))
    lr32, mu32 = np.float32(lr), np.float32(mu)
    new_params, new_momentum = {}, {}
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        for name, p in params.items():
            d = delta[name]  # (...) float32
            u = np.asarray(momentum[name] * mu32)
            u += d
            step = np.asarray(u * mu32)
            step += d
            step *= lr32
            new_params[name] = np.asarray(p - step)
            new_momentum[name] = u
    for name in sorted(new_params):
        if not np.isfinite(new_params[name]).all():
            raise NonFiniteError(f"the outer step would make parameter {name!r} non-finite; "
                                 "refused")
    return new_params, new_momentum


# --sync-every shares the replicas' AdamW second moments as integer codes of log2(v): a
# piecewise-linear log2 (exact from frexp) in steps of 2**-V_CODE_BITS of an octave (0.3 %
# of v at most), so R codes sum exactly in int64 and their mean decodes to one float32 v.
V_CODE_BITS = 8
V_FLOOR = 2.0**-100  # zero second moments (bytes never seen) code as this: sqrt ~ 1e-15


def second_moment_code(v: np.ndarray) -> np.ndarray:
    """(...) float32 second moments >= 0 -> (...) int64 codes of their log2."""
    v = np.asarray(v)
    if v.dtype != np.float32 or not (np.isfinite(v).all() and (v >= 0).all()):
        raise ShapeError("second moments must be finite float32 values >= 0")
    mant, exp = np.frexp(np.maximum(v.astype(np.float64), V_FLOOR))  # mant in [0.5, 1)
    log2 = (exp.astype(np.float64) - 2.0) + (mant * 2.0)  # exp - 1 + (2 mant - 1), exact
    return np.rint(np.ldexp(log2, V_CODE_BITS)).astype(np.int64)


def second_moment_from_codes(total: np.ndarray, count: int) -> np.ndarray:
    """The float32 second moments of the mean of `count` codes summed in `total` (int64)."""
    x = np.ldexp(np.asarray(total, np.int64).astype(np.float64), -V_CODE_BITS) / float(count)
    octave = np.floor(x)
    v = np.ldexp(1.0 + (x - octave), octave.astype(np.int64))
    return np.asarray(v.astype(np.float32))


def step_scalars(cfg: AdamConfig, lr: float, t: int) -> tuple[np.float32, ...]:
    """The per-step float32 constants of the update, each rounded once from float64."""
    bias1 = 1.0 - _powi(cfg.beta1, t)
    bias2 = 1.0 - _powi(cfg.beta2, t)
    values = (cfg.beta1, 1.0 - cfg.beta1, cfg.beta2, 1.0 - cfg.beta2, lr / bias1,
              math.sqrt(bias2), cfg.eps, 1.0 - lr * cfg.weight_decay)
    with np.errstate(over="ignore"):
        rounded = tuple(np.float32(x) for x in values)
    if not all(np.isfinite(x) for x in rounded):
        raise NonFiniteError(f"lr {lr!r} makes the step size non-finite in float32; refused")
    return rounded


def global_norm(grads: dict[str, np.ndarray]) -> float:
    """sqrt of the sum of squares of every gradient element, the same bits everywhere.

    Squares are exact in float64 (float32 products need 48 bits); they are concatenated in
    sorted-name, C order and summed by detmath.psum's pinned tree; sqrt rounds correctly.
    """
    parts = [np.asarray(grads[name], np.float64).reshape(-1) for name in sorted(grads)]
    if not parts or sum(p.shape[0] for p in parts) == 0:
        return 0.0
    flat = np.concatenate(parts)  # (n,) float64
    total = detmath.psum(flat * flat, axis=-1)  # () float64
    return float(np.sqrt(np.float64(total)))


def clip_by_global_norm(
    grads: dict[str, np.ndarray], clip: float
) -> tuple[dict[str, np.ndarray], float]:
    """(grads scaled so their global norm is at most `clip`, the norm before clipping).

    clip = 0 disables clipping. The inputs are not modified.
    """
    norm = global_norm(grads)
    if clip <= 0.0:
        return dict(grads), norm
    coef = float(clip) / (norm + CLIP_EPS)
    if coef >= 1.0:
        return dict(grads), norm
    scale = np.float32(coef)
    return {name: np.asarray(np.asarray(g) * scale) for name, g in grads.items()}, norm


def lr_schedule(
    step: int, base_lr: float, warmup: int, total: int, min_ratio: float = 0.1
) -> float:
    """Learning rate of 0-based `step`: linear warm-up to base_lr over `warmup` steps, then a
    cosine decay to min_ratio * base_lr at step `total`, constant after that."""
    for name, value in (("step", step), ("warmup", warmup), ("total", total)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
            raise OptimConfigError(f"{name} must be an integer >= 0, got {value!r}")
    if not (is_real(base_lr) and base_lr >= 0.0):
        raise OptimConfigError(f"base_lr must be a finite number >= 0, got {base_lr!r}")
    if not (is_real(min_ratio) and 0.0 <= min_ratio <= 1.0):
        raise OptimConfigError(f"min_ratio must be in [0, 1], got {min_ratio!r}")
    base_lr = float(base_lr)
    if step < warmup:
        return base_lr * float(step + 1) / float(warmup)
    min_lr = base_lr * float(min_ratio)
    if step >= total:
        return min_lr
    progress = float(step - warmup) / float(total - warmup)  # [0, 1)
    weight = 0.5 * (1.0 + cospi(progress))
    return min_lr + weight * (base_lr - min_lr)


def cospi(x: float) -> float:
    """cos(pi * x) in float64 from + - * only (no libm), within 2 ulp of 1 in absolute error.

    The reduction to |y| <= 1/4 is exact (Sterbenz), so only the polynomial rounds.
    """
    if not is_real(x):
        raise NonFiniteError(f"cospi needs a finite number, got {x!r}")
    r = abs(float(x))
    r = r - 2.0 * math.floor(r / 2.0)  # [0, 2); exact
    if r > 1.0:
        r = 2.0 - r  # cos(pi (2 - r)) = cos(pi r)
    sign = 1.0
    if r > 0.5:
        r, sign = 1.0 - r, -1.0  # cos(pi (1 - r)) = -cos(pi r)
    if r > 0.25:
        return sign * _sin_pi_small(0.5 - r)  # cos(pi r) = sin(pi (1/2 - r))
    return sign * _cos_pi_small(r)


def _cos_pi_small(y: float) -> float:
    s = y * y
    acc = _COS_PI[-1]
    for c in reversed(_COS_PI[:-1]):
        acc = acc * s + c
    return acc


def _sin_pi_small(y: float) -> float:
    s = y * y
    acc = _SIN_PI[-1]
    for c in reversed(_SIN_PI[:-1]):
        acc = acc * s + c
    return acc * y


def _powi(base: float, n: int) -> float:
    """base**n by binary exponentiation: float64 multiplies only (Python's ** calls libm pow)."""
    result, square = 1.0, float(base)
    while n:
        if n & 1:
            result *= square
        square *= square
        n >>= 1
    return result


def _merged_config(cfg: AdamConfig | None, **overrides: float | None) -> AdamConfig:
    base = cfg if cfg is not None else AdamConfig()
    if not isinstance(base, AdamConfig):
        raise OptimConfigError(f"cfg must be an AdamConfig, got {type(base).__name__}")
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return base
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    return AdamConfig(**{**fields, **given})


def check_tensors(
    params: dict[str, np.ndarray], grads: dict[str, np.ndarray], state: AdamState
) -> None:
    """Refuse (ShapeError, NonFiniteError) an update whose tensors do not all name the
    same parameters as float32 arrays of their shapes, or whose gradients are not finite:
    adam_update's checks, in its order (pynode.core.flatadam uses them too)."""
    names = set(params)
    for label, other in (("grads", grads), ("adam m", state.m), ("adam v", state.v)):
        if set(other) != names:
            missing, extra = sorted(names - set(other)), sorted(set(other) - names)
            raise ShapeError(f"{label} do not match the parameters: "
                             f"missing {missing or 'none'}, unexpected {extra or 'none'}")
    if isinstance(state.step, bool) or not isinstance(state.step, int | np.integer) \
            or state.step < 0:
        raise ShapeError(f"adam step must be an integer >= 0, got {state.step!r}")
    for name in sorted(names):
        shape = np.shape(params[name])
        for label, arr in (("param", params[name]), ("grad", grads[name]),
                           ("adam m", state.m[name]), ("adam v", state.v[name])):
            if not isinstance(arr, np.ndarray) or arr.dtype != np.float32 or arr.shape != shape:
                got = f"{type(arr).__name__} {np.shape(arr)} {getattr(arr, 'dtype', '')}"
                raise ShapeError(f"{label} {name!r}: expected {shape} float32, got {got}")
    for name in sorted(names):
        bad = ~np.isfinite(grads[name])
        if bad.any():
            raise NonFiniteError(
                f"gradient {name!r} has {int(bad.sum())} non-finite value(s); step refused"
            )


def is_real(value: object) -> bool:
    """A finite int or float (numpy's included), not a bool: what a rate or coefficient
    must be."""
    if not isinstance(value, int | float | np.integer | np.floating) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float (a JSON number of 400 digits)
        return False
