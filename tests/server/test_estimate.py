"""The page's live estimates (server/static/estimate.js) against pynode's own numbers: the
parameter count of the model a config builds and the memory a follower checks it has."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from pynode.config import RunConfig
from pynode.core.gpt import gpt_param_shapes
from pynode.run.assemble import memory_needed
from pynode.tasks.gpt import gpt_config

ESTIMATE = Path(__file__).resolve().parents[2] / "server" / "static" / "estimate.js"
CONFIGS = [RunConfig(), RunConfig(width=32, layers=1, heads=2, seq=16),
           RunConfig(width=256, layers=6, heads=8, seq=128, microbatch_size=16)]


def run_estimates(configs: list[dict]) -> list[dict]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (make test installs it)")
    script = (f"import * as e from {json.dumps(ESTIMATE.as_uri())};"
              f"const cfgs = {json.dumps(configs)};"
              "console.log(JSON.stringify(cfgs.map((c) => ({params: e.paramCount(c), "
              "memory: e.memoryBytes(c), step: e.stepSeconds(c, cfgs[0], [0.1, 0.3])}))));")
    done = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_page_counts_parameters_and_memory_as_pynode_does():
    got = run_estimates([json.loads(c.to_json()) for c in CONFIGS])
    for cfg, row in zip(CONFIGS, got, strict=True):
        params = sum(math.prod(s) for s in gpt_param_shapes(gpt_config(cfg)).values())
        assert row["params"] == params
        assert row["memory"] == memory_needed(cfg, params)
    # two peers at 0.1 s and 0.3 s a microbatch share the default 4: 4 / (10 + 10/3) s
    assert got[0]["step"] == pytest.approx(4 / (10 + 10 / 3))
    assert got[2]["step"] > got[0]["step"] > got[1]["step"]


def test_the_page_says_sizes_and_a_tabs_budget_as_pynode_does():
    """The estimate said 12017889.1 MiB where Start's refusal said 11.5 TiB; it says sizes
    in the refusal's words now, against the budget a tab plans with."""
    from pynode.platform import PAGE_HEAP_BUDGET
    from pynode.run.assemble import size_text

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (make test installs it)")
    sizes = [0, 2**20 - 1, 812.3 * 2**20, 1023.96 * 2**20, 1.5 * 2**30, 2**40 * 11.5, 2**52]
    script = (f"import * as e from {json.dumps(ESTIMATE.as_uri())};"
              f"console.log(JSON.stringify([e.TAB_MEMORY_BUDGET, "
              f"{json.dumps(sizes)}.map(e.sizeText)]));")
    done = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    budget, said = json.loads(done.stdout)
    assert budget == PAGE_HEAP_BUDGET
    assert said == [size_text(n) for n in sizes], said
