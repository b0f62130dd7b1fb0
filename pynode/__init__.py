"""pynode: a DaisyChain training peer. Same package natively (CPython) and in the page (Pyodide).

core/         pure numerics: units, detmath, rng, quantize, GEMM backends, layers, model, optimizer
comm/         transports behind one collective interface: loopback, gloo, webrtc
platform.py   the only place that asks "am I in a browser?"
trainer.py    the one training loop
__main__.py   the CLI (train, verify, bench, cluster, join)
"""

__version__ = "0.1.0"
