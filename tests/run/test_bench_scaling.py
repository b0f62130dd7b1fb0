"""`bench scaling`: 1 and 2 peers alternate, and the scaling is the median of the rounds; a
run's step is its plain steps' median plus the cross-check round's cost in the share of
steps that have one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pynode.bench import scaling
from pynode.config import RunConfig
from pynode.core.gpt import GPTConfig, gpt_param_shapes

TRAFFIC = {"per_rank_bytes_per_step": {"0": 400.0, "1": 380.0},
           "per_rank_unpacked_bytes_per_step": {"0": 1000.0, "1": 1000.0},
           "ring_optimum_bytes_per_step": 1000.0}
ONE = {"0": {"compute": 100.0, "reduce": 0.0, "update": 2.0}}
TWO = {"0": {"compute": 52.0, "reduce": 6.0, "update": 2.0},
       "1": {"compute": 50.0, "reduce": 8.5, "update": 2.0}}
MEASURE_CODEC = scaling.measure_codec  # the real one: tests below replace it
CODEC = {"values": 123, "raw_bytes": 1000, "packed_bytes": 400, "identical": True}
TOKENS = 8 * 8 * 64  # the default config at 8 microbatches
SHARE = 4 / 32  # 2 equal peers of 8 microbatches, cross_check 32


def a_run(peers, plain_ms, checked_ms=(), hash_="h", plain_steps=19):
    """A run as run_peers gives it: `plain_steps` plain steps of `plain_ms` (the 1-peer runs'
    share of steps with a round is 0) and the steps with a round."""
    return {"peers": peers, "plain": [plain_ms] * plain_steps, "checked": list(checked_ms),
            "share": 0.0 if peers == 1 else SHARE, "log_ms": 999.0, "final_hash": hash_,
            "traffic": TRAFFIC, "phases": ONE if peers == 1 else TWO}


@pytest.fixture(autouse=True)
def measured_codec(monkeypatch):
    """The codec's figure without training a step (test_the_codec_is_measured_on_a_real_
    step_vector trains one)."""
    monkeypatch.setattr(scaling, "measure_codec", lambda cfg: CODEC)


def test_the_codec_is_measured_on_a_real_step_vector():
    """A peer of two's vector after one real step: the codec packs it to half or less and
    it unpacks to the same values (#18: >= 2x fewer bytes on the wire, same results)."""
    cfg = RunConfig.from_dict({"microbatches": 2, "steps": 2})
    codec = MEASURE_CODEC(cfg)
    size = sum(int(np.prod(s)) for s in gpt_param_shapes(GPTConfig()).values())
    assert codec["values"] == size + 1 + 2 * 2  # gradient, loss, counts, digests
    assert codec["identical"] is True
    assert codec["raw_bytes"] >= 2 * codec["packed_bytes"] > 0


def test_rounds_alternate_and_the_median_ratio_is_the_scaling(monkeypatch, capsys):
    # each run's plain step in order: a machine that slows down and has one odd round; the
    # 2-peer runs' check rounds cost 16, 8 and (none held) the median of those, 12 ms
    runs = iter([a_run(1, 100.0), a_run(2, 60.0, [76.0]),
                 a_run(1, 130.0), a_run(2, 50.0, [58.0, 58.0]),
                 a_run(1, 150.0), a_run(2, 98.5)])
    order = []

    def run(peers, cfg, folder):
        order.append(peers)
        return next(runs)

    monkeypatch.setattr(scaling, "run_peers", run)
    assert scaling.main(["--rounds", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert order == [1, 2, 1, 2, 1, 2]
    steps_2 = [60.0 + SHARE * 16.0, 50.0 + SHARE * 8.0, 98.5 + SHARE * 12.0]  # 62, 51, 100
    assert result["scaling_rounds"] == pytest.approx([100 / 62, 130 / 51, 150 / 100])
    # the median round, not 130 / 51, nor the ratio of the medians (130 / 62)
    assert result["scaling_2_over_1"] == pytest.approx(100 / 62)
    assert result["tokens_per_s_1"] == pytest.approx(1000 * TOKENS / 130.0)
    assert result["tokens_per_s_2"] == pytest.approx(1000 * TOKENS / steps_2[0])
    assert result["check_round_share"] == SHARE and result["check_round_ms"] == 12.0
    assert result["check_rounds_timed"] == [[1, 20], [2, 21], [0, 19]]
    assert result["same_final_hash"] is True
    assert result["packing_ratio"] == 2.5
    assert result["phase_ms_per_step_1"] == ONE and result["phase_ms_per_step_2"] == TWO


def test_a_runs_step_is_its_typical_plain_step_and_its_rounds_at_their_share():
    """Medians leave a stall out and means count it; a round is weighed by the share of
    steps that have one, not by how many this run happened to hold."""
    run = a_run(2, 0.0)
    run["plain"] = [60.0, 61.0, 62.0, 120.0]  # one stall
    run["checked"] = [78.0, 78.0, 78.0]  # 3 of 7 steps; 1 in 8 expected
    median, mean = scaling.statistics.median, scaling.statistics.fmean
    assert scaling.typical_step_ms(run, median, None) == 61.5 + SHARE * (78.0 - 61.5)
    assert scaling.typical_step_ms(run, mean, None) == 75.75 + SHARE * (78.0 - 75.75)
    assert scaling.round_extra([run, a_run(2, 60.0)], median) == 16.5
    only_plain, only_rounds = a_run(2, 60.0), {**a_run(2, 0.0, [80.0]), "plain": []}
    assert scaling.typical_step_ms(only_plain, median, 16.0) == 62.0
    assert scaling.typical_step_ms(only_plain, median, None) == 60.0
    # a round in every step timed (a share of 1 where every step picks): those steps
    assert scaling.typical_step_ms({**only_rounds, "share": 1.0}, median, 16.0) == 80.0
    assert scaling.typical_step_ms(only_rounds, median, 16.0) == 80.0 - (1 - SHARE) * 16.0
    nothing = {**a_run(2, 0.0, plain_steps=0), "log_ms": 55.0}
    assert scaling.typical_step_ms(nothing, median, 16.0) == 55.0


def test_without_a_measured_round_the_report_says_the_cross_check_is_left_out(
        monkeypatch, capsys):
    monkeypatch.setattr(scaling, "run_peers",
                        lambda peers, cfg, folder: a_run(peers, 120.0 if peers == 1 else 60.0))
    assert scaling.main(["--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "scaling x2.00" in out
    assert "0 of the 2-peer runs' 19 timed steps, not both kinds" in out and "12.5 %" in out
    monkeypatch.setattr(scaling, "run_peers", lambda peers, cfg, folder: a_run(
        peers, 120.0 if peers == 1 else 58.0, [] if peers == 1 else [74.0, 74.0]))
    assert scaling.main(["--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "scaling x2.00" in out  # 120 / (58 + 16 / 8)
    assert "2 of the 2-peer runs' 21 timed steps; each took 16.0 ms more" in out


def test_the_report_shows_where_each_ranks_step_goes(monkeypatch, capsys):
    monkeypatch.setattr(scaling, "run_peers", lambda peers, cfg, folder: a_run(peers, 1.0))
    assert scaling.main(["--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("ms per step"))
    assert lines[at].split() == ["ms", "per", "step", "compute", "reduce", "update", "sum"]
    assert lines[at + 1].split() == ["1", "peer", "100.0", "0.0", "2.0", "102.0"]
    assert lines[at + 2].split() == ["2", "peers,", "rank", "0", "52.0", "6.0", "2.0", "60.0"]
    assert lines[at + 3].split() == ["2", "peers,", "rank", "1", "50.0", "8.5", "2.0", "60.5"]


def write_run(folder, step_ms, log_seconds=(0.050, 0.050, 0.050)):
    """What `train --peers 2 --log --summary` leaves: a log row a step, and the summary."""
    def train(cmd, **kwargs):
        (folder / "log2.jsonl").write_text("".join(
            json.dumps({"step": s, "seconds": t}) + "\n"
            for s, t in enumerate(log_seconds, start=1)))
        (folder / "summary2.json").write_text(json.dumps(
            {"hash": "h", "traffic": TRAFFIC, "phase_ms_per_step": TWO, "step_ms": step_ms}))
    return train


def test_a_step_is_the_slowest_ranks_and_its_kind_is_kept(monkeypatch, tmp_path):
    """Each step every rank timed counts at its slowest rank's time, plain or with a
    check round (a step is one where any rank had one)."""
    cfg = RunConfig.from_dict({"microbatches": 8, "steps": 7})
    rows = {"0": [(2, 60.0), (3, 61.0), (4, 90.0), (5, 77.0), (6, 59.0), (7, 62.0)],
            "1": [(2, 60.5), (3, 60.0), (4, 90.5), (5, 76.0), (6, 63.0)]}  # no step 7
    step_ms = {r: [[s, ms, s == 5, SHARE] for s, ms in steps] for r, steps in rows.items()}
    monkeypatch.setattr(scaling.subprocess, "run", write_run(tmp_path, step_ms))
    run = scaling.run_peers(2, cfg, tmp_path)
    assert run["plain"] == [60.5, 61.0, 90.5, 63.0] and run["checked"] == [77.0]
    assert run["share"] == SHARE and run["log_ms"] == 50.0
    assert run["phases"] == TWO


def test_a_run_with_nothing_timed_takes_its_logs_steps(monkeypatch, tmp_path):
    cfg = RunConfig.from_dict({"microbatches": 8, "steps": 3})
    monkeypatch.setattr(scaling.subprocess, "run",
                        write_run(tmp_path, {"0": [], "1": []}, (0.5, 0.04, 0.06)))
    run = scaling.run_peers(2, cfg, tmp_path)
    assert run["log_ms"] == pytest.approx(50.0)  # the median of the rows after the first
    assert run["plain"] == run["checked"] == [] and run["share"] == 0.0


def test_a_run_too_short_to_time_says_so(monkeypatch, capsys):
    monkeypatch.setattr(scaling, "run_peers", lambda peers, cfg, folder: {
        **a_run(peers, 1.0), "phases": {"0": {}} if peers == 1 else {"0": {}, "1": {}}})
    assert scaling.main(["--rounds", "1", "--steps", "1"]) == 0
    assert "where a step goes: not measured" in capsys.readouterr().out


def test_a_hash_that_differs_in_any_round_is_reported(monkeypatch, capsys):
    hashes = iter(["a", "a", "a", "b"])
    monkeypatch.setattr(scaling, "run_peers",
                        lambda peers, cfg, folder: a_run(peers, 1.0, hash_=next(hashes)))
    assert scaling.main(["--rounds", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["same_final_hash"] is False
