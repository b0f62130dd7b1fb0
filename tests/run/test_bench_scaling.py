"""`bench scaling`: 1 and 2 peers alternate, and the scaling is the median of the rounds."""

from __future__ import annotations

import json

from pynode.bench import scaling

TRAFFIC = {"per_rank_bytes_per_step": {"0": 400.0, "1": 380.0},
           "per_rank_unpacked_bytes_per_step": {"0": 1000.0, "1": 1000.0},
           "ring_optimum_bytes_per_step": 1000.0}
ONE = {"0": {"compute": 100.0, "reduce": 0.0, "update": 2.0}}
TWO = {"0": {"compute": 52.0, "reduce": 6.0, "update": 2.0},
       "1": {"compute": 50.0, "reduce": 8.5, "update": 2.0}}


def test_rounds_alternate_and_the_median_ratio_is_the_scaling(monkeypatch, capsys):
    # tokens/s of each run in order: a machine that slows down and has one odd round
    speeds = iter([100.0, 150.0, 80.0, 200.0, 60.0, 90.0])
    order = []

    def run(peers, cfg, folder):
        order.append(peers)
        return {"peers": peers, "tokens_per_s": next(speeds), "final_hash": "h",
                "traffic": TRAFFIC, "phases": ONE if peers == 1 else TWO}

    monkeypatch.setattr(scaling, "run_peers", run)
    assert scaling.main(["--rounds", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert order == [1, 2, 1, 2, 1, 2]
    assert result["scaling_rounds"] == [1.5, 2.5, 1.5]
    assert result["scaling_2_over_1"] == 1.5  # not 2.5, and not the ratio of the medians
    assert result["tokens_per_s_1"] == 80.0 and result["tokens_per_s_2"] == 150.0
    assert result["same_final_hash"] is True
    assert result["packing_ratio"] == 2.5
    assert result["phase_ms_per_step_1"] == ONE and result["phase_ms_per_step_2"] == TWO


def test_the_report_shows_where_each_ranks_step_goes(monkeypatch, capsys):
    monkeypatch.setattr(scaling, "run_peers", lambda peers, cfg, folder: {
        "peers": peers, "tokens_per_s": 1.0, "final_hash": "h", "traffic": TRAFFIC,
        "phases": ONE if peers == 1 else TWO})
    assert scaling.main(["--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("ms per step"))
    assert lines[at].split() == ["ms", "per", "step", "compute", "reduce", "update", "sum"]
    assert lines[at + 1].split() == ["1", "peer", "100.0", "0.0", "2.0", "102.0"]
    assert lines[at + 2].split() == ["2", "peers,", "rank", "0", "52.0", "6.0", "2.0", "60.0"]
    assert lines[at + 3].split() == ["2", "peers,", "rank", "1", "50.0", "8.5", "2.0", "60.5"]


def test_a_step_is_the_slowest_ranks_whole_step_after_the_first(monkeypatch, tmp_path):
    """tokens/s from the summary's phases (agreement round included), the slowest rank's;
    the log's seconds (which end at the probe) only where no phase was timed."""
    from pynode.config import RunConfig

    cfg = RunConfig.from_dict({"microbatches": 8, "steps": 3})  # 8 x 8 x 64 = 4096 tokens
    summary = {"hash": "h", "traffic": TRAFFIC, "phase_ms_per_step": TWO}

    def train(cmd, **kwargs):
        folder = tmp_path
        (folder / "log2.jsonl").write_text("".join(
            json.dumps({"step": s, "seconds": 0.050}) + "\n" for s in (1, 2, 3)))
        (folder / "summary2.json").write_text(json.dumps(summary))

    monkeypatch.setattr(scaling.subprocess, "run", train)
    run = scaling.run_peers(2, cfg, tmp_path)
    assert run["tokens_per_s"] == 4096 / 0.0605  # rank 1: 50 + 8.5 + 2 ms
    assert run["phases"] == TWO
    summary["phase_ms_per_step"] = {"0": {}}  # a one-step run: nothing timed
    assert scaling.run_peers(2, cfg, tmp_path)["tokens_per_s"] == 4096 * 2 / 0.1


def test_a_run_too_short_to_time_says_so(monkeypatch, capsys):
    monkeypatch.setattr(scaling, "run_peers", lambda peers, cfg, folder: {
        "peers": peers, "tokens_per_s": 1.0, "final_hash": "h", "traffic": TRAFFIC,
        "phases": {"0": {}} if peers == 1 else {"0": {}, "1": {}}})
    assert scaling.main(["--rounds", "1", "--steps", "1"]) == 0
    assert "where a step goes: not measured" in capsys.readouterr().out


def test_a_hash_that_differs_in_any_round_is_reported(monkeypatch, capsys):
    hashes = iter(["a", "a", "a", "b"])
    monkeypatch.setattr(scaling, "run_peers", lambda peers, cfg, folder: {
        "peers": peers, "tokens_per_s": 1.0, "final_hash": next(hashes), "traffic": TRAFFIC,
        "phases": {}})
    assert scaling.main(["--rounds", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["same_final_hash"] is False
