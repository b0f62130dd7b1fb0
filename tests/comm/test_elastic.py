"""`cluster --elastic`: torchrun's elastic agent restarts a gloo cluster that lost a rank, and
the group resumes from the checkpoint its ranks agreed on, ending on the one-peer hash.

The real runs start two agents on this machine, as two machines would (their own --save,
one rendezvous, the first agent hosting its store), SIGKILL one rank, later the whole second
"machine", and check every hash against `train` of one peer.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from comm_helpers import free_port, loopback_group
from pynode_runs import ONE_THREAD, REPO, Launched

from pynode.cli.elastic import worker_argv
from pynode.cli.main import main
from pynode.config import RunConfig
from pynode.run.elastic import (
    Offer,
    ResumeDisagreement,
    agree_on_resume,
    choose,
    config_digest,
    describe_previous,
)

CONFIG = ["--width", "32", "--layers", "1", "--heads", "2", "--seq", "16",
          "--microbatch-size", "2", "--microbatches", "8", "--no-progress", "--kernels", "numpy"]
STEPS, EVERY = 24, 4
RUN = RunConfig(width=32, layers=1, heads=2, seq=16, microbatch_size=2, microbatches=8,
                steps=STEPS)


# --- the decision, the notes, the flags (no process) -----------------------------------------

def offer(step: int, digest: str = "", state_hash: str = "h") -> Offer:
    return Offer(step, f"{state_hash}{step}", digest or config_digest(json.loads(RUN.to_json())))


def test_the_newest_checkpoint_of_the_run_wins_sent_by_its_lowest_holder() -> None:
    other = config_digest(json.loads(RUN.with_(lr=RUN.lr * 2).to_json()))
    said = choose([offer(4), None, offer(8), offer(8), offer(12, digest=other), offer(STEPS)],
                  RUN)
    assert said == {"root": 2, "step": 8, "hash": "h8", "holders": [2, 3], "ignored": [4, 5]}
    assert choose([None, offer(4, digest=other)], RUN)["root"] is None


def test_holders_of_one_step_with_different_states_resume_nothing() -> None:
    with pytest.raises(ResumeDisagreement, match="rank 0: x8.*rank 1: h8"):
        choose([offer(8, state_hash="x"), offer(8)], RUN)


def test_the_group_gets_the_newest_checkpoint_from_the_rank_that_holds_it(tmp_path) -> None:
    async def agree(offers: list) -> list:
        group = await loopback_group(3, tmp_path)
        try:
            return await asyncio.gather(*(
                agree_on_resume(c, o, o and f"bytes of {o.state_hash}".encode(), RUN)
                for c, o in zip(group, offers, strict=True)), return_exceptions=True)
        finally:
            await asyncio.gather(*(c.close() for c in group))

    got = asyncio.run(agree([offer(4), None, offer(8)]))
    assert [(r.step, r.holders, r.data) for r in got] == [(8, (2,), b"bytes of h8")] * 3
    forked = asyncio.run(agree([offer(8, state_hash="x"), None, offer(8)]))
    assert all(isinstance(r, ResumeDisagreement) for r in forked), forked


def test_the_rank_without_a_farewell_is_named_lost() -> None:
    line, stopped = describe_previous(3, {0: "1000.5 stopped by the agent", 2: "1000.2 exited (3)"},
                                      {0: "5 999.0", 1: "5 999.1", 2: "5 999.0"})
    assert "rank 1 of 3 was lost, its last step 5 ended at" in line
    assert "rank 0" not in line.split(";")[0] and stopped == 1000.2
    line, _ = describe_previous(2, {0: "1.0 exited (0)", 1: "1.0 exited (0)"}, {})
    assert "none lost" in line


def test_the_ranks_command_line_drops_the_launcher_flags() -> None:
    argv = ["cluster", "--elastic", "1:2", "--rdzv=h:1", "--steps", "4", "--nproc", "2",
            "--max-restarts", "1", "--rdzv-last-call", "3", "--save", "x.pt"]
    assert worker_argv(argv) == ["cluster", "--steps", "4", "--save", "x.pt"]


@pytest.mark.parametrize("flags, says", [
    (["--elastic", "2:1"], "--elastic needs 1 <= MIN <= MAX, got '2:1'"),
    (["--elastic", "two"], "--elastic must be MIN:MAX machines like 1:4, got 'two'"),
    (["--elastic", "1:2", "--rdzv", "nohost"], "--rdzv must be HOST:PORT, got 'nohost'"),
    (["--elastic", "1:2", "--nproc", "0"], "--nproc (ranks on this machine) must be >= 1, got 0"),
    (["--elastic", "1:2", "--max-restarts", "-1"], "--max-restarts must be >= 0, got -1"),
    (["--nproc", "2"], "--nproc works with --elastic MIN:MAX only"),
    (["--elastic", "1:2", "--capacity", "1,2"], "--capacity gives each rank's speed, and with "
                                                "--elastic MIN:MAX the number of ranks may change"),
])
def test_bad_elastic_flags_are_one_named_line(capsys, tmp_path, flags, says) -> None:
    save = ["--save", str(tmp_path / "x.pt"), "--save-every", "2"]
    assert main(["cluster", *flags, *save]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ConfigError: " + says), err


def test_elastic_without_a_periodic_checkpoint_is_refused(capsys, tmp_path) -> None:
    assert main(["cluster", "--elastic", "1:2", "--save", str(tmp_path / "x.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: ConfigError: --elastic needs --save FILE and --save-every N: a "
                   "restarted group resumes from that checkpoint"]


def test_a_restarted_group_agrees_on_fresh_keys_whatever_stale_keys_remain() -> None:
    """Three attempts of a 2-rank group on one store (torchrun's agent store outlives them):
    the second finds the first, and the stale question rank 1 left in the store does not
    hand the third attempt an old answer."""
    dist = pytest.importorskip("torch.distributed")
    from pynode.comm.gloo import _agree_attempt

    port = free_port()
    host = dist.TCPStore("127.0.0.1", port, 3, True, timedelta(seconds=10),
                         wait_for_workers=False, multi_tenant=True)

    def attempt(ranks: list[int]) -> dict[int, tuple]:
        got: dict[int, tuple] = {}

        def one(rank: int) -> None:
            store = dist.TCPStore("127.0.0.1", port, 3, False, timedelta(seconds=10))
            got[rank] = _agree_attempt(store, "d/", rank, 2, time.monotonic() + 10,
                                       "127.0.0.1", port)

        threads = [threading.Thread(target=one, args=(r,)) for r in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        return got

    first = attempt([0, 1])
    assert first[0] == first[1] and first[0][1] is None
    host.set("d/ask/1", b"stale")  # a rank 1 that asked, then died before the answer
    second = attempt([1, 0])
    assert second[0] == second[1] and second[0][1] == first[0][0] != second[0][0]
    assert attempt([0, 1])[1][1] == second[0][0]


# --- real agents, real gloo, real SIGKILL -----------------------------------------------------

class Machine:
    """`python -m pynode cluster --elastic ...` as one machine would run it."""

    def __init__(self, folder: Path, name: str, args: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYNODE_")}
        self.out, self.err = folder / f"{name}.out", folder / f"{name}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pynode", "cluster", *args], cwd=REPO,
                env={**env, "PYTHONPATH": str(REPO), **ONE_THREAD}, stdin=subprocess.DEVNULL,
                stdout=out, stderr=err, start_new_session=True)

    def ranks(self) -> dict[int, object]:
        """{group rank: its worker process} of this machine's agent now."""
        import psutil

        found = {}
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                found[int(child.environ()["RANK"])] = child
            except (KeyError, psutil.Error):
                continue
        return found

    def kill(self) -> None:
        """The machine is gone: its agent and its ranks, SIGKILL."""
        ranks = list(self.ranks().values())
        self.proc.kill()
        for worker in ranks:
            worker.kill()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.proc.wait(timeout=30)


def rows(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def wait_for(what, limit_s: float = 120.0):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


def listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.full
def test_a_killed_rank_and_then_a_lost_machine_resume_on_the_reference_hash(tmp_path) -> None:
    ref = Launched(tmp_path, "ref", ["train", "--steps", str(STEPS), *CONFIG])
    port, log = free_port(), tmp_path / "run.jsonl"

    def machine(name: str) -> Machine:
        return Machine(tmp_path, name, [
            "--elastic", "1:2", "--rdzv", f"127.0.0.1:{port}", "--rdzv-last-call", "10",
            "--steps", str(STEPS), *CONFIG, "--timeout", "5", "--log", str(log),
            "--save", str(tmp_path / f"{name}.pt"), "--save-every", str(EVERY)])

    a = machine("a")
    b = None
    try:
        wait_for(lambda: listening(port) or a.proc.poll() is not None)  # a hosts the store
        b = machine("b")
        # 1. a rank of machine b dies after the checkpoint of step EVERY
        wait_for(lambda: len(rows(log)) > EVERY and len(b.ranks()) == 1)
        (rank, worker), = b.ranks().items()
        rows_before = rows(log)
        before = len(rows_before)
        worker.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: len(rows(log)) > before)
        first = rows(log)[before]
        took = time.monotonic() - killed
        load = os.getloadavg()[0]
        print(f"SIGKILL of rank {rank} after step {before} -> first resumed step "
              f"{first['step']}: {took:.1f} s (load {load:.1f})")
        # 2. machine b is lost for good: a goes on alone once its rank stopped
        wait_for(lambda: rows(log)[-1]["step"] >= 2 * EVERY + 1 and len(b.ranks()) == 1)
        second_before = len(rows(log))
        b.kill()
        assert a.proc.wait(timeout=180) == 0, a.err.read_text()[-3000:]
    finally:
        a.stop()
        if b is not None:
            b.stop()
    reference = ref.wait()
    assert reference.rc == 0, reference.err[-2000:]
    err = a.err.read_text() + b.err.read_text()
    assert a.out.read_text().strip().splitlines()[-1] == reference.final_hash
    done = rows(log)
    # Resumed from the newest checkpoint both machines hold: the one of step EVERY, or the
    # last agreed step when the survivors saved theirs as the agent stopped them (a kill
    # just after a step was logged; CI saw it once), which may be the step under way when
    # the signal was sent if it still completed and was logged (CI saw that too: 5 rows
    # read, resumed from 6).
    again = re.search(r"resuming from step (\d+) \([^\n]*the group now has 2 rank\(s\)", err)
    assert again, err[-3000:]
    resumed = int(again[1])
    assert EVERY <= resumed <= rows_before[-1]["step"] + 1
    # the resumed run's first row follows the rows logged before the kill: where the steps
    # logged go back (to the step after the checkpoint), or, resumed from the last step
    # logged, the row after it. A step under way at the signal may still have been logged
    # after `before` was read (CI saw it once: rows 1-5 read, 6 logged, then 5 again).
    steps = [row["step"] for row in done[:second_before]]
    redone = next((i for i in range(before, len(steps)) if steps[i] <= steps[i - 1]), None)
    first = done[redone] if redone is not None else next(
        row for row in done[before:second_before] if row["step"] == resumed + 1)
    assert first["step"] == resumed + 1
    # every step, before, between and after the faults, has the one-peer hash
    for row in done:
        assert row["hash"] == reference.hashes[row["step"] - 1], row
    assert done[-1]["step"] == STEPS
    assert f"rank {rank} of 2 was lost" in err
    alone = re.search(r"resuming from step (\d+) [^\n]*the group now has 1 rank\(s\)", err)
    assert alone, err[-3000:]  # a's own checkpoint: the last step both ranks agreed on
    last = int(alone[1])
    after = [row["step"] for row in done[second_before:]]
    # A step under way when the log was read may still complete and be logged before the
    # kill lands (CI saw it once: the row of step 10, then "resuming from step 10"): then it
    # is the last agreed step, the one a resumes from. Otherwise the next row follows it.
    late = 1 if after and after[0] == last else 0
    assert 2 * EVERY <= last and after[late] == last + 1, (last, after)
    assert "s after the previous attempt stopped" in err
