"""Max ulp error of every detmath function against the exact oracle, and its speed.

Runs the decimal/fractions oracle of tests/core/test_detmath.py over many more points than
the test does (default 100,000 float32 and 20,000 float64 inputs per function, drawn over
each function's whole finite-output range plus log-uniform small magnitudes), then times
detmath and rng against numpy (and torch where numpy has no equivalent) on 1M float32.

    python benchmarks/detmath_error.py                 # both parts (minutes: the oracle is slow)
    python benchmarks/detmath_error.py --n 20000 --n64 5000
    python benchmarks/detmath_error.py --speed-only

Results go into docs/VERIFICATION.md by hand.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pynode.core import detmath, rng  # noqa: E402


def load_oracle():
    path = REPO / "tests" / "core" / "test_detmath.py"
    spec = importlib.util.spec_from_file_location("detmath_oracle", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure_errors(n32: int, n64: int) -> None:
    oracle = load_oracle()
    print(f"{'function':<10} {'dtype':<8} {'points':>8} {'max ulp':>9}  worst input   (bound)")
    for dtype, n, bounds in ((np.float32, n32, oracle.BOUND_F32), (np.float64, n64, None)):
        for i, name in enumerate(sorted(oracle.ORACLES)):
            xs = oracle.domain(name, dtype, n, seed=1000 + i)
            worst, where = oracle.max_ulp_error(name, xs)
            bound = (bounds or oracle.BOUND_F64).get(name, "-")
            print(f"{name:<10} {np.dtype(dtype).name:<8} {xs.size:>8} {worst:>9.6f}  "
                  f"{where!r:<14} ({bound})", flush=True)


def best_of(fn, *args, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


def speed(n: int) -> None:
    g = np.random.default_rng(0)
    x = g.standard_normal(n).astype(np.float32) * np.float32(4)
    pos = np.abs(x) + np.float32(1e-3)
    rows = x.reshape(-1, 1000)
    try:
        import torch
    except ImportError:
        torch = None
    pairs = [
        ("exp", lambda: detmath.exp(x), lambda: np.exp(x), "np.exp"),
        ("log", lambda: detmath.log(pos), lambda: np.log(pos), "np.log"),
        ("tanh", lambda: detmath.tanh(x), lambda: np.tanh(x), "np.tanh"),
        ("rsqrt", lambda: detmath.rsqrt(pos), lambda: 1 / np.sqrt(pos), "1/np.sqrt"),
        ("psum rows", lambda: detmath.psum(rows), lambda: rows.sum(-1), "np.sum"),
        ("softmax", lambda: detmath.softmax(rows),
         lambda: np.exp(rows - rows.max(-1, keepdims=True)), "np exp(x-max) only"),
        ("uniform", lambda: rng.uniform((1,), n), lambda: g.random(n, np.float32),
         "Generator.random"),
        ("normal", lambda: rng.normal((1,), n), lambda: g.standard_normal(n, np.float32),
         "Generator.standard_normal"),
        ("bits64", lambda: rng.bits64((1,), n), lambda: g.bit_generator.random_raw(n),
         "PCG64 random_raw"),
    ]
    if torch is not None:
        xt = torch.from_numpy(x)
        pairs += [
            ("erf", lambda: detmath.erf(x), lambda: torch.special.erf(xt), "torch.erf"),
            ("gelu", lambda: detmath.gelu(x), lambda: torch.nn.functional.gelu(xt),
             "torch gelu"),
        ]
    print(f"\n{n:,} float32 elements, best of 5 ({platform.machine()}, numpy {np.__version__})")
    print(f"{'op':<10} {'detmath/rng ms':>15} {'alternative ms':>15} {'ratio':>7}  alternative")
    for name, ours, theirs, label in pairs:
        a, b = best_of(ours), best_of(theirs)
        print(f"{name:<10} {a * 1e3:>15.2f} {b * 1e3:>15.2f} {a / b:>7.1f}  {label}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="float32 points per function")
    parser.add_argument("--n64", type=int, default=20_000, help="float64 points per function")
    parser.add_argument("--speed-n", type=int, default=1_000_000)
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--errors-only", action="store_true")
    args = parser.parse_args()
    if not args.speed_only:
        measure_errors(args.n, args.n64)
    if not args.errors_only:
        speed(args.speed_n)


if __name__ == "__main__":
    main()
