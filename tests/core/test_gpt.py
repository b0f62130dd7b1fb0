"""The int8 GPT (and the small MLP classifier): contract, bit-reproducibility, agreement
with the float64 torch twin, refusals, and that it learns.

Gradient tolerance: every weight gradient of the GPT passes through a chain of int8 GEMMs
whose incoming gradients are stochastically rounded. At init the logit gradient of a row
is dominated by its -1 target entry, so most other entries round to 0 or 1 step: unbiased
but noisy. Measured against float64 autograd: cosine >= 0.9975 and relative L2 error
<= 7.2 % for every tensor (each layer alone is under 1 %, see test_layers.py). Bounds:
cosine > 0.99 and error < 15 %; a wrong formula gives tens of percent.
Legend: B batch, T positions, V vocab.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pynode.core.errors import DaisyError, NonFiniteError, ShapeError
from pynode.core.gpt import GPT, GPTConfig
from pynode.core.mlp import MLP, MLPConfig

TINY = GPTConfig(vocab=256, width=32, layers=2, heads=4, seq=16)
KEY = (1, 2, 3)
TEXT = np.frombuffer(b"the quick brown fox jumps over the lazy dog. " * 40, np.uint8)


def windows(seed: int, batch: int, length: int) -> np.ndarray:
    starts = np.random.default_rng(seed).integers(0, len(TEXT) - length, batch)
    return np.stack([TEXT[s : s + length] for s in starts]).astype(np.int32)  # (B, length)


def bits(x):
    return np.ascontiguousarray(x).view(np.uint32)


def same_bits(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(np.array_equal(bits(a[k]), bits(b[k])) for k in a)


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def units():
    from pynode.unitfiles import load_default_units

    return load_default_units()


@pytest.fixture(scope="module")
def gemm(units):
    from pynode.core.gemm import select_gemm

    return select_gemm(units)


@pytest.fixture(scope="module")
def ref_gemm(units):
    from pynode.core.gemm import select_gemm

    return select_gemm(units, prefer="reference")


@pytest.fixture(scope="module")
def model(gemm):
    return GPT(TINY, gemm)


# ---------------------------------------------------------------- parameters


def test_param_shapes_are_canonical(model):
    shapes = model.param_shapes()
    names = list(shapes)
    assert names[:2] == ["wte", "wpe"] and names[-1] == "lnf.g"
    assert names == list(GPT(TINY, None).param_shapes())
    assert shapes["wte"] == (256, 32) and shapes["wpe"] == (16, 32)
    assert shapes["h.1.attn.qkv"] == (32, 96) and shapes["h.1.mlp.proj"] == (128, 32)
    assert len(names) == 2 + 6 * TINY.layers + 1


def test_init_is_reproducible_and_seeded(model):
    a, b, c = model.init_params(5), model.init_params(5), model.init_params(6)
    assert same_bits(a, b)
    assert not np.array_equal(a["wte"], c["wte"])
    for name, shape in model.param_shapes().items():
        assert a[name].dtype == np.float32 and a[name].shape == shape
    assert np.all(a["h.0.ln1.g"] == 1)
    assert 0.018 < a["wte"].std() < 0.022
    assert a["h.0.mlp.proj"].std() < 0.6 * a["h.0.mlp.fc"].std()  # 1/sqrt(2L) scaling


def test_config_refuses_heads_that_do_not_divide_width():
    with pytest.raises(ShapeError):
        GPTConfig(width=30, heads=4)


# ---------------------------------------------------------------- reproducibility


def test_loss_and_grads_same_bits_twice(model):
    params, tokens = model.init_params(0), windows(0, 4, 17)
    loss, grads = model.loss_and_grads(params, tokens, KEY)
    loss2, grads2 = model.loss_and_grads(params, tokens, KEY)
    assert isinstance(loss, np.float32) and loss.view(np.uint32) == loss2.view(np.uint32)
    assert same_bits(grads, grads2)
    assert list(grads) == list(model.param_shapes())


def test_key_drives_the_stochastic_rounding_only(model):
    params, tokens = model.init_params(0), windows(0, 4, 17)
    loss, grads = model.loss_and_grads(params, tokens, KEY)
    loss2, grads2 = model.loss_and_grads(params, tokens, (1, 2, 4))
    assert loss.view(np.uint32) == loss2.view(np.uint32)  # the forward rounds to nearest
    assert not np.array_equal(grads["h.0.attn.qkv"], grads2["h.0.attn.qkv"])


def test_every_backend_gives_the_same_bits(gemm, ref_gemm):
    params, tokens = GPT(TINY, gemm).init_params(1), windows(1, 3, 17)
    loss, grads = GPT(TINY, gemm).loss_and_grads(params, tokens, KEY)
    loss2, grads2 = GPT(TINY, ref_gemm).loss_and_grads(params, tokens, KEY)
    assert loss.view(np.uint32) == loss2.view(np.uint32)
    assert same_bits(grads, grads2)


def test_later_bytes_never_change_earlier_logits(model):
    params, tokens = model.init_params(2), windows(2, 2, 16)
    changed = tokens.copy()
    changed[:, 9:] = 255 - changed[:, 9:]
    logits, logits2 = model.forward_logits(params, tokens), model.forward_logits(params, changed)
    assert logits.shape == (2, 16, 256) and logits.dtype == np.float32
    assert np.array_equal(bits(logits[:, :9]), bits(logits2[:, :9]))
    assert not np.array_equal(logits[:, 9:], logits2[:, 9:])


# ---------------------------------------------------------------- against the float twin


def test_grads_match_float64_autograd(model):
    from pynode.float_gpt import float_loss_and_grads

    params = model.init_params(3)
    for i, name in enumerate(n for n in params if n.endswith(".g")):  # gains away from 1
        params[name] += (np.random.default_rng(i).standard_normal(32) * 0.2).astype(np.float32)
    tokens = windows(3, 4, 17)
    loss, grads = model.loss_and_grads(params, tokens, KEY)
    want_loss, want = float_loss_and_grads(params, tokens, TINY, dtype=torch.float64)
    assert abs(loss - want_loss) < 1e-3 * want_loss  # measured 1e-5
    for name in want:
        assert cosine(grads[name], want[name]) > 0.99, name
        assert rel_err(grads[name], want[name]) < 0.15, name


def test_forward_logits_match_float_twin(model):
    from pynode.float_gpt import FloatGPT

    params, tokens = model.init_params(4), windows(4, 2, 16)
    got = model.forward_logits(params, tokens)
    want = FloatGPT(TINY).forward_logits(params, tokens)
    assert rel_err(got, want) < 0.03  # measured 0.8 %


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("where", ["wte", "wpe", "h.1.ln2.g", "lnf.g"])
def test_nan_in_params_is_refused_and_nothing_changes(model, where):
    params = model.init_params(0)
    params[where][-1, ...] = np.nan
    before = {k: v.copy() for k, v in params.items()}
    with pytest.raises(NonFiniteError):
        model.loss_and_grads(params, windows(0, 2, 17), KEY)
    with pytest.raises(NonFiniteError):
        model.forward_logits(params, windows(0, 2, 16))
    assert all(np.array_equal(bits(params[k]), bits(before[k])) for k in params)


@pytest.mark.parametrize(
    "tokens",
    [
        np.zeros((2, 18), np.int32),  # T = 17 > seq
        np.zeros((2, 1), np.int32),  # no target
        np.full((2, 5), 256, np.int32),  # out of vocab
        np.full((2, 5), -1, np.int32),
        np.zeros((2, 5), np.float32),
        np.zeros(5, np.int32),
    ],
)
def test_bad_tokens_are_refused(model, tokens):
    with pytest.raises(ShapeError):
        model.loss_and_grads(model.init_params(0), tokens, KEY)


@pytest.mark.parametrize("key", [(1, -2, 3), [1, 2, 3], (1, 2.0, 3), None])
def test_bad_keys_are_refused(model, key):
    with pytest.raises(DaisyError, match="key"):
        model.loss_and_grads(model.init_params(0), windows(0, 2, 9), key)


def test_bad_params_are_refused(model):
    params = model.init_params(0)
    with pytest.raises(ShapeError, match="missing"):
        model.loss_and_grads(
            {k: v for k, v in params.items() if k != "lnf.g"}, windows(0, 2, 9), KEY
        )
    params["wpe"] = params["wpe"][:8]
    with pytest.raises(ShapeError, match="wpe"):
        model.loss_and_grads(params, windows(0, 2, 9), KEY)
    params["wpe"] = np.zeros((16, 32), np.float64)
    with pytest.raises(ShapeError, match="float32"):
        model.loss_and_grads(params, windows(0, 2, 9), KEY)


# ---------------------------------------------------------------- learning


def adam_step(params, grads, state, step, lr=1e-2, b1=0.9, b2=0.99):
    for k in params:
        m, v = state.setdefault(k, (np.zeros_like(params[k]), np.zeros_like(params[k])))
        m, v = b1 * m + (1 - b1) * grads[k], b2 * v + (1 - b2) * grads[k] ** 2
        state[k] = (m, v)
        update = (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + 1e-8)
        params[k] = (params[k] - lr * update).astype(np.float32)


def test_int8_gpt_learns_repetitive_text(gemm):
    model = GPT(GPTConfig(width=32, layers=1, heads=2, seq=16), gemm)
    params, state, losses = model.init_params(0), {}, []
    for step in range(1, 101):
        loss, grads = model.loss_and_grads(params, windows(step, 8, 17), (0, step, 0))
        losses.append(float(loss))
        adam_step(params, grads, state, step)
    start, end = np.mean(losses[:5]), np.mean(losses[-5:])
    assert losses[0] == pytest.approx(np.log(256), abs=0.1)
    assert end < 2.0 and end < 0.45 * start, (start, end)


# ---------------------------------------------------------------- the MLP classifier


def blobs(seed: int, n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rs = np.random.default_rng(seed)
    centers = np.random.default_rng(99).standard_normal((4, 16)) * 2
    y = rs.integers(0, 4, n)
    return (centers[y] + rs.standard_normal((n, 16))).astype(np.float32), y.astype(np.int32)


def mlp_float64_grads(params, x, y):
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    h = torch.nn.functional.gelu(torch.from_numpy(x).double() @ t["fc1.w"] + t["fc1.b"])
    loss = torch.nn.functional.cross_entropy(
        h @ t["fc2.w"] + t["fc2.b"], torch.from_numpy(y).long()
    )
    loss.backward()
    return loss.item(), {k: v.grad.numpy() for k, v in t.items()}


def test_mlp_grads_match_float64_and_are_reproducible(gemm, ref_gemm):
    mlp = MLP(MLPConfig(), gemm)
    params, batch = mlp.init_params(0), blobs(0)
    loss, grads = mlp.loss_and_grads(params, batch, KEY)
    loss2, grads2 = MLP(MLPConfig(), ref_gemm).loss_and_grads(params, batch, KEY)
    assert loss.view(np.uint32) == loss2.view(np.uint32) and same_bits(grads, grads2)
    want_loss, want = mlp_float64_grads(params, *batch)
    assert abs(loss - want_loss) < 1e-3 * want_loss  # measured 5e-5
    for name in want:  # one GEMM deep: measured cosine 0.99999, error 0.5 %
        assert cosine(grads[name], want[name]) > 0.999, name
        assert rel_err(grads[name], want[name]) < 0.03, name
    assert mlp.forward_logits(params, batch[0]).shape == (64, 4)


def test_mlp_learns_and_refuses_bad_batches(gemm):
    mlp = MLP(MLPConfig(), gemm)
    params, state = mlp.init_params(1), {}
    for step in range(1, 41):
        _, grads = mlp.loss_and_grads(params, blobs(step), (1, step, 0))
        adam_step(params, grads, state, step, lr=3e-2)
    x, y = blobs(1000)
    assert np.mean(mlp.forward_logits(params, x).argmax(-1) == y) > 0.9
    x[0, 0] = np.nan
    with pytest.raises(NonFiniteError):
        mlp.loss_and_grads(params, (x, y), KEY)
    with pytest.raises(ShapeError):
        mlp.loss_and_grads(params, (x[:, :8], y), KEY)
    with pytest.raises(ShapeError):
        mlp.loss_and_grads(params, (blobs(0)[0], np.full(64, 4, np.int32)), KEY)
