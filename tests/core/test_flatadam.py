"""The trainer's flat AdamW (core/flatadam.py): optim.adam_update's bits and refusals."""

from __future__ import annotations

import numpy as np
import pytest

from pynode.core import optim
from pynode.core.errors import NonFiniteError, ShapeError
from pynode.core.flatadam import FlatAdamW
from pynode.core.kernels import REFERENCE

SHAPES = {"wte": (11, 6), "b": (6,), "scale": (), "attn.w": (6, 18), "a.first": (3, 2, 5)}
F32 = np.float32


def kernel_sets():
    sets = [REFERENCE]
    try:
        from pynode.native_kernels import NumbaKernels, available
    except ImportError:  # pragma: no cover - numba's module imports without numba
        return sets
    return sets + [NumbaKernels()] if available() else sets


def draw(seed: int) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Parameters, and gradients (flat, declared order) of widely spread magnitudes."""
    g = np.random.default_rng(seed)
    params = {n: np.asarray(g.standard_normal(s) * 0.1, F32) for n, s in SHAPES.items()}
    size = sum(p.size for p in params.values())
    grads = [(g.standard_normal(size) * 10.0 ** g.uniform(-4, 1, size)).astype(F32)
             for _ in range(4)]
    return params, grads


def bits_of(tensors: dict[str, np.ndarray]) -> dict[str, bytes]:
    return {n: np.ascontiguousarray(a).tobytes() for n, a in tensors.items()}


def split(flat: np.ndarray) -> dict[str, np.ndarray]:
    out, start = {}, 0
    for name, shape in SHAPES.items():
        size = int(np.prod(shape))
        out[name] = flat[start : start + size].reshape(shape)
        start += size
    return out


@pytest.mark.parametrize("kernels", kernel_sets(), ids=lambda k: k.name)
@pytest.mark.parametrize("clip, decay", [(1.0, 0.0), (0.0, 0.1), (50.0, 0.01)])
def test_flat_steps_equal_adam_update_bit_for_bit(kernels, clip, decay):
    params, grads = draw(7)
    cfg = optim.AdamConfig(weight_decay=decay, clip=clip)
    flat = FlatAdamW(SHAPES, kernels)
    ref_p, ref_s = params, optim.AdamState.zeros(params)
    got_p, got_s = params, optim.AdamState.zeros(params)
    before = bits_of(params)
    for step, g in enumerate(grads):
        lr = optim.lr_schedule(step, 3e-3, 2, 10)
        ref_p, ref_s = optim.adam_update(ref_p, split(g), ref_s, lr, cfg)
        got_p, got_s = flat.update(got_p, got_s, g, lr, cfg)
        assert list(got_p) == list(SHAPES) and got_s.step == ref_s.step == step + 1
        for mine, theirs in ((got_p, ref_p), (got_s.m, ref_s.m), (got_s.v, ref_s.v)):
            assert bits_of(mine) == bits_of(theirs)
    assert bits_of(params) == before  # pure: the first step's inputs are untouched


def test_a_view_written_in_place_or_replaced_counts_in_the_next_step():
    """The state's tensors are views of the flat buffers; an observer that writes one in
    place, or puts another array in its place, is what the next step reads."""
    params, grads = draw(3)
    cfg = optim.AdamConfig()
    for change in ("in place", "replaced"):
        flat = FlatAdamW(SHAPES, REFERENCE)
        p, s = flat.update(params, optim.AdamState.zeros(params), grads[0], 1e-3, cfg)
        ref_p, ref_s = optim.adam_update(params, split(grads[0]), optim.AdamState.zeros(params),
                                         1e-3, cfg)
        if change == "in place":
            p["b"][2] = ref_p["b"][2] = F32(5.0)
        else:
            p["wte"] = ref_p["wte"] = np.full(SHAPES["wte"], 0.25, F32)
        p, s = flat.update(p, s, grads[1], 1e-3, cfg)
        ref_p, ref_s = optim.adam_update(ref_p, split(grads[1]), ref_s, 1e-3, cfg)
        assert bits_of(p) == bits_of(ref_p) and bits_of(s.v) == bits_of(ref_s.v)


def test_refusals_name_the_tensor_and_change_nothing():
    params, grads = draw(5)
    flat = FlatAdamW(SHAPES, REFERENCE)
    state = optim.AdamState.zeros(params)
    cfg = optim.AdamConfig()
    bad = grads[0].copy()
    start = SHAPES["wte"][0] * SHAPES["wte"][1] + 6  # the third tensor: "scale"
    bad[start] = np.inf
    with pytest.raises(NonFiniteError, match="gradient 'scale' has 1 non-finite"):
        flat.update(params, state, bad, 1e-3, cfg)
    blown = optim.AdamState(m={**state.m, "a.first": np.full(SHAPES["a.first"], 3e38, F32)},
                            v=state.v, step=0)  # m / eps overflows
    with pytest.raises(NonFiniteError, match="parameter 'a.first' non-finite"):
        flat.update(params, blown, grads[0], 1e-3, cfg)
    with pytest.raises(NonFiniteError, match="parameter 'a.first' non-finite"):
        optim.adam_update(params, split(grads[0]), blown, 1e-3, cfg)
    with pytest.raises(ShapeError, match="unexpected \\['b'\\]"):  # adam_update's words
        flat.update({n: p for n, p in params.items() if n != "b"}, state, grads[0], 1e-3, cfg)
    with pytest.raises(ShapeError, match="adam v 'wte'"):
        flat.update(params, optim.AdamState(m=state.m, v={**state.v, "wte": state.v["wte"].T},
                                            step=0), grads[0], 1e-3, cfg)
    with pytest.raises(ShapeError, match="grads"):
        flat.update(params, state, grads[0][:-1], 1e-3, cfg)
    with pytest.raises(optim.OptimConfigError):
        flat.update(params, state, grads[0], float("nan"), cfg)
    p, s = flat.update(params, state, grads[0], 1e-3, cfg)  # nothing was spoiled
    ref = optim.adam_update(params, split(grads[0]), state, 1e-3, cfg)
    assert bits_of(p) == bits_of(ref[0])


def refusal(fn, *args) -> tuple[type, str]:
    try:
        fn(*args)
    except Exception as exc:  # the test compares whatever each raises
        return type(exc), str(exc)
    raise AssertionError("no refusal")


def test_several_faults_are_refused_as_adam_update_refuses_them():
    """Where more than one thing is wrong, the flat step names the same one, in the same
    words, as optim.adam_update (its checks, in its order)."""
    params, grads = draw(9)
    state = optim.AdamState.zeros(params)
    g = grads[0]
    cfg = optim.AdamConfig()
    bad = {
        "m and v mis-shaped": (params, optim.AdamState(
            m={**state.m, "wte": state.m["wte"].T.copy()},
            v={**state.v, "b": np.zeros(3, F32)}, step=0)),
        "step and a missing moment": (params, optim.AdamState(
            m={n: a for n, a in state.m.items() if n != "b"}, v=state.v, step=-1)),
        "everything missing one": ({n: a for n, a in params.items() if n != "b"},
                                   optim.AdamState(m={n: a for n, a in state.m.items()
                                                      if n != "b"},
                                                   v={n: a for n, a in state.v.items()
                                                      if n != "b"}, step=0)),
        "params mis-shaped": ({**params, "wte": params["wte"].T.copy(),
                               "b": np.zeros(3, F32)}, state),
    }
    for what, (p, s) in bad.items():
        flat = FlatAdamW(SHAPES, REFERENCE)
        assert refusal(flat.update, p, s, g, 1e-3, cfg) == \
            refusal(optim.adam_update, p, split(g), s, 1e-3, cfg), what


def test_a_view_reshaped_in_place_is_checked_again():
    params, grads = draw(4)
    flat = FlatAdamW(SHAPES, REFERENCE)
    p, s = flat.update(params, optim.AdamState.zeros(params), grads[0], 1e-3,
                       optim.AdamConfig())
    p["wte"].shape = (66,)  # the same object, another shape
    with pytest.raises(ShapeError, match="'wte'"):
        flat.update(p, s, grads[1], 1e-3, optim.AdamConfig())
