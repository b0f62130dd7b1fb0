"""Pure numerics of a peer (numpy + stdlib, no I/O; see README.md).

errors.py     named errors
units.py      verified INT8 unit networks, their full-domain check, certified LUTs
detmath.py    exp/log/tanh/erf/rsqrt from IEEE basic ops; pinned float reductions
fastmath.py   the step's hot GELU (+ gradient) and softmaxes: lean, tested bounds
rng.py        counter-based RNG (Philox4x32 own; numpy's Philox4x64 for hot draws)
quant.py      float32 <-> int8 with block scales (round-to-nearest, stochastic)
kernels.py    the hot kernels as one interface (numpy reference) and their exact gate
gemm/         exact int8 GEMM backends, their gates and the live audit
layers.py     int8 layers with explicit forward/backward (embedding, RMSNorm, attention, MLP)
gpt.py        the byte-level GPT;  mlp.py  a small classifier for fast tests
fixedpoint.py int64 fixed-point gradients;  optim.py  deterministic AdamW + LR schedule
flatadam.py   the trainer's AdamW on flat buffers, by the gated kernels (optim's bits)
statehash.py  canonical sha256 of a state;  checkpoint.py  .pt files without torch
plan.py       capacity-weighted microbatch assignment;  probe.py  the kernel probe
"""
