"""Reproducible performance measurements, run as `python -m pynode bench NAME`.

gemm.py     exact int8 GEMM backends vs numpy float32 matmul, and the live audit's cost
train.py    int8 GPT vs the plain-float task, tokens per second
scaling.py  tokens per second with 1 vs 2 local peers
mesh_sim.py the run protocol with N in-memory peers: bytes, messages, collectives per step
browser.py  a training step in a Chromium tab vs natively on one thread; the page's GEMMs
generate.py generation bytes per second, KV cache vs the window recomputed each byte

Results and the commands that produced them: benchmarks/README.md.
"""
