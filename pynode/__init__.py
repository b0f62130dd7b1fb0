"""pynode: a DaisyChain training peer. Same package natively (CPython) and in the page (Pyodide).

core/         pure numerics: units, detmath, rng, quantize, GEMM backends, layers, model, optimizer
comm/         transports behind one collective interface: loopback, gloo, webrtc
platform.py   the only place that asks "am I in a browser?"
config.py     RunConfig, what the leader broadcasts
tasks/        what a run trains (gpt, mlp, float, or module:Class)
trainer.py    the one training loop;  session.py  how a peer is put together
group.py      what every member of a group runs;  cli_*.py  the commands
float_gpt.py  the plain-float torch twin of the GPT (native only)
unitfiles.py  reads the shipped unit weights (data/units/);  corpus.py  the built-in corpus
datasource.py microbatch text: built-in corpus or a server's /data
room.py       a run among the peers of a room (start, membership, late joiners)
browser.py    the page's Python side (JS bridge mesh, start-up checks)
webgpu_gemm.py the page's WebGPU GEMM backend (waits on the GPU through Pyodide's run_sync)
browser_gemm.py, wasm/   the page's exact GEMM in WebAssembly SIMD (wasm_simd)
native_kernels.py  numba-fused hot kernels, gated against core/kernels.py's reference
browser_kernels.py the same hot kernels in WebAssembly SIMD for the page (wasm/kernels.wat)
gemm_tuning.py the fastest gated GEMM backend per model shape, measured
native_peer.py, signaling_client.py, cli_join.py   `python -m pynode join` (aiortc)
__main__.py   the CLI (train, verify, bench, cluster, join)
"""

__version__ = "0.1.0"
