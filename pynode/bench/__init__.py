"""Reproducible performance measurements, run as `python -m pynode bench NAME`.

gemm.py   exact int8 GEMM backends vs numpy float32 matmul, and the live audit's cost

Results and the commands that produced them: benchmarks/README.md.
"""
