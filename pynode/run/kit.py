"""The inference kit: one self-contained HTML file that generates offline with a
checkpoint's model: weights inside (base64 float32), the int8 forward and sampler in
JavaScript (pynode/data/kit.js, page pynode/data/kit.html), the bytes of `python -m pynode
generate`, no request of any kind (`python -m pynode kit`, the page's download button)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from pynode.core.gpt import gpt_param_shapes
from pynode.run.generate import read_model
from pynode.tasks.gpt import gpt_config

DATA = Path(__file__).resolve().parent.parent / "data"


def build_kit(data: bytes) -> str:
    """The kit's HTML for the gpt checkpoint `data` (refused whole as `generate` refuses)."""
    cfg, ckpt = read_model(data)
    shapes = gpt_param_shapes(gpt_config(cfg))
    weights = b"".join(np.ascontiguousarray(ckpt.params[name], "<f4").tobytes()
                       for name in shapes)
    config = {"config": {"width": cfg.width, "layers": cfg.layers, "heads": cfg.heads,
                         "seq": cfg.seq, "vocab": 256},
              "order": [[name, list(shape)] for name, shape in shapes.items()],
              "step": ckpt.step}
    page = (DATA / "kit.html").read_text(encoding="utf-8")
    return (page.replace("{{KIT_JS}}", (DATA / "kit.js").read_text(encoding="utf-8"))
            .replace("{{CONFIG}}", json.dumps(config).replace("<", "\\u003c"))
            .replace("{{WEIGHTS}}", base64.b64encode(weights).decode("ascii")))
