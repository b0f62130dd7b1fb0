"""`python -m pynode kit run.pt -o kit.html`: the one-file inference kit (pynode/run/kit.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pynode.cli.flags import check_replaceable, check_writable
from pynode.run.assemble import checkpoint_bytes, checkpoint_named, write_atomically
from pynode.run.errors import OutputError
from pynode.run.kit import build_kit


def add_kit_parser(sub) -> None:
    kit = sub.add_parser("kit", help="write a one-file HTML inference kit of a .pt",
                         description="Write one self-contained .html file that continues "
                         "prompts with a checkpoint's model in any browser, offline, with the "
                         "same bytes as `generate`.")
    kit.add_argument("checkpoint", help="the .pt file a run saved (--save)")
    kit.add_argument("-o", "--output", required=True, help="the .html file to write")


def kit_command(args: argparse.Namespace) -> int:
    check_writable("-o", args.output)
    check_replaceable("-o", args.output)
    if Path(args.output).resolve() == Path(args.checkpoint).resolve():
        raise OutputError(f"-o {args.output} is the checkpoint the kit is made of: give the "
                          "page its own file name")
    data = checkpoint_bytes(args.checkpoint, "the checkpoint")
    with checkpoint_named(f"the checkpoint {args.checkpoint}"):
        html = build_kit(data)
    write_atomically(args.output, html.encode("utf-8"))
    print(f"wrote {args.output} ({len(html) / 1024:.0f} KiB)")
    return 0
