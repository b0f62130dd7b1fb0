"""The cases of golden_v2.npz, one builder per family (used by make_golden.py).

Each builder imports the module it covers, so a family whose module is missing raises
ImportError and make_golden.py can leave it out while that module is being written.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
TINY = np.finfo(F32).smallest_subnormal
BIG = np.finfo(F32).max
NORMAL_MIN = np.finfo(F32).tiny


def draws(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def finite_f32(seed: int, n: int) -> np.ndarray:
    """n finite float32 values with uniformly random bit patterns (every exponent, subnormals)."""
    raw = draws(seed).integers(0, 2**32, size=4 * n, dtype=np.uint64).astype(np.uint32)
    x = raw.view(F32)  # (4n,) f32
    return x[np.isfinite(x)][:n].copy()


def scaled_normal(seed: int, n: int) -> np.ndarray:
    """n values of N(0, 1) times scales from 1e-6 to 1e3: the range activations live in."""
    g = draws(seed)
    return (g.standard_normal(n) * 10.0 ** g.uniform(-6, 3, n)).astype(F32)


def edges(*extra: float) -> np.ndarray:
    """Finite float32 edge values of both signs: zeros, subnormals, normals' ends, ties."""
    base = [0.0, TINY, 2 * TINY, NORMAL_MIN - TINY, NORMAL_MIN, 1e-30, 1e-7, 2.0**-24,
            0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 10.0, 1e4, 2.0**24, 1e30, BIG, *extra]
    x = np.array(base, dtype=F32)  # (E,) f32
    return np.concatenate([x, -x])


def specials() -> np.ndarray:
    return np.array([np.inf, -np.inf, np.nan], dtype=F32)


def build_numpy(w) -> None:
    """IEEE basics pynode builds on: correctly rounded, so every platform must agree."""
    x, y = finite_f32(1, 2048), finite_f32(2, 2048)
    y = np.where(y == 0, F32(1), y)  # no 0/0: NaN bit patterns are not part of IEEE's promise
    for op in ("add", "subtract", "multiply", "divide", "maximum", "minimum"):
        w.add("numpy", f"{op}.f32", f"numpy:{op}", x, y)
    mags = np.abs(np.concatenate([finite_f32(3, 2048), edges()]))
    w.add("numpy", "sqrt.f32", "numpy:sqrt", mags)
    ties = np.arange(-8, 8, dtype=F32) + F32(0.5)
    rounding = np.concatenate([ties, scaled_normal(4, 1024), edges()])
    w.add("numpy", "rint.f32", "numpy:rint", rounding)
    w.add("numpy", "floor.f32", "numpy:floor", rounding)
    exps = draws(5).integers(-300, 300, size=x.size, dtype=np.int32)
    w.add("numpy", "ldexp.f32", "numpy:ldexp", x, exps)
    wide = draws(6).standard_normal(2048) * 10.0 ** draws(7).uniform(-45, 39, 2048)
    w.add("numpy", "f64_to_f32", "numpy:float32", wide)
    ints = draws(8).integers(-(2**31), 2**31, size=2048, dtype=np.int64).astype(np.int32)
    w.add("numpy", "i32_to_f32", "numpy:float32", ints)
    a = draws(9).integers(-128, 128, size=(33, 517), dtype=np.int64).astype(np.int32)
    b = draws(10).integers(-128, 128, size=(517, 19), dtype=np.int64).astype(np.int32)
    w.add("numpy", "matmul.i32", "numpy:matmul", a, b)


def build_units(w) -> None:
    """LUT cells against the integer ops they certify (expected from integer arithmetic)."""
    import pynode.unitfiles  # noqa: F401  (the test reads the units through it)

    g = draws(20)
    ends = np.array([-128, -127, -1, 0, 1, 126, 127], dtype=np.int64)
    ea, eb = np.meshgrid(ends, ends, indexing="ij")
    a = np.concatenate([ea.ravel(), g.integers(-128, 128, 4096)])  # (P,) int64
    b = np.concatenate([eb.ravel(), g.integers(-128, 128, 4096)])  # (P,) int64
    w.add("units", "mul_lut", "units:mul_lut", a + 128, b + 128, expect=[(a * b).astype(np.int32)])

    steps = np.arange(-129, 129, dtype=np.int64) * 256 - 128  # rounding boundaries
    near = (steps[:, None] + np.array([-1, 0, 1])).ravel()
    x = np.concatenate([near, [-32768, 32767], g.integers(-32768, 32768, 4096)])
    x = x[(x >= -32768) & (x <= 32767)]  # (R,) int64
    requant = np.clip((x + 128) >> 8, -128, 127).astype(np.int8)
    w.add("units", "requant_lut", "units:requant_lut", x + 32768, expect=[requant])

    v = np.arange(-128, 128, dtype=np.int64)
    relu = np.maximum(v, 0).astype(np.int8)
    w.add("units", "relu_lut", "units:relu_lut", v + 128, expect=[relu])


def build_detmath(w) -> None:
    """Current outputs of pynode's transcendentals and pinned reductions."""
    import pynode.core.detmath  # noqa: F401

    dm = "pynode.core.detmath"
    near = [88.0, 88.72, 88.73, 89.0, 103.0, 103.97, 104.0, 150.0, 1e-4, 0.1, 0.6, 4.0, 9.0]
    inputs = {
        "exp": np.concatenate([edges(*near), scaled_normal(30, 2048)]),
        "expm1": np.concatenate([edges(*near), scaled_normal(41, 2048)]),
        "log": np.abs(np.concatenate([edges(0.9999999, 1.0000001), finite_f32(31, 2048)])),
        "tanh": np.concatenate([edges(0.55, 9.0, 9.1), scaled_normal(32, 2048)]),
        "erf": np.concatenate([edges(0.84, 3.9, 4.0), scaled_normal(33, 2048)]),
        "erfc": np.concatenate([edges(0.84, 3.9, 4.0, 27.0), scaled_normal(42, 2048)]),
        "gelu": np.concatenate([edges(0.84, 3.9, 5.0), scaled_normal(34, 2048)]),
        "gelu_grad": np.concatenate([edges(0.84, 3.9, 5.0), scaled_normal(35, 2048)]),
        "rsqrt": np.abs(np.concatenate([edges(4.0, 0.0625), finite_f32(36, 2048)])),
        "sqrt": np.abs(np.concatenate([edges(4.0, 0.0625), finite_f32(37, 2048)])),
        "sinpi": np.concatenate([edges(0.75, 1.25, 1e6 + 0.5), scaled_normal(43, 2048)]),
        "cospi": np.concatenate([edges(0.75, 1.25, 1e6 + 0.5), scaled_normal(44, 2048)]),
        "sincospi": np.concatenate([edges(0.75, 1.25), scaled_normal(45, 2048)]),
    }
    for name, x in inputs.items():
        x64 = scaled_normal(46, 512).astype(np.float64) / 3.0  # (512,) f64, not f32-exact
        if name in ("log", "rsqrt", "sqrt"):
            x64 = np.abs(x64)
        w.add("detmath", f"{name}.values", f"{dm}:{name}", x)
        w.add("detmath", f"{name}.f64", f"{dm}:{name}", x64)
        w.add("detmath", f"{name}.specials", f"{dm}:{name}", specials())
        w.add("detmath", f"{name}.negzero", f"{dm}:{name}", np.array([-0.0, -1.0], F32))

    rows = scaled_normal(38, 9 * 37).reshape(9, 37)  # (9, 37) f32
    rows[1] = 0.0
    rows[2] = F32(1e4) * np.sign(rows[2])
    rows[3, :] = -1e30
    rows[3, 5] = 1e30
    for fn in ("softmax", "logsumexp"):
        w.add("detmath", f"{fn}.rows", f"{dm}:{fn}", rows)
        w.add("detmath", f"{fn}.axis0", f"{dm}:{fn}", rows, axis=0)
        w.add("detmath", f"{fn}.inf", f"{dm}:{fn}", np.array([[0.0, -np.inf, 1.0]], F32))
        # float64 rows where x - max rounds (the error is put back: detmath._exp_shifted)
        w.add("detmath", f"{fn}.f64", f"{dm}:{fn}", rows.astype(np.float64)[:, :29] * 1.1)

    vec = scaled_normal(39, 1000)  # (1000,) f32
    mat = scaled_normal(40, 7 * 129).reshape(7, 129)  # (7, 129) f32
    cancel = np.array([1e8, 1.0, -1e8, -0.0, 2.0**-24, 3.0], F32)
    for fn in ("psum", "pmax"):
        w.add("detmath", f"{fn}.vec", f"{dm}:{fn}", vec)
        w.add("detmath", f"{fn}.mat", f"{dm}:{fn}", mat)
        w.add("detmath", f"{fn}.mat_axis0", f"{dm}:{fn}", mat, axis=0)
        w.add("detmath", f"{fn}.f64", f"{dm}:{fn}", mat.astype(np.float64) / 3.0)
        w.add("detmath", f"{fn}.cancel", f"{dm}:{fn}", cancel)
        w.add("detmath", f"{fn}.negzeros", f"{dm}:{fn}", np.full((3, 5), -0.0, F32))
        w.add("detmath", f"{fn}.single", f"{dm}:{fn}", np.array([[2.5]], F32))
        w.add("detmath", f"{fn}.all", f"{dm}:{fn}", mat, axis=None)
        w.add("detmath", f"{fn}.keepdims", f"{dm}:{fn}", mat, axis=0, keepdims=True)


def build_rng(w) -> None:
    """Current outputs of the counter-based RNG for fixed keys."""
    import pynode.core.rng  # noqa: F401

    r = "pynode.core.rng"
    w.add("rng", "bits64.small", f"{r}:bits64", (1, 2, 3), 1000)
    w.add("rng", "bits64.offset", f"{r}:bits64", (1, 2, 3), 257, offset=12345)
    w.add("rng", "bits64.wide_key", f"{r}:bits64", (2**63 - 1, 0, 2**32 + 7), 64)
    w.add("rng", "bits64.empty_key", f"{r}:bits64", (), 16)
    w.add("rng", "uniform", f"{r}:uniform", (7, 0, 0, 1, 2), (17, 33))
    w.add("rng", "normal", f"{r}:normal", (7, 0, 0, 1, 3), (4096,))
    w.add("rng", "randint.7", f"{r}:randint", (9, 1), (1000,), 7)
    w.add("rng", "randint.1", f"{r}:randint", (9, 2), (10,), 1)
    w.add("rng", "randint.2p40", f"{r}:randint", (9, 3), (4, 250), 2**40 + 3)
    w.add("rng", "randint.2p63", f"{r}:randint", (9, 4), (64,), 2**63)
    w.add("rng", "permutation", f"{r}:permutation", (11, 5), 1000)
    w.add("rng", "bad_key", f"{r}:bits64", (-1,), 4)
    w.add("rng", "raw64", f"{r}:raw64", (7, 0, 0, 1, 2), 1001)
    w.add("rng", "raw64.wide_key", f"{r}:raw64", (2**63 - 1, 0, 2**32 + 7), 33)
    w.add("rng", "uniform16", f"{r}:uniform16", (7, 0, 0, 1, 2), (17, 33))
    w.add("rng", "philox4x64.kat0", f"{r}:philox4x64", np.zeros((4, 1), np.uint64), (0, 0))


def build_fastmath(w) -> None:
    """Current outputs of the hot-path GELU and softmaxes (their bounds: test_fastmath.py)."""
    import pynode.core.fastmath  # noqa: F401

    fm = "pynode.core.fastmath"
    x = np.concatenate([edges(0.75, 3.9, 5.0, 13.2, 14.0, 40.0), scaled_normal(70, 2048)])
    w.add("fastmath", "gelu.values", f"{fm}:gelu_with_grad", x)
    w.add("fastmath", "gelu.specials", f"{fm}:gelu_with_grad", specials())
    rows = scaled_normal(71, 9 * 37).reshape(9, 37)  # (9, 37) f32
    rows[1] = 0.0
    rows[2] = F32(1e4) * np.sign(rows[2])
    w.add("fastmath", "softmax.rows", f"{fm}:softmax_rows", rows)
    scores = scaled_normal(72, 3 * 17 * 17).reshape(3, 17, 17)  # (3, 17, 17) f32
    w.add("fastmath", "softmax.causal", f"{fm}:softmax_rows", scores, np.tri(17, dtype=bool))
    w.add("fastmath", "softmax.inf", f"{fm}:softmax_rows", np.array([[0.0, -np.inf, 1.0]], F32))
    w.add("fastmath", "log_softmax.rows", f"{fm}:log_softmax_parts", rows)


def build_quant(w) -> None:
    """Current outputs of the quantizers and the epilogue, and their refusals."""
    import pynode.core.quant  # noqa: F401

    q = "pynode.core.quant"
    x = scaled_normal(50, 16 * 64).reshape(16, 64)  # (16, 64) f32
    x[1] = 0.0
    x[2] = F32(TINY) * np.sign(x[2])
    x[3, 7] = BIG
    x[4] = np.arange(64, dtype=F32) - F32(31.5)  # exact ties after scaling
    batched = scaled_normal(51, 2 * 8 * 32).reshape(2, 8, 32)  # (2, 8, 32) f32
    for fn in ("quantize_rows", "quantize_cols"):
        w.add("quant", f"{fn}.mat", f"{q}:{fn}", x)
        w.add("quant", f"{fn}.batched", f"{q}:{fn}", batched)
        w.add("quant", f"{fn}.stochastic", f"{q}:{fn}_stochastic", x, (5, 1, 2, 3, 0))
        w.add("quant", f"{fn}.stochastic_b", f"{q}:{fn}_stochastic", batched, (5, 1, 2, 4, 1))
    bad = x.copy()
    bad[5, 5] = np.nan
    w.add("quant", "quantize_rows.nan", f"{q}:quantize_rows", bad)
    bad[5, 5] = -np.inf
    w.add("quant", "quantize_cols.inf", f"{q}:quantize_cols", bad)
    g = draws(52)
    acc = g.integers(-(2**31), 2**31, size=(9, 11), dtype=np.int64).astype(np.int32)
    sa = np.abs(scaled_normal(53, 9))
    sb = np.abs(scaled_normal(54, 11))
    w.add("quant", "epilogue", f"{q}:epilogue", acc, sa, sb)


def _product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(np.int32)


def build_gemm(w) -> None:
    """Exact int8 products (expected from int64 arithmetic), checked on every backend."""
    from pynode.core.gemm.base import MAX_K

    g = draws(60)

    def int8(*shape: int) -> np.ndarray:
        return g.integers(-128, 128, size=shape, dtype=np.int64).astype(np.int8)

    # K around the float backend's 1024-wide chunks, and one well past them
    shapes = [(1, 1, 1), (3, 5, 7), (17, 257, 13), (24, 1024, 20), (9, 1025, 5), (5, 4096, 3)]
    for m, k, n in shapes:
        a, b = int8(m, k), int8(k, n)
        w.add("gemm", f"matmul.{m}x{k}x{n}", "gemm:matmul", a, b, expect=[_product(a, b)])
    k = MAX_K
    low = np.full((2, k), -128, np.int8)
    w.add("gemm", "matmul.extreme_kmax", "gemm:matmul", low, np.full((k, 3), -128, np.int8),
          expect=[_product(low, np.full((k, 3), -128, np.int8))])
    w.add("gemm", "matmul.k_over_bound", "gemm:matmul", np.zeros((1, k + 1), np.int8),
          np.zeros((k + 1, 1), np.int8), expect="AccumulatorBoundError")
    w.add("gemm", "matmul.wrong_dtype", "gemm:matmul", np.zeros((2, 2), np.int16),
          np.zeros((2, 2), np.int8), expect="ShapeError")
    a, b = int8(3, 5, 96), int8(3, 96, 7)
    w.add("gemm", "bmm.3x5x96x7", "gemm:bmm", a, b, expect=[_product(a, b)])


FAMILY_BUILDERS = {
    "numpy": build_numpy,
    "units": build_units,
    "detmath": build_detmath,
    "rng": build_rng,
    "fastmath": build_fastmath,
    "quant": build_quant,
    "gemm": build_gemm,
}
