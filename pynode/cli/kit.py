"""`python -m pynode kit run.pt -o kit.html`: one self-contained HTML file that generates
offline with the checkpoint's model: weights inside, the int8 forward in JavaScript
(pynode/data/kit.js), the bytes of `python -m pynode generate`, no request of any kind."""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

import numpy as np

from pynode.core.gpt import gpt_param_shapes
from pynode.run.assemble import write_atomically
from pynode.run.generate import read_model
from pynode.tasks.gpt import gpt_config

DATA = Path(__file__).resolve().parent.parent / "data"


def add_kit_parser(sub) -> None:
    kit = sub.add_parser("kit", help="write a one-file HTML inference kit of a .pt")
    kit.add_argument("checkpoint", help="the .pt file a run saved (--save)")
    kit.add_argument("-o", "--output", required=True, help="the .html file to write")


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


def kit_command(args: argparse.Namespace) -> int:
    html = build_kit(Path(args.checkpoint).read_bytes())
    write_atomically(args.output, html.encode("utf-8"))
    print(f"wrote {args.output} ({len(html) / 1024:.0f} KiB)")
    return 0
