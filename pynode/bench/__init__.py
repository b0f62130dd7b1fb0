"""Reproducible performance measurements, run as `python -m pynode bench NAME`.

gemm.py     exact int8 GEMM backends vs numpy float32 matmul, and the live audit's cost
train.py    int8 GPT vs the plain-float task, tokens per second
scaling.py  tokens per second with 1 vs 2 local peers
mesh_sim.py the run protocol with N in-memory peers: bytes, messages, collectives per step
browser.py  a training step in a Chromium tab vs natively on one thread; the page's GEMMs
generate.py generation bytes per second, KV cache vs the window recomputed each byte

Results and the commands that produced them: benchmarks/README.md.
"""

import argparse


def bench_parser(name: str, doc: str) -> argparse.ArgumentParser:
    """The parser of `python -m pynode bench NAME`: its module docstring's first line (its
    usage and what it measures) as the description, defaults shown."""
    head = doc.strip().splitlines()[0]
    what = head.split("`: ", 1)[1] if "`: " in head else head  # past the usage line's `...`
    return argparse.ArgumentParser(prog=f"python -m pynode bench {name}", description=what,
                                   formatter_class=_WithDefaults)


class _WithDefaults(argparse.HelpFormatter):
    """A flag's help ends with its default where it has one its help does not say."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (not action.option_strings or action.default in (None, False, argparse.SUPPRESS)
                or "default" in text):
            return text
        return f"{text} (default: %(default)s)"


CONFIG_HELP = ("RunConfig overrides, as inline JSON: '{\"width\": 128, \"layers\": 4}' "
               "(the fields: python -m pynode train --help)")
