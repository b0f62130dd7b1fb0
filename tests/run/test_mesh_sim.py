"""`bench mesh-sim` with small N: the run protocol over the memory mesh, counted per step."""

from __future__ import annotations

import asyncio
import json

import pytest

from pynode.bench import mesh_sim
from pynode.config import RunConfig

TINY = {"task": "gpt", "width": 32, "layers": 1, "heads": 2, "seq": 16, "microbatch_size": 2,
        "microbatches": 4, "steps": 3, "seed": 2}


def test_every_peer_count_trains_the_one_peer_bits_and_is_counted(checks):
    cfg = RunConfig.from_dict(TINY)
    alone = checks.make_trainer(cfg, None, None)

    async def steps():
        return [(await alone.step()).hash for _ in range(cfg.steps)]

    want = asyncio.run(steps())[-1]
    rows = {n: asyncio.run(mesh_sim.simulate(n, cfg, checks.make_trainer)) for n in (2, 5)}
    raw = 8 * alone.size
    for n, row in rows.items():
        assert row["same_hash_everywhere"] and row["final_hash"] == want, n
        assert row["raw_gradient_bytes"] == raw
        # a control word, the all-reduce, the hash check, the cross-check's digests
        assert 3 <= row["collectives_per_step"] <= 5
        # each peer sends 2(n-1)/n of the packed gradient and more than nothing
        assert 0 < row["bytes_per_peer_per_step_mean"] <= row["bytes_per_peer_per_step_max"]
        assert row["bytes_per_peer_per_step_max"] < 2 * (n - 1) / n * raw
    assert rows[5]["messages_per_peer_per_step_max"] > rows[2]["messages_per_peer_per_step_max"]


def test_the_command_prints_one_row_per_peer_count(checks, capsys, monkeypatch):
    monkeypatch.setattr("pynode.browser.run_checks", lambda: checks)
    assert mesh_sim.main(["--peers", "1,3", "--config", json.dumps({**TINY, "steps": 2})]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["1", "3"]
    assert "same final hash on every peer: True; across peer counts: True" in out
    # a lone peer sends nothing after its start; its row says so
    assert rows[0].split("|")[2].strip() == "0.000 / 0.000 MB"


def test_bad_peer_counts_are_refused(capsys):
    for bad in ("4,x", "0,4"):
        with pytest.raises(SystemExit):
            mesh_sim.main(["--peers", bad])
        assert "--peers" in capsys.readouterr().err
