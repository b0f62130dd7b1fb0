"""A measured path for the per-call product check's A side: u = s^T A for a row-major
int8 A with AVX512-VNNI's `vpdpbusd` (64 int8 products an instruction), against the
int64 loops numba emits (docs/VERIFICATION.md, "Every product checked"):

    python benchmarks/check_vnni.py

Not wired into the check: a prototype, exact against numpy and timed here, so that the
form the check would need is measured before it is built. Needs numba's llvmlite (the
kernel is LLVM IR, JIT-compiled for this CPU) and avx512_vnni; says so and exits 0
without them.

The form: four rows of A interleaved a block (`vpunpck*`: each 32-bit lane then holds
one column's four bytes), A + 128 as unsigned bytes times the three signed base-256
digits of s's four entries (s < 2**20), summed into 16 int32 lanes a column block; no
sum across lanes anywhere (the loops numba emits spend much of their time on per-row
sums). u = sum_d 256**d (acc_d - 128 sum_i digit_d(s_i)), exact in int64; every lane
stays below 2**31 for M <= 2**14.

The whole check was later built around this kernel (both identities, tails, C's column
sums, linked into numba): exact, and slower in the step than the int64 loops it would
have replaced (docs/VERIFICATION.md item 4, "2026-12-06, evening"). This script keeps
the kernel's own measurement.
"""

from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pynode.bench.machine import machine_info, machine_line  # noqa: E402

# the default model's row-major left operands (rows, columns): activations into the
# projections and the MLP, and one head's attention probabilities
SHAPES = ((512, 64), (512, 192), (512, 256), (64, 64))
ROUNDS = 200


def _unpack(low: bool, width: int) -> str:
    """shufflevector indices of x86's unpack{lo,hi} (per 128-bit lane) on 512-bit vectors
    of `width`-bit elements."""
    n, per = 512 // width, 128 // width
    picks = []
    for lane in range(4):
        for p in range(per):
            src = lane * per + (0 if low else per // 2) + p // 2
            picks.append(src if p % 2 == 0 else src + n)
    return ", ".join(f"i32 {i}" for i in picks)


def _ir() -> str:
    phis = "\n  ".join(f"%acc{d}_{j} = phi <16 x i32> [zeroinitializer, %q_pre], "
                       f"[%nacc{d}_{j}, %q_body]" for d in range(3) for j in range(4))
    loads = "\n  ".join(f"""%ri{t} = add i64 %row0, {t}
  %off{t}a = mul i64 %ri{t}, %stride
  %off{t} = add i64 %off{t}a, %col
  %p{t} = getelementptr i8, i8* %a, i64 %off{t}
  %pv{t} = bitcast i8* %p{t} to <64 x i8>*
  %r{t} = load <64 x i8>, <64 x i8>* %pv{t}, align 1""" for t in range(4))
    flip = ", ".join(["i32 -2139062144"] * 16)  # 0x80808080: int8 + 128 as uint8
    lanes = "\n  ".join(f"""%y{j}a = bitcast <32 x i16> %x{j} to <16 x i32>
  %y{j} = xor <16 x i32> %y{j}a, <{flip}>""" for j in range(4))
    digits = "\n  ".join(f"""%dix{d}a = mul i64 %quads, {d}
  %dix{d} = add i64 %q, %dix{d}a
  %dp{d} = getelementptr i32, i32* %dig, i64 %dix{d}
  %dv{d} = load i32, i32* %dp{d}
  %di{d} = insertelement <16 x i32> undef, i32 %dv{d}, i32 0
  %ds{d} = shufflevector <16 x i32> %di{d}, <16 x i32> undef, <16 x i32> zeroinitializer"""
                         for d in range(3))
    dots = "\n  ".join(f"%nacc{d}_{j} = call <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32> "
                       f"%acc{d}_{j}, <16 x i32> %y{j}, <16 x i32> %ds{d})"
                       for d in range(3) for j in range(4))
    stores = "\n  ".join(f"""%o{d}_{j}i = add i64 %col, {16 * j}
  %o{d}_{j}b = mul i64 %k, {d}
  %o{d}_{j} = add i64 %o{d}_{j}i, %o{d}_{j}b
  %op{d}_{j} = getelementptr i32, i32* %out, i64 %o{d}_{j}
  %opv{d}_{j} = bitcast i32* %op{d}_{j} to <16 x i32>*
  store <16 x i32> %acc{d}_{j}, <16 x i32>* %opv{d}_{j}, align 4"""
                         for d in range(3) for j in range(4))
    lo8, hi8 = _unpack(True, 8), _unpack(False, 8)
    lo16, hi16 = _unpack(True, 16), _unpack(False, 16)
    return f"""
declare <16 x i32> @llvm.x86.avx512.vpdpbusd.512(<16 x i32>, <16 x i32>, <16 x i32>)

define void @left_u(i8* %a, i64 %stride, i64 %m, i64 %k, i32* %dig, i32* %out) {{
entry:
  %quads = lshr i64 %m, 2
  %blocks = lshr i64 %k, 6
  br label %kb_loop
kb_loop:
  %kb = phi i64 [0, %entry], [%kb_next, %kb_end]
  %kb_done = icmp uge i64 %kb, %blocks
  br i1 %kb_done, label %exit, label %q_pre
q_pre:
  %col = shl i64 %kb, 6
  br label %q_loop
q_loop:
  %q = phi i64 [0, %q_pre], [%q_next, %q_body]
  {phis}
  %q_done = icmp uge i64 %q, %quads
  br i1 %q_done, label %kb_end, label %q_body
q_body:
  %row0 = shl i64 %q, 2
  {loads}
  %t0 = shufflevector <64 x i8> %r0, <64 x i8> %r1, <64 x i32> <{lo8}>
  %t1 = shufflevector <64 x i8> %r0, <64 x i8> %r1, <64 x i32> <{hi8}>
  %t2 = shufflevector <64 x i8> %r2, <64 x i8> %r3, <64 x i32> <{lo8}>
  %t3 = shufflevector <64 x i8> %r2, <64 x i8> %r3, <64 x i32> <{hi8}>
  %w0 = bitcast <64 x i8> %t0 to <32 x i16>
  %w1 = bitcast <64 x i8> %t1 to <32 x i16>
  %w2 = bitcast <64 x i8> %t2 to <32 x i16>
  %w3 = bitcast <64 x i8> %t3 to <32 x i16>
  %x0 = shufflevector <32 x i16> %w0, <32 x i16> %w2, <32 x i32> <{lo16}>
  %x1 = shufflevector <32 x i16> %w0, <32 x i16> %w2, <32 x i32> <{hi16}>
  %x2 = shufflevector <32 x i16> %w1, <32 x i16> %w3, <32 x i32> <{lo16}>
  %x3 = shufflevector <32 x i16> %w1, <32 x i16> %w3, <32 x i32> <{hi16}>
  {lanes}
  {digits}
  {dots}
  %q_next = add i64 %q, 1
  br label %q_loop
kb_end:
  {stores}
  %kb_next = add i64 %kb, 1
  br label %kb_loop
exit:
  ret void
}}
"""


def compile_kernel():
    """The JIT-compiled kernel as a ctypes function (the engine kept alive with it)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = llvm.parse_assembly(_ir())
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=3))
    builder.getModulePassManager().run(module, builder)
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    kind = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                            ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
    return kind(engine.get_function_address("left_u")), engine


# accumulator j's lane 4c + t holds column 16c + 4j + t of its 64-column block
_ORDER = np.argsort([16 * c + 4 * j + t for j in range(4) for c in range(4) for t in range(4)])


def digit_words(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """s (M,) in [0, 2**20) -> its signed base-256 digits (3, M), and as (3, M / 4) words of
    four rows' digits each (one broadcast a row quad)."""
    digits, rest = np.empty((3, s.size), np.int64), s.astype(np.int64)
    for d in range(3):
        digits[d] = (rest + 128) % 256 - 128
        rest = (rest - digits[d]) // 256
    assert not rest.any()
    words = digits.astype(np.int8).view(np.uint8).reshape(3, -1, 4).copy().view(np.uint32)
    return digits, words.reshape(3, -1)


def left_u(kernel, a: np.ndarray, digits: np.ndarray, words: np.ndarray) -> np.ndarray:
    m, k = a.shape
    acc = np.empty((3, k), np.int32)
    kernel(a.ctypes.data, a.strides[0], m, k, words.ctypes.data, acc.ctypes.data)
    lanes = acc.reshape(3, k // 64, 64)[:, :, _ORDER].reshape(3, k).astype(np.int64)
    lanes -= 128 * digits.sum(axis=1)[:, None]
    return lanes[0] + 256 * lanes[1] + 65536 * lanes[2]


def best_us(fn, *args) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def main() -> int:
    info = machine_info()
    print(f"machine: {machine_line(info)}")
    if not info["flags"].get("avx512_vnni"):
        print("no avx512_vnni on this CPU: nothing to measure")
        return 0
    import numba

    @numba.njit(nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
    def numba_u(a, s, u):  # the vertical int64 form numba emits: lanes = columns
        u[:] = 0
        for i in range(a.shape[0]):
            si = s[i]
            for kk in range(a.shape[1]):
                u[kk] += si * np.int64(a[i, kk])

    from pynode.native_check import product_holds_2d

    kernel, _engine = compile_kernel()
    rng = np.random.default_rng(0)  # timing data only
    print("shape       exact  vnni kernel  numba int64 s^T A  whole check now (A(Br) == Cr)")
    for m, k in SHAPES:
        a = rng.integers(-128, 128, (m, k), dtype=np.int8)
        s = rng.integers(0, 1 << 20, m)
        digits, words = digit_words(s)
        exact = np.array_equal(left_u(kernel, a, digits, words), s @ a.astype(np.int64))
        acc = np.empty((3, k), np.int32)
        args = (a.ctypes.data, a.strides[0], m, k, words.ctypes.data, acc.ctypes.data)
        idle = (a.ctypes.data, a.strides[0], 0, 0, words.ctypes.data, acc.ctypes.data)
        call_us = best_us(kernel, *idle)
        vnni = best_us(kernel, *args) - call_us  # the kernel, not ctypes' call
        u = np.empty(k, np.int64)
        numba_u(a, s, u)
        plain = best_us(numba_u, a, s, u)
        b = rng.integers(-128, 128, (k, 64), dtype=np.int8)
        out = a.astype(np.int32) @ b.astype(np.int32)
        r = rng.integers(0, 1 << 20, (1, 64)).astype(np.float64)
        whole = best_us(product_holds_2d, a, b, out, r, True)
        print(f"{m:4d} x {k:<4d} {'yes' if exact else 'NO':>5}  {vnni:8.2f} us  {plain:12.2f} us"
              f"  {whole:14.2f} us (N = 64)")
        if not exact:
            return 1
    print(f"(ctypes' own call, taken off the vnni column: {call_us:.2f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
