"""pynode: a DaisyChain training peer. Same package natively (CPython) and in the page (Pyodide).

core/         pure numerics: units, detmath, rng, quantize, GEMM backends, layers, model,
              optimizer (numpy + stdlib only)
comm/         transports behind one collective interface (loopback, gloo, webrtc), the
              signaling client, the one message codec; nothing of training
run/          the run layer: one step, the one loop, the one trainer factory, the run
              protocol, groups and the cluster bridge
cli/          the command line (train, cluster, join, verify, bench) and NativePeer
tasks/        what a run trains (gpt, mlp, float, or module:Class)
config.py     RunConfig, what the leader broadcasts
platform.py   the only place that asks "am I in a browser?"
gemm_backends.py  every GEMM backend by name (the core's, torch's, the page's wasm_simd)
gemm_tuning.py the fastest gated GEMM backend per model shape, measured
native_kernels.py  numba-fused hot kernels, gated against core/kernels.py's reference
native_optim.py    numba's fixed point to float32 and AdamW step (native_kernels uses them)
native_check.py    numba's Freivalds check of a GEMM product (native_kernels uses it)
native_codec.py    numba's int64 codec forms: byte planes, bit-packed blocks (comm/wire.py)
verify.py     `verify`: every start-up check as a table
float_gpt.py  the plain-float torch twin of the GPT (native only)
unitfiles.py  reads the shipped unit weights (data/units/);  corpus.py  the built-in corpus
datasource.py microbatch text: built-in corpus, a server's /data or a file
datafile.py   --data FILE: a local text or parquet file, named with its sha256
extras.py     optional dependencies: the extra that brings each, one line when missing
browser.py    the page's Python side (JS bridge mesh, start-up checks)
browser_resume.py how the page reads a .pt to resume it, and its preview of the file
webgpu_gemm.py the page's WebGPU GEMM backend (waits on the GPU through Pyodide's run_sync)
browser_gemm.py, wasm/   the page's exact GEMM in WebAssembly SIMD (wasm_simd)
browser_kernels.py the same hot kernels in WebAssembly SIMD for the page (wasm/kernels.wat)
__main__.py   `python -m pynode` (pynode.cli.main)
"""

__version__ = "0.1.0"
