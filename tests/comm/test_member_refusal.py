"""A follower refuses a leader's config it cannot hold in memory, before it trains."""

from __future__ import annotations

import asyncio

import pytest

from pynode.config import RunConfig
from pynode.run import assemble, group
from pynode.run.protocol import start_message


class LeaderSaid:
    """The follower's view of a collective: the leader's `go`, then nothing."""

    rank, world_size, members, bytes_sent = 1, 2, (0, 1), 0

    def __init__(self, cfg: RunConfig):
        self.broadcasts = [start_message("go", cfg)]
        self.gathered: list[bytes] = []

    async def broadcast_bytes(self, data, *, root=0, timeout):
        return self.broadcasts.pop(0)

    async def allgather_bytes(self, data, *, timeout):
        self.gathered.append(data)
        return [b"leader's entry", data]


CFG = RunConfig(steps=2, width=32, layers=1, heads=2, seq=16, microbatch_size=2, microbatches=2)


def test_follower_without_the_memory_refuses_with_a_clear_message(monkeypatch):
    monkeypatch.setattr(assemble.platform, "memory_bytes", lambda: 1 << 16)  # 64 KiB free
    collective = LeaderSaid(CFG)
    refusal = r"rank 1: this config needs about [\d.]+ MiB, only 0.1 MiB"
    with pytest.raises(assemble.MemoryRefusal, match=refusal):
        asyncio.run(group.run_member(collective, None))
    # it takes part in the members' roll only to say why (the others stop at once on it)
    [said] = collective.gathered
    assert said.startswith(group.SETUP_FAILED + b"MemoryRefusal: this config needs")


def test_every_member_stops_naming_the_one_that_could_not_set_the_run_up():
    entries = [b'{"rank": 0}', group.SETUP_FAILED + b"DataFileError: notes.txt cannot be read"]
    with pytest.raises(group.PeerLost, match=r"^rank 1 could not take part in the run: "
                       r"DataFileError: notes.txt cannot be read$") as caught:
        group.read_peer_infos(entries)
    assert caught.value.ranks == (1,)
    info = group.PeerInfo(0, "cpu", 2, 1 << 30)
    assert group.read_peer_infos([info.to_bytes(), None]) == [info]


def test_memory_estimate_grows_with_the_config():
    small = assemble.memory_needed(CFG, 10_000)
    assert assemble.memory_needed(CFG.with_(seq=64), 10_000) > small
    assert assemble.memory_needed(CFG, 1_000_000) > small


def test_a_config_too_large_for_this_machine_is_refused_before_anything_is_allocated(capsys):
    """`train --seq 100000` (1.2 TiB of attention) ended in numpy's _ArrayMemoryError: the
    GEMM tuning's forward pass allocated before the group's check ran, and a single peer
    had no check at all. build_trainer refuses it first, alone or in a group."""
    from pynode.cli.main import main

    assert main(["train", "--seq", "100000", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: MemoryRefusal: this config needs about "), err
    assert "choose a smaller one (--width, --layers, --seq, --microbatch-size)" in err


def test_a_task_whose_model_needs_its_gemm_skips_the_estimate(monkeypatch):
    """check_memory builds the model without a GEMM to count its parameters; a custom task
    that needs one there must not fail on that (its trainer says what is wrong, if
    anything), nor be refused on a guess."""
    from pynode.run.assemble import check_memory

    class NeedsGemm:
        def build_model(self, cfg, gemm):
            return gemm.kernels  # AttributeError on None

    monkeypatch.setattr(assemble.platform, "memory_bytes", lambda: 1 << 16)
    check_memory(CFG, NeedsGemm())  # no AttributeError, no MemoryRefusal
    with pytest.raises(assemble.MemoryRefusal, match="choose a smaller one"):
        from pynode.tasks import load_task
        check_memory(CFG, load_task("gpt"))
