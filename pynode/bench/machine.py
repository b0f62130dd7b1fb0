"""What a benchmark ran on: CPU model and the flags that decide kernel speed, threads, and
the overrides that make a CPU act as an older one. Printed with every benchmark, because
the same code runs 0.02x or 7x float32 depending on them (benchmarks/README.md)."""

from __future__ import annotations

import os
import platform

FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")
OVERRIDES = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "OPENBLAS_CORETYPE",
             "NUMBA_CPU_NAME", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _cpuinfo() -> tuple[str, set[str]]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read()
    except OSError:  # not Linux: the model from platform, flags unknown
        return platform.processor() or platform.machine(), set()
    model, flags = platform.machine(), set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == platform.machine():
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def machine_info() -> dict:
    """{cpu, cores, flags: {name: bool}, overrides: {env: value}} of this machine."""
    model, flags = _cpuinfo()
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "flags": {name: name in flags for name in FLAGS} if flags else {},
        "overrides": {k: os.environ[k] for k in OVERRIDES if k in os.environ},
    }


def machine_line(info: dict | None = None) -> str:
    """One line: 'AMD EPYC, 2 cores, avx2 avx512f avx512_vnni (no amx_int8 ...), env ...'."""
    info = info or machine_info()
    have = [f for f, on in info["flags"].items() if on]
    lacks = [f for f, on in info["flags"].items() if not on]
    env = " ".join(f"{k}={v}" for k, v in info["overrides"].items())
    return (f"{info['cpu']}, {info['cores']} cores; flags: {' '.join(have) or 'unknown'}"
            + (f" (not: {' '.join(lacks)})" if lacks else "") + (f"; env: {env}" if env else ""))
