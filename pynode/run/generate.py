"""Text from a trained GPT: its exact int8 forward with a KV cache, sampling keyed by the RNG.

Which bits: the logits of a position are those the training forward (`GPT.forward_logits`)
computes for the model's window padded to its full context S, the length training runs
at. A causal row's softmax sums S entries in one pinned tree (masked ones are exact
zeros), so the cache keeps each attention row S wide too: appending a position computes
its one row against the cached keys, and the result is the same bits as the whole window
recomputed (tests/core/test_generate.py checks it, every backend and Pyodide alike). Every
product is an int8 GEMM through the gated `gemm` and the hot kernels training uses, so a
step costs one row per layer and generating n bytes costs O(n).

Window: the model sees at most S bytes. A prompt longer than that is cut to its last S
bytes; when the window is full, it restarts from its last S // 2 bytes (one prefill), so
the cost stays linear in the bytes generated.

Sampling (same bytes on every runtime): temperature 0 is greedy (the first largest logit).
Otherwise keep the top_k largest logits (0: all; ties to the lower byte), in byte order,
divide them by the temperature in float32, take their softmax (the kernels' pinned one),
turn each probability into an integer weight floor(p * 2**31) and draw an integer below
the weights' total from rng.randint keyed by (seed, position, SAMPLE_PURPOSE), where
position is the index of the new byte in prompt + generated; the byte whose cumulative
weight first exceeds the draw is the sample.

pynode/data/kit.js (the inference kit, pynode/run/kit.py) does all of this in JavaScript,
to the same bits.

Legend: S context (cfg.seq), D width, H heads, Dh = D / H, V vocab, n new positions.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from pynode.config import RunConfig
from pynode.core import checkpoint, rng
from pynode.core import layers as nn
from pynode.core.errors import DaisyError
from pynode.core.gpt import GPT
from pynode.tasks.gpt import gpt_config

MAX_SAFE_INTEGER = 2**53 - 1  # JavaScript's Number.MAX_SAFE_INTEGER
SAMPLE_PURPOSE = 0x5A3D  # rng key of a sampled byte: (seed, position, SAMPLE_PURPOSE)
WEIGHT_BITS = 31  # a kept byte's integer weight is floor(p * 2**WEIGHT_BITS)
F32 = np.float32
# The logits are divided by the temperature as a float32: one below the smallest normal
# float32 (a subnormal, or 0 once cast) or past the largest is refused, by the kit alike.
TEMPERATURE_MIN = float(np.finfo(F32).tiny)  # 1.1754944e-38
TEMPERATURE_MAX = float(np.finfo(F32).max)  # 3.4028235e38


class GenerateError(DaisyError, ValueError):
    """A prompt, sampling setting or checkpoint that generation cannot use."""


@dataclass(frozen=True)
class Sampling:
    tokens: int = 200  # bytes to generate
    temperature: float = 0.8  # 0: greedy
    top_k: int = 0  # keep the k most likely bytes; 0 keeps all
    seed: int = 0  # first element of every sampling key

    def __post_init__(self) -> None:
        for name in ("tokens", "top_k", "seed"):  # at most JavaScript's safe integers: the
            value = getattr(self, name)            # kit and the page take the same ones
            if not isinstance(value, int) or isinstance(value, bool) or \
                    not 0 <= value <= MAX_SAFE_INTEGER:
                raise GenerateError(f"{name} must be an integer from 0 to {MAX_SAFE_INTEGER}, "
                                    f"got {value!r}")
        t = self.temperature
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise GenerateError(f"temperature must be a finite number >= 0, got {t!r}")
        if t != 0 and not TEMPERATURE_MIN <= t <= TEMPERATURE_MAX:  # a float32 of its own
            raise GenerateError("temperature must be 0 (greedy) or a float32 from 1.2e-38 "
                                f"to 3.4e38, got {t!r}")


class Decoder:
    """The model's forward one window at a time, keys and values cached per layer."""

    def __init__(self, model: GPT, params: dict[str, np.ndarray]) -> None:
        nn.check_params(params, model.param_shapes())
        self.model, self.params = model, params
        cfg = model.cfg
        self.heads, self.head_dim = cfg.heads, cfg.width // cfg.heads
        shape = (cfg.layers, cfg.heads, cfg.seq, self.head_dim)
        self.keys = np.zeros(shape, F32)  # (L, H, S, Dh) f32
        self.values = np.zeros(shape, F32)  # (L, H, S, Dh) f32
        self.length = 0  # positions cached

    @property
    def context(self) -> int:
        return self.model.cfg.seq

    def restart(self, tokens: np.ndarray | list[int]) -> np.ndarray:
        """Forget the window, start a new one with `tokens`; their logits (n, V) f32."""
        self.length = 0
        return self.feed(tokens)

    def feed(self, tokens: np.ndarray | list[int]) -> np.ndarray:
        """Append `tokens` (n,) to the window; the logits of each new position (n, V) f32."""
        cfg, p, ops = self.model.cfg, self.params, self.model.ops
        tokens = np.asarray(tokens, np.int64).reshape(-1)  # (n,)
        start, n = self.length, tokens.size
        if n == 0 or start + n > cfg.seq or tokens.min() < 0 or tokens.max() >= cfg.vocab:
            raise GenerateError(f"cannot append {n} tokens to a window of {start} of "
                                f"{cfg.seq} (values in [0, {cfg.vocab}))")
        x = p["wte"][tokens] + p["wpe"][start : start + n]  # (n, D) f32
        for i in range(cfg.layers):
            x = self._block(i, x, start)
        self.length = start + n
        h, _ = nn.rmsnorm_forward(x, p["lnf.g"], ops)  # (n, D) f32
        logits, _ = nn.linear_forward(self.model.gemm, h, p["wte"].T)  # (n, V) f32
        return logits

    def _block(self, i: int, x: np.ndarray, start: int) -> np.ndarray:
        gemm, ops, pre = self.model.gemm, self.model.ops, f"h.{i}."
        h, _ = nn.rmsnorm_forward(x, self.params[pre + "ln1.g"], ops)  # (n, D) f32
        qkv, _ = nn.linear_forward(gemm, h, self.params[pre + "attn.qkv"])  # (n, 3D) f32
        a = self._attend(i, qkv, start)  # (n, D) f32
        y, _ = nn.linear_forward(gemm, a, self.params[pre + "attn.proj"])
        x = x + y  # (n, D) f32
        h, _ = nn.rmsnorm_forward(x, self.params[pre + "ln2.g"], ops)
        u, _ = nn.linear_forward(gemm, h, self.params[pre + "mlp.fc"])  # (n, 4D) f32
        g, _ = nn.gelu_forward(u, ops)
        y, _ = nn.linear_forward(gemm, g, self.params[pre + "mlp.proj"])  # (n, D) f32
        return x + y

    def _attend(self, i: int, qkv: np.ndarray, start: int) -> np.ndarray:
        """Causal attention of n new positions over the cached ones: (n, 3D) -> (n, D)."""
        gemm, ops = self.model.gemm, self.model.ops
        n, s, end = qkv.shape[0], self.context, start + qkv.shape[0]
        q, k, v = (np.ascontiguousarray(part.reshape(n, self.heads, self.head_dim)
                                        .transpose(1, 0, 2))
                   for part in np.split(qkv, 3, axis=-1))  # (H, n, Dh) f32 each
        self.keys[i, :, start:end] = k
        self.values[i, :, start:end] = v
        keys = self.keys[i, :, :end]  # (H, end, Dh) f32
        scale = F32(1.0 / math.sqrt(self.head_dim))
        scores = np.zeros((self.heads, n, s), F32)  # (H, n, S) f32: rows as wide as training's
        scores[:, :, :end] = nn.int8_bmm(gemm, q, keys.transpose(0, 2, 1)) * scale
        mask = np.arange(s)[None, :] <= np.arange(start, end)[:, None]  # (n, S) key <= query
        probs = ops.softmax_rows(scores, mask)  # (H, n, S) f32, zero past the query
        # Past `end` every weight is an exact 0: it adds nothing to the product's sums.
        out = nn.attend_values(gemm, np.ascontiguousarray(probs[:, :, :end]),
                               self.values[i, :, :end])  # (H, n, Dh) f32
        return np.ascontiguousarray(out.transpose(1, 0, 2)).reshape(n, -1)


def sample_token(logits: np.ndarray, sampling: Sampling, position: int, ops: Any) -> int:
    """The next byte from logits (V,) f32 (see the module docstring for the rule)."""
    if sampling.temperature == 0:
        return int(np.argmax(logits))
    vocab = logits.shape[-1]
    k = vocab if sampling.top_k == 0 else min(sampling.top_k, vocab)
    kept = np.sort(np.argsort(-logits, kind="stable")[:k])  # (k,) byte order
    with np.errstate(over="ignore"):
        scaled = logits[kept] / F32(sampling.temperature)  # (k,) f32
    if not np.isfinite(scaled).all():
        raise GenerateError(f"temperature {sampling.temperature!r} is too small for this "
                            "model: the logits divided by it overflow float32 (use 0 for "
                            "greedy, or a larger one)")
    probs = ops.softmax_rows(np.ascontiguousarray(scaled[None, :]))[0]  # (k,) f32
    weights = np.floor(np.ldexp(probs.astype(np.float64), WEIGHT_BITS)).astype(np.int64)
    cumulative = np.cumsum(weights)  # (k,) int64, exact
    draw = int(rng.randint((sampling.seed, position, SAMPLE_PURPOSE), 1, int(cumulative[-1]))[0])
    return int(kept[np.searchsorted(cumulative, draw, side="right")])


def text_pieces(tokens: Iterable[int]) -> Iterator[str]:
    """The text of a byte stream as it comes, whole characters only: UTF-8 decoded
    incrementally, an invalid byte as U+FFFD; a piece may be empty (a character's first
    bytes). The last piece flushes what an unfinished character left."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    for token in tokens:
        yield decoder.decode(bytes((token,)))
    yield decoder.decode(b"", final=True)


class Generator:
    """A checkpoint's model ready to continue prompts (`step`: the state's step)."""

    def __init__(self, cfg: RunConfig, params: dict[str, np.ndarray], gemm: Any,
                 step: int = 0) -> None:
        self.cfg, self.step = cfg, step
        self.decoder = Decoder(GPT(gpt_config(cfg), gemm), params)

    @property
    def context(self) -> int:
        return self.decoder.context

    def generate(self, prompt: bytes, sampling: Sampling) -> Iterator[int]:
        """The generated bytes one by one (the prompt cut to its last S bytes, see
        `prompt_window`)."""
        if not isinstance(prompt, (bytes, bytearray)) or not prompt:
            raise GenerateError("the prompt is empty: give at least one byte to continue")
        history = bytearray(prompt)
        s, keep = self.context, max(1, self.context // 2)
        logits = self.decoder.restart(list(prompt_window(history, s)))[-1]
        ops = self.decoder.model.ops
        for produced in range(sampling.tokens):
            token = sample_token(logits, sampling, len(history), ops)
            history.append(token)
            yield token
            if produced + 1 == sampling.tokens:
                return
            if self.decoder.length == s:
                logits = self.decoder.restart(list(history[-keep:]))[-1]
            else:
                logits = self.decoder.feed([token])[-1]


def prompt_window(prompt: bytes, context: int) -> bytes:
    """What the model sees of a prompt: its last `context` bytes."""
    return bytes(prompt[-context:])


def read_model(data: bytes) -> tuple[RunConfig, checkpoint.CheckpointState]:
    """The run config and state of the gpt checkpoint `data`; CheckpointError (nothing
    loaded) for a bad file, GenerateError for a checkpoint of another task."""
    from pynode.run.assemble import checkpoint_expectations

    stored = checkpoint.load_checkpoint(data)
    if stored.task != "gpt":
        raise GenerateError(f"text generation needs a checkpoint of the gpt task; this one trains "
                            f"{stored.task!r}")
    config = {k: v for k, v in stored.config.items() if k not in ("vocab", "schedule")}
    try:
        cfg = RunConfig.from_dict(config)
    except ValueError as exc:
        raise checkpoint.CheckpointError(f"checkpoint config is not valid: {exc}") from exc
    return cfg, checkpoint.load_checkpoint(data, expect=checkpoint_expectations(cfg))


def load_generator(data: bytes, *, arithmetic: tuple[Any, Any] | None = None,
                   backend: str | None = None, kernels: str | None = None,
                   check_products: bool = True) -> Generator:
    """A Generator for the checkpoint `data`. `arithmetic` is (units, gemm) a peer
    verified already; without it they are loaded and checked as for training
    (pynode.run.assemble.load_units_and_gemm with `backend`, `kernels`, `check_products`)."""
    cfg, ckpt = read_model(data)
    if arithmetic is None:
        from pynode.run.assemble import load_units_and_gemm

        arithmetic = load_units_and_gemm(backend, kernels, check_products)
    return Generator(cfg, dict(ckpt.params), arithmetic[1], ckpt.step)
