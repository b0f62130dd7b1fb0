"""Deterministic AdamW, global-norm clipping, the lr schedule and its libm-free cosine."""

import math
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest

from pynode.core.errors import NonFiniteError, ShapeError
from pynode.core.optim import (
    _COS_PI,
    _SIN_PI,
    AdamConfig,
    AdamState,
    OptimConfigError,
    adam_update,
    clip_by_global_norm,
    cospi,
    global_norm,
    lr_schedule,
)

F32 = np.float32


def make_state(seed: int, shapes=None):
    shapes = shapes or {"w": (3, 4), "b": (4,), "s": ()}
    rs = np.random.RandomState(seed)
    params = {k: np.asarray(rs.standard_normal(s), F32) for k, s in shapes.items()}
    grads = {k: np.asarray(rs.standard_normal(s) * 0.1, F32) for k, s in shapes.items()}
    return params, grads


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def reference_adam(p, g, m, v, t, lr, cfg):
    """The documented update, one element at a time with float32 scalars."""
    bias1 = 1.0 - math.prod([cfg.beta1] * t)  # t <= 3: same products as binary powering
    bias2 = 1.0 - math.prod([cfg.beta2] * t)
    b1, c1, b2, c2 = F32(cfg.beta1), F32(1.0 - cfg.beta1), F32(cfg.beta2), F32(1.0 - cfg.beta2)
    step_size, sb2, eps = F32(lr / bias1), F32(math.sqrt(bias2)), F32(cfg.eps)
    decay = F32(1.0 - lr * cfg.weight_decay)
    out_p, out_m, out_v = (np.empty(p.shape, F32) for _ in range(3))
    for i in np.ndindex(p.shape):
        mi = F32(F32(m[i] * b1) + F32(g[i] * c1))
        vi = F32(F32(v[i] * b2) + F32(F32(g[i] * g[i]) * c2))
        denom = F32(F32(F32(np.sqrt(vi)) / sb2) + eps)
        out_p[i] = F32(F32(p[i] * decay) - F32(F32(mi / denom) * step_size))
        out_m[i], out_v[i] = mi, vi
    return out_p, out_m, out_v


def test_update_matches_elementwise_reference_bit_for_bit():
    params, _ = make_state(0)
    # tiny weights, so the last bit of every step term shows in the new weights
    params = {k: np.asarray(p * F32(1e-6)) for k, p in params.items()}
    cfg = AdamConfig(weight_decay=0.1, clip=0.0)
    state = AdamState.zeros(params)
    lr = 3e-3
    for t in (1, 2, 3):
        _, grads = make_state(t)
        new_params, new_state = adam_update(params, grads, state, lr, cfg)
        for name in params:
            rp, rm, rv = reference_adam(params[name], grads[name], state.m[name],
                                        state.v[name], t, lr, cfg)
            assert np.array_equal(bits(new_params[name]), bits(rp))
            assert np.array_equal(bits(new_state.m[name]), bits(rm))
            assert np.array_equal(bits(new_state.v[name]), bits(rv))
        assert new_state.step == t
        params, state = new_params, new_state


@pytest.mark.slow  # torch.optim imports torch._dynamo on its first step (seconds)
def test_matches_torch_adamw_semantics():
    torch = pytest.importorskip("torch")
    params, _ = make_state(1)
    names = list(params)
    tparams = [torch.nn.Parameter(torch.from_numpy(params[n].copy())) for n in names]
    opt = torch.optim.AdamW(tparams, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)
    state = AdamState.zeros(params)
    for step in range(5):
        _, grads = make_state(10 + step)
        # norm > 1, so clipping is active
        grads = {k: np.asarray(g * F32(5.0)) for k, g in grads.items()}
        for tp, n in zip(tparams, names, strict=True):
            tp.grad = torch.from_numpy(grads[n].copy())
        torch.nn.utils.clip_grad_norm_(tparams, 1.0)
        opt.step()
        params, state = adam_update(params, grads, state, 1e-2, weight_decay=0.05, clip=1.0)
    for tp, n in zip(tparams, names, strict=True):
        np.testing.assert_allclose(params[n], tp.detach().numpy(), rtol=2e-6, atol=1e-7)


def test_inputs_are_never_modified():
    params, grads = make_state(2)
    state = AdamState.zeros(params)
    state = AdamState(m={k: np.asarray(v + F32(0.5)) for k, v in state.m.items()},
                      v={k: np.asarray(v + F32(0.25)) for k, v in state.v.items()}, step=4)
    copies = [{k: a.copy() for k, a in d.items()} for d in (params, grads, state.m, state.v)]
    adam_update(params, grads, state, 1e-3, weight_decay=0.1, clip=0.01)
    for before, after in zip(copies, (params, grads, state.m, state.v), strict=True):
        for k in before:
            assert np.array_equal(bits(before[k]), bits(after[k]))
    assert state.step == 4


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_gradient_refused_before_any_change(bad):
    params, grads = make_state(3)
    grads["w"][1, 2] = bad
    state = AdamState.zeros(params)
    with pytest.raises(NonFiniteError, match="'w'"):
        adam_update(params, grads, state, 1e-3)
    assert state.step == 0 and all(not v.any() for v in state.m.values())


def test_wrong_names_shapes_and_dtypes_refused():
    params, grads = make_state(4)
    state = AdamState.zeros(params)
    with pytest.raises(ShapeError, match="missing"):
        adam_update(params, {k: g for k, g in grads.items() if k != "b"}, state, 1e-3)
    with pytest.raises(ShapeError, match="'w'"):
        adam_update(params, {**grads, "w": grads["w"].T.copy()}, state, 1e-3)
    with pytest.raises(ShapeError, match="float32"):
        adam_update(params, {**grads, "b": grads["b"].astype(np.float64)}, state, 1e-3)
    with pytest.raises(ShapeError, match="adam m"):
        adam_update(params, grads, AdamState(m={}, v=state.v, step=0), 1e-3)


def test_bad_settings_refused():
    params, grads = make_state(5)
    state = AdamState.zeros(params)
    for kwargs in ({"beta1": 1.0}, {"beta2": -0.1}, {"eps": 0.0}, {"weight_decay": -1.0},
                   {"clip": float("nan")}):
        with pytest.raises(OptimConfigError):
            adam_update(params, grads, state, 1e-3, **kwargs)
    for lr in (-1e-3, float("inf"), "0.1"):
        with pytest.raises(OptimConfigError):
            adam_update(params, grads, state, lr)


def test_a_step_that_would_overflow_is_refused():
    params, grads = make_state(6)
    state = AdamState.zeros(params)
    with pytest.raises(NonFiniteError, match="non-finite"):
        adam_update(params, grads, state, 1e38)  # step size lr / (1 - beta1) overflows float32
    assert state.step == 0


def test_global_norm_against_exact_sum_and_independent_of_order():
    params, grads = make_state(7, {"a": (300,), "b": (17, 5), "c": ()})
    exact = sum(Fraction(float(x)) ** 2 for g in grads.values() for x in g.reshape(-1))
    norm = global_norm(grads)
    assert abs(norm - math.sqrt(exact)) <= 4 * math.ulp(norm)
    reordered = {k: grads[k] for k in reversed(list(grads))}
    assert global_norm(reordered) == norm
    assert global_norm({}) == 0.0


def test_clipping_scales_to_the_limit_and_leaves_small_grads_alone():
    _, grads = make_state(8)
    norm = global_norm(grads)
    clipped, reported = clip_by_global_norm(grads, norm / 4)
    assert reported == norm
    assert global_norm(clipped) <= norm / 4 * (1 + 1e-6)
    assert global_norm(clipped) >= norm / 4 * (1 - 1e-5)
    same, _ = clip_by_global_norm(grads, norm * 2)
    assert all(same[k] is grads[k] for k in grads)
    params, _ = make_state(9)
    state = AdamState.zeros(params)
    a = adam_update(params, grads, state, 1e-3, clip=norm / 4)[0]
    b = adam_update(params, clipped, state, 1e-3, clip=0.0)[0]
    assert all(np.array_equal(bits(a[k]), bits(b[k])) for k in a)


def test_lr_schedule_shape():
    base, warm, total = 3e-3, 10, 110
    lrs = [lr_schedule(s, base, warm, total) for s in range(total + 5)]
    assert lrs[0] == base / warm and lrs[warm - 1] == base
    assert all(a < b for a, b in zip(lrs[: warm - 1], lrs[1:warm], strict=True))
    assert abs(lrs[warm] - base) <= math.ulp(base)
    assert all(a >= b for a, b in zip(lrs[warm:total], lrs[warm + 1 : total + 1], strict=True))
    assert lrs[total] == lrs[-1] == base * 0.1
    mid = warm + (total - warm) // 2
    assert abs(lrs[mid] - 0.55 * base) <= 2 * math.ulp(base)
    for s in range(warm, total):
        want = 0.1 * base + 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm))) * 0.9 * base
        assert abs(lrs[s] - want) <= 4 * math.ulp(base)
    assert lr_schedule(5, 1.0, 0, 10, min_ratio=0.0) == pytest.approx(0.5)


def test_lr_schedule_refuses_bad_arguments():
    for args in ((-1, 1e-3, 1, 10), (0, -1e-3, 1, 10), (0, 1e-3, -2, 10), (0, 1e-3, 1, 2.5),
                 (0, float("nan"), 1, 10)):
        with pytest.raises(OptimConfigError):
            lr_schedule(*args)
    with pytest.raises(OptimConfigError):
        lr_schedule(0, 1e-3, 1, 10, min_ratio=1.5)


def exact_cospi(x: float) -> Decimal:
    """cos(pi x) to ~50 digits by its Taylor series in Decimal (the oracle)."""
    getcontext().prec = 60
    pi = Decimal("3.14159265358979323846264338327950288419716939937510582097494")
    z = pi * Decimal(x)
    term, total, k = Decimal(1), Decimal(1), 0
    while abs(term) > Decimal(10) ** -55:
        k += 2
        term = -term * z * z / (k * (k - 1))
        total += term
    return total


def test_cospi_within_two_ulp_of_one_against_decimal():
    rs = np.random.RandomState(12)
    xs = [0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 1 / 3, -1 / 3, 0.1, -7.25, 1e-9, 0.2499999999]
    xs += [float(x) for x in rs.uniform(-4.0, 4.0, 400)]
    worst = 0.0
    for x in xs:
        err = abs(Decimal(cospi(x)) - exact_cospi(x))
        worst = max(worst, float(err))
    assert worst <= 2 * 2.0**-53


def test_cospi_exact_points_and_refusal():
    assert cospi(0.0) == 1.0 and cospi(2.0) == 1.0 and cospi(1.0) == -1.0
    assert cospi(0.5) == 0.0 and cospi(1.5) == 0.0
    assert cospi(2.0**60) == 1.0
    with pytest.raises(NonFiniteError):
        cospi(float("inf"))


def test_cospi_coefficients_are_nearest_doubles_of_exact_values():
    getcontext().prec = 60
    pi = Decimal("3.14159265358979323846264338327950288419716939937510582097494")
    for k, c in enumerate(_COS_PI):
        assert c == float((-1) ** k * pi ** (2 * k) / math.factorial(2 * k))
    for k, c in enumerate(_SIN_PI):
        assert c == float((-1) ** k * pi ** (2 * k + 1) / math.factorial(2 * k + 1))
