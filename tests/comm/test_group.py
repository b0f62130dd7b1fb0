"""Data-parallel runs as a user starts them: `train --peers N` (loopback processes) and
`cluster` (gloo), with faults injected through PYNODE_FAULT="RANK:STEP:KIND".

Every run trains the same 4-step config, so every per-step hash must equal the one-peer
reference's. All independent runs start together in one module fixture; each of the two
resumes starts as soon as the run that writes its checkpoint has ended.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from comm_helpers import free_port
from pynode_runs import REPO, Done, Launched

from pynode import native_kernels
from pynode.core.checkpoint import load_checkpoint

# Every test reads `runs`: some 30 interpreters on 2 cores, half a minute or more.
pytestmark = pytest.mark.slow

CONFIG = ["--width", "32", "--layers", "1", "--heads", "2", "--seq", "16",
          "--microbatch-size", "2", "--microbatches", "8", "--no-progress"]
TRAIN = ["train", "--steps", "4", *CONFIG]
# Most runs take the numpy reference kernels: numba's import and first load cost about a
# second an interpreter. The one-peer reference and the gloo pair keep the default (numba
# where installed), so every comparison also crosses the two.
QUICK = ["--kernels", "numpy"]
GLOO_TIMEOUT_S = 6
# A surviving gloo rank waits at most --timeout for the dead one; the rest is slack for a
# loaded machine (the first checkpoint write, interpreter exit).
STOP_BOUND_S = GLOO_TIMEOUT_S + 12
# A --timeout that a roll call waiting it out would show (the runs stop well before)
LONG_TIMEOUT_S = 40


class InTerminal:
    """`python -m pynode ARGS` with stderr on a 120-column pseudo-terminal, as a user sees
    it: the progress bar is drawn."""

    def __init__(self, args: list[str]):
        import fcntl
        import os
        import pty
        import struct
        import subprocess
        import sys
        import termios

        from pynode_runs import ONE_THREAD, REPO

        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYNODE_")}
        self.proc = subprocess.Popen([sys.executable, "-m", "pynode", *args], cwd=REPO,
                                     env={**env, "PYTHONPATH": str(REPO), **ONE_THREAD},
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=slave, start_new_session=True)
        os.close(slave)
        self.master, self.chunks = master, []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        import os

        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every writer of the terminal has exited
                return
            if not chunk:
                return
            self.chunks.append(chunk)

    def wait(self) -> tuple[int, str]:
        import os

        out, _ = self.proc.communicate(timeout=300)
        self.reader.join(timeout=30)
        os.close(self.master)
        return self.proc.returncode, b"".join(self.chunks).decode("utf-8", "replace") + out.decode()


def gloo_pair(folder: Path, name: str, args: list[str], fault: str | None = None,
              world: int = 2, rank0_env: dict | None = None) -> list:
    """`cluster` ranks 0..world-1 (rank r > 0 is named NAME-rankR); `rank0_env`: more
    environment for rank 0 alone."""
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
    if fault:
        base["PYNODE_FAULT"] = fault
    others = [Launched(folder, f"{name}-rank{r}", ["cluster", *args], {**base, "RANK": str(r)})
              for r in range(1, world)]
    return [Launched(folder, name, ["cluster", *args], {**base, "RANK": "0", **(rank0_env or {})}),
            *others]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, full_suite) -> dict:
    """Every run at once. The runs only `full` tests read (the crash and death chains, a
    second cross-check shape, data files, a terminal) start in the full suite only: the
    quick tier has two minutes for everything."""
    folder = tmp_path_factory.mktemp("group")
    # --capacity fixed: the dying rank must hold microbatches
    death_args = [*TRAIN[1:], *QUICK, "--timeout", str(GLOO_TIMEOUT_S), "--save",
                  str(folder / "X.pt"), "--capacity", "1,1"]
    started = {
        "peers1": Launched(folder, "peers1", [*TRAIN, "--peers", "1"]),
        # Rank 1's GEMM goes wrong at one shape from step 2 on (here and in the gloo pair);
        # its product check (on by default) catches it.
        "peers3": Launched(folder, "peers3", [*TRAIN, *QUICK, "--peers", "3",
                                              "--capacity", "1,2,5", "--summary",
                                              str(folder / "peers3.summary.json")],
                           {"PYNODE_FAULT": "1:2:gemm"}),
        # A pair hands its vectors over in shared memory (pynode/comm/shared.py).
        "peers2": Launched(folder, "peers2", [*TRAIN, *QUICK, "--peers", "2", "--summary",
                                              str(folder / "peers2.summary.json")]),
        # A fixed plan: rank 2 must hold microbatches at step 2 to die in the middle of them.
        "kill": Launched(folder, "kill", [*TRAIN, *QUICK, "--peers", "3", "--capacity", "1,1,1"],
                         {"PYNODE_FAULT": "2:2:kill"}),
        "flip": Launched(folder, "flip", [*TRAIN, *QUICK, "--peers", "3"],
                         {"PYNODE_FAULT": "1:2:flip"}),
        # Rank 1's gradients go wrong from step 2 on (no GEMM is wrong); every microbatch
        # is recomputed by another peer. With 3 peers the majority names rank 1; with 2
        # nobody can tell who is right.
        # (--capacity: a fixed plan, so rank 1 holds microbatches in step 2.)
        "grad": Launched(folder, "grad", [*TRAIN, *QUICK, "--peers", "3", "--cross-check", "1",
                                          "--capacity", "1,1,1"], {"PYNODE_FAULT": "1:2:grad"}),
        "nan": Launched(folder, "nan", [*TRAIN, *QUICK, "--peers", "3", "--capacity", "1,1,1"],
                        {"PYNODE_FAULT": "1:2:nan"}),
        # The leader's own gradient is not finite at step 3: the group stops, and --save
        # holds step 2, the last step everybody agreed on.
        "nan0": Launched(folder, "nan0", [*TRAIN, *QUICK, "--peers", "2", "--capacity", "1,1",
                                          "--save", str(folder / "nan0.pt")],
                         {"PYNODE_FAULT": "0:3:nan"}),
        # Steps 1-2 lie inside the 10-step warm-up, whose learning rate does not depend on
        # the run length: a 2-step run is the prefix of the 4-step run.
        "first2": Launched(folder, "first2", ["train", "--steps", "2", *CONFIG, *QUICK,
                                              "--save", str(folder / "step2.pt")]),
    }
    pairs = {
        "gloo": gloo_pair(folder, "gloo", [*TRAIN[1:], "--capacity", "1,1", "--summary",
                                           str(folder / "gloo.summary.json")], fault="1:2:gemm"),
    }
    terminal = None
    if full_suite:
        started["grad2"] = Launched(folder, "grad2", [*TRAIN, *QUICK, "--peers", "2",
                                                      "--cross-check", "1", "--capacity", "1,1"],
                                    {"PYNODE_FAULT": "1:2:grad"})
        # The leader dies at step 3 of a 4-step run that checkpoints every 2 steps.
        started["crash"] = Launched(folder, "crash", [*TRAIN, *QUICK, "--peers", "2",
                                                      "--capacity", "1,1", "--save",
                                                      str(folder / "crash.pt"),
                                                      "--save-every", "2"],
                                    {"PYNODE_FAULT": "0:3:kill"})
        pairs["death"] = gloo_pair(folder, "death", death_args, fault="1:3:kill")
        # Rank 0 dies: rank 1 says where the run's state is, if anywhere.
        pairs["leader_death"] = gloo_pair(
            folder, "leader_death",
            [*death_args[:-4], "--save", str(folder / "L.pt"), "--capacity", "1,1"],
            fault="0:3:kill")
        # Rank 1's own Ctrl-C at step 3.
        pairs["rank1_int"] = gloo_pair(
            folder, "rank1_int",
            [*death_args[:-4], "--save", str(folder / "I.pt"), "--capacity", "1,1"],
            fault="1:3:int")
        # Rank 0 of three local peers alone gets SIGINT at step 3 (kill -INT, an IDE's stop
        # button): not the terminal's Ctrl-C, which reaches every process of the group.
        started["lead_int"] = Launched(folder, "lead_int", [*TRAIN, *QUICK, "--peers", "3",
                                                            "--capacity", "1,1,1"],
                                       {"PYNODE_FAULT": "0:3:int"})
        # Rank 2 of three: its own Ctrl-C at step 3; the other two must not wait --timeout.
        pairs["int3"] = gloo_pair(
            folder, "int3", [*TRAIN[1:], *QUICK, "--timeout", str(LONG_TIMEOUT_S), "--save",
                             str(folder / "T.pt"), "--capacity", "1,1,1"],
            fault="2:3:int", world=3)
        pairs["gloo_grad"] = gloo_pair(folder, "gloo_grad",
                                       [*TRAIN[1:], *QUICK, "--cross-check", "1",
                                        "--capacity", "1,1,1"], fault="1:2:grad", world=3)
        # Rank 1 cannot import rank 0's task module (on rank 0's PYTHONPATH only).
        tasks = folder / "tasks_here"
        tasks.mkdir()
        (tasks / "regtask.py").write_text(
            (REPO / "examples" / "my_task_template.py").read_text())
        pairs["setup"] = gloo_pair(
            folder, "setup", ["--task", "regtask:LinearRegressionTask", "--steps", "3",
                              *QUICK, "--no-progress", "--timeout", str(GLOO_TIMEOUT_S)],
            rank0_env={"PYTHONPATH": os.pathsep.join(map(str, (REPO, tasks)))})
        text = folder / "notes.txt"
        text.write_text(" ".join(f"line {i}: the peers read this file each" for i in range(300)))
        started["file1"] = Launched(folder, "file1", [*TRAIN, *QUICK, "--data", str(text)])
        started["file2"] = Launched(folder, "file2", [*TRAIN, *QUICK, "--data", str(text),
                                                      "--peers", "2"])
        terminal = InTerminal([*(a for a in TRAIN if a != "--no-progress"), *QUICK,
                               "--peers", "2"])
    done: dict = {"first2": started.pop("first2").wait()}
    if full_suite:
        done["crash"] = started.pop("crash").wait()
        started["resume_crash"] = Launched(folder, "resume_crash", ["train", "--resume",
                                           str(folder / "crash.pt"), "--no-progress", *QUICK])
    # the same checkpoint resumed by a gloo pair (rank 0 reads it, rank 1 follows)
    resume_pair = gloo_pair(folder, "resume_gloo", ["--resume", str(folder / "step2.pt"),
                                                    "--steps", "4", "--no-progress", *QUICK])
    pairs["resume_gloo"] = resume_pair
    started["resume3"] = Launched(folder, "resume3", ["train", "--resume",
                                  str(folder / "step2.pt"), "--steps", "4", "--peers", "3",
                                  "--no-progress", *QUICK])
    for name, (rank0, *others) in pairs.items():
        done[name] = rank0.wait()
        done.update({f"{name}-rank{r}": run.wait() for r, run in enumerate(others, 1)})
    if full_suite:
        started["resume_death"] = Launched(folder, "resume_death", ["train", "--resume",
                                           str(folder / "X.pt"), "--peers", "2",
                                           "--no-progress", *QUICK])
    done.update({name: proc.wait() for name, proc in started.items()})
    if terminal is not None:
        done["terminal"] = terminal.wait()
    done["folder"] = folder
    return done


def ok(done: Done) -> Done:
    assert done.rc == 0, done.err[-3000:]
    return done


@pytest.fixture(scope="module")
def reference(runs) -> Done:
    ref = ok(runs["peers1"])
    assert [row["step"] for row in ref.log] == [1, 2, 3, 4]
    assert len(set(ref.hashes)) == 4 and ref.final_hash == ref.hashes[-1]
    return ref


def test_runs_compare_the_default_kernels_with_the_reference_kernels(runs):
    assert "kernels numpy" in ok(runs["peers3"]).err
    if native_kernels.available():
        assert "kernels numba" in ok(runs["peers1"]).err


# --- same bits, whatever the shape of the group ------------------------------------------------

@pytest.mark.parametrize("name", ["peers2", "peers3", "gloo"])
def test_group_gives_the_one_peer_hashes(runs, reference, name):
    run = ok(runs[name])
    assert run.hashes == reference.hashes
    assert run.final_hash == reference.final_hash
    assert [row["loss"] for row in run.log] == [row["loss"] for row in reference.log]


@pytest.mark.parametrize("name", ["peers3", "gloo"])
def test_reduced_gradients_travel_packed_in_half_the_bytes_or_less(runs, name):
    """The same hashes as one peer (above), from vectors the int64 codec packed: every rank
    sent at most half of what raw int64 would have taken (pynode.comm.wire)."""
    ok(runs[name])
    traffic = json.loads((runs["folder"] / f"{name}.summary.json").read_text())["traffic"]
    packed, raw = traffic["per_rank_bytes_per_step"], traffic["per_rank_unpacked_bytes_per_step"]
    assert set(packed) == set(raw) == {str(r) for r in range(3 if name == "peers3" else 2)}
    for rank in packed:
        assert raw[rank] >= 2 * packed[rank] > 0, (rank, raw[rank], packed[rank])
    assert max(raw.values()) >= traffic["gradient_bytes"]  # the gradient is in there


def test_a_local_pair_hands_its_gradients_over_in_shared_memory(runs):
    """Both ranks of `--peers 2` put every step's vector (gradient, loss, counts, digests:
    21,088 + 1 + 16 values here) in shared memory after the first all-reduce, which goes
    packed and offers the file; the socket carries only small frames after that."""
    run = ok(runs["peers2"])
    (line,) = [x for x in run.err.splitlines() if x.startswith("traffic: ")]
    assert "handed over in shared memory (local peers)" in line and "ratio" not in line
    traffic = json.loads((runs["folder"] / "peers2.summary.json").read_text())["traffic"]
    shared, sent = traffic["per_rank_shared_bytes_per_step"], traffic["per_rank_bytes_per_step"]
    vector = 8 * (traffic["gradient_bytes"] // 8 + 1 + 2 * 8)
    for rank in ("0", "1"):
        assert shared[rank] * 4 == 3 * vector  # steps 2-4 of 4, per step of 4
        assert sent[rank] < vector  # the first step's packed vector, then small frames


@pytest.mark.parametrize("name", ["peers3", "gloo"])
def test_the_summary_says_where_each_ranks_steps_went(runs, name):
    """Every rank's milliseconds per step in each phase (pynode.run.stepclock.PHASES)."""
    from pynode.run.stepclock import PHASES

    ok(runs[name])
    summary = json.loads((runs["folder"] / f"{name}.summary.json").read_text())
    phases = summary["phase_ms_per_step"]
    assert summary["phase_timed_steps"] == summary["step"] - 1  # the first one starts up
    assert set(phases) == {str(r) for r in range(3 if name == "peers3" else 2)}
    for ms in phases.values():
        assert set(ms) == set(PHASES) and ms["compute"] > 0 and ms["reduce"] > 0
    # and each timed step on its own (bench scaling takes their medians), the same steps on
    # every rank, flagged alike (no step of these has a cross-check round: seed 1)
    steps = summary["step_ms"]
    assert set(steps) == set(phases)
    for rows in steps.values():
        assert [s for s, _, _, _ in rows] == list(range(2, summary["step"] + 1))
        assert all(ms > 0 and had is False and 0 < share < 1 for _, ms, had, share in rows)


def test_capacity_plan_is_reported(runs):
    lines = ok(runs["peers3"]).err.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("rank  device"))
    rows = [line.split() for line in lines[header + 1 : header + 4]]
    # rank, then microbatches of the 8 in proportion 1:2:5
    assert [(row[0], row[-2]) for row in rows] == [("0", "1"), ("1", "2"), ("2", "5")]
    assert "cluster-wide unit invocations: mul" in runs["peers3"].err


def test_gloo_follower_finishes_cleanly(runs, reference):
    rank1 = ok(runs["gloo-rank1"])
    assert rank1.out == ""
    lines = rank1.err.strip().splitlines()
    if "waiting for the other ranks" in lines[0]:  # a group slower than a few seconds to form
        lines = lines[1:]
    assert "rank 1 of 2: in the group, following rank 0's run" in lines[0]
    assert lines[-1].split(" ", 1)[1].startswith(
        f"rank 1: finished (step 4/4, state hash {reference.final_hash[:16]}, microbatch "), \
        lines[-1]
    assert lines[-1].endswith(" MB): every step agreed with the group"), lines[-1]
    assert sum("finished" in line for line in lines) == 1, lines


@pytest.mark.parametrize("name", ["peers3", "gloo"])
def test_the_group_summary_gives_the_real_elapsed_time(runs, name):
    run = ok(runs[name])
    (elapsed,) = re.findall(r"^step 4  loss \d+\.\d{4}  (\d+\.\d\d)s$", run.err, re.M)
    stepping = sum(row["seconds"] for row in run.log)
    assert stepping - 0.01 <= float(elapsed) < stepping + 10.0, (elapsed, stepping)


@pytest.mark.full
def test_the_group_progress_bar_counts_to_its_total_under_the_report_lines(runs, reference):
    rc, text = runs["terminal"]
    assert rc == 0, text[-3000:]
    segments = [seg.strip() for seg in re.split(r"[\r\n]", text) if seg.strip()]
    # a bar says "step/s", or "s/step" once a step takes over a second (a loaded machine)
    bars = [seg for seg in segments if re.search(r"step/s|s/step", seg)]
    assert bars and all(re.search(r"\| [0-4]/4 \[", bar) for bar in bars), bars
    assert any("| 4/4 [" in bar for bar in bars)
    for start in ("rank  device", "cluster-wide unit invocations", "traffic: ", "step 4  loss"):
        lines = [seg for seg in segments if start in seg]
        assert lines and all(seg.startswith(start) for seg in lines), (start, lines)
    assert text.rstrip().endswith(reference.final_hash)


@pytest.mark.full
def test_a_group_trains_a_data_file_to_the_one_peer_hashes(runs, reference):
    one, two = ok(runs["file1"]), ok(runs["file2"])
    assert len(one.hashes) == 4 and two.hashes == one.hashes
    assert one.hashes != reference.hashes  # other text than the built-in corpus


def test_capacities_whole_microbatches_cannot_follow_are_noted(runs):
    assert "note: --capacity" not in ok(runs["peers3"]).err  # 1:2:5 of 8 is exact
    assert ("note: --capacity 1,1,1 of 8 microbatches: whole microbatches split 3/3/2"
            in ok(runs["kill"]).err)


# --- faults ----------------------------------------------------------------------------------

def test_sigkilled_loopback_peer_changes_no_hash(runs, reference):
    run = ok(runs["kill"])
    assert "re-planning lost microbatches" in run.err  # the peer really died mid-step
    assert run.hashes == reference.hashes and run.final_hash == reference.final_hash
    # said in the run's own words, and the end's report is whole without it (a warning that
    # rank 2 "sent no readable step times", and no traffic line, before)
    assert "rank 2 left the group at step 2: its microbatches went to the others, and the " \
        "run goes on with 2 peer(s), the same bits" in run.err, run.err[-3000:]
    assert "sent no readable step times" not in run.err
    assert "traffic: up to " in run.err, run.err[-3000:]


def test_flipped_weight_bit_is_detected_and_resynced(runs, reference):
    run = ok(runs["flip"])
    assert "step 2: replicas disagree" in run.err
    assert "re-synced" in run.err
    assert run.hashes == reference.hashes and run.final_hash == reference.final_hash


@pytest.mark.parametrize("name", ["peers3", "gloo"])
def test_a_peer_whose_kernel_is_wrong_at_one_shape_is_named_and_changes_no_hash(
    runs, reference, name
):
    """Without the check this fault ends on other hashes (pynode/cli/faults.py)."""
    run = ok(runs[name])
    assert run.hashes == reference.hashes and run.final_hash == reference.final_hash
    peer = ok(runs[f"{name}-rank1"]) if name.startswith("gloo") else run  # loopback: one stderr
    assert "rank 1: WARNING pynode.core.gemm.select: GEMM backend wrong_" in peer.err
    assert "gave a wrong product" in peer.err and "on another backend" in peer.err


@pytest.mark.parametrize("name", ["grad", pytest.param("gloo_grad", marks=pytest.mark.full)])
def test_a_peer_whose_gradients_are_wrong_is_outvoted_named_and_left_out(
    runs, reference, name
):
    """Without the cross-peer check this fault ends on other hashes (pynode/cli/faults.py)."""
    run = ok(runs[name])
    assert run.hashes == reference.hashes and run.final_hash == reference.final_hash
    assert "step 2: microbatch" in run.err and "ranks [1] computed it wrong" in run.err
    assert "step 2: leaving out the work of ranks [1]; microbatches" in run.err
    peer = ok(runs[f"{name}-rank1"]) if name.startswith("gloo") else run  # loopback: one stderr
    assert "rank 1: WARNING pynode.run: step 2: this peer (rank 1) computed differently" in peer.err


@pytest.mark.full
def test_two_peers_that_disagree_both_stop_with_a_clear_message(runs, reference):
    run = runs["grad2"]
    assert run.rc == 3, run.err[-2000:]
    assert "VerificationError: step 2: microbatch" in run.err
    assert "no strict majority agrees" in run.err
    assert run.hashes == reference.hashes[:1]


def test_nan_on_one_peer_is_refused_by_that_peer(runs, reference):
    run = ok(runs["nan"])
    assert "rank 1: stopped: NonFiniteError" in run.err
    assert run.hashes == reference.hashes and run.final_hash == reference.final_hash


def test_a_leader_that_stops_on_an_error_saves_the_last_agreed_step(runs, reference):
    """Not only a lost peer or a fork: any error that stops rank 0 (here its own NaN
    gradient) leaves --save at the last agreed step, as one peer does."""
    run = runs["nan0"]
    assert run.rc == 2 and "NonFiniteError" in run.err, run.err[-2000:]
    assert "saved the last agreed state (step 2)" in run.err
    state = load_checkpoint((runs["folder"] / "nan0.pt").read_bytes())
    assert (state.step, state.state_hash) == (2, reference.hashes[1]) == (2, run.hashes[-1])


# --- resume on another group shape -----------------------------------------------------------

def test_resume_on_three_peers_from_a_one_peer_checkpoint(runs, reference):
    first, resumed = ok(runs["first2"]), ok(runs["resume3"])
    assert resumed.err.count("note: --steps 4 (the checkpoint's run has 2)") == 1  # said once
    assert first.hashes == reference.hashes[:2]
    assert [row["step"] for row in resumed.log] == [3, 4]
    assert resumed.hashes == reference.hashes[2:]
    assert resumed.final_hash == reference.final_hash


def test_a_gloo_pair_resumes_a_one_peer_checkpoint_and_says_so(runs, reference):
    """`cluster --resume` said nothing of the checkpoint it went on from (train and join
    --start say `resuming F: step S of N, state hash H` first)."""
    rank0, rank1 = ok(runs["resume_gloo"]), ok(runs["resume_gloo-rank1"])
    saved = runs["folder"] / "step2.pt"
    line = f"resuming {saved}: step 2 of 4, state hash {reference.hashes[1][:16]}"
    said = rank0.err.splitlines()
    first = next(i for i, text in enumerate(said) if "resuming" in text or "note:" in text)
    assert said[first] == line, rank0.err[-2000:]  # the first of its lines on the run
    assert "resuming" not in rank1.err, rank1.err[-2000:]
    assert rank0.err.count("note: --steps 4 (the checkpoint's run has 2)") == 1
    assert [row["step"] for row in rank0.log] == [3, 4]
    assert rank0.hashes == reference.hashes[2:]


@pytest.mark.full
def test_gloo_rank_death_stops_rank0_in_bounded_time_with_a_checkpoint(runs, reference):
    rank0, rank1 = runs["death"], runs["death-rank1"]
    assert rank1.rc == -9, rank1.err[-2000:]  # the fault hook SIGKILLed rank 1
    assert rank0.rc not in (0, None), rank0.err[-2000:]
    assert "saved the last agreed state (step 2)" in rank0.err
    last = rank0.err.strip().splitlines()[-1]
    assert last.startswith("error: the group stopped: PeerLost"), last
    # said once (the status line said it too), with where it stopped and how to go on
    assert sum("PeerLost" in line for line in rank0.err.splitlines()) == 1, rank0.err[-2000:]
    saved, log = runs["folder"] / "X.pt", runs["folder"] / "death.jsonl"
    assert last.endswith(" (step 2/4); to go on from there, start the group again with "
                         f"--resume {saved} --save {saved} --log {log}"), last
    stopped_after = rank0.ended - rank1.ended
    assert stopped_after < STOP_BOUND_S, f"rank 0 took {stopped_after:.1f} s to stop"
    assert rank0.hashes == reference.hashes[:2]
    ckpt = load_checkpoint((runs["folder"] / "X.pt").read_bytes())
    assert ckpt.step == 2 and ckpt.state_hash == reference.hashes[1]


@pytest.mark.full
def test_a_gloo_rank_that_lost_rank_0_says_where_the_runs_state_is(runs, reference):
    """Rank 1 said only `PeerLost: gloo group broken`; only rank 0 saves, on its machine."""
    rank0, rank1 = runs["leader_death"], runs["leader_death-rank1"]
    assert rank0.rc == -9, rank0.err[-2000:]
    assert rank1.rc == 3, rank1.err[-2000:]
    assert "stopped: PeerLost" in rank1.err, rank1.err[-2000:]
    assert rank1.err.strip().splitlines()[-1].split(" ", 1)[1] == (  # after the time
        "rank 1: rank 0 left the run. Only rank 0 saves, on its machine: after a Ctrl-C or "
        f"SIGTERM its --save {runs['folder'] / 'L.pt'} holds the last step every rank agreed "
        "on (this rank's step above may be one past it), else its last --save-every "
        "checkpoint does; to go on, start every rank again, rank 0 with --resume that file")


@pytest.mark.full
def test_a_gloo_rank_interrupted_on_its_own_terminal_says_where_it_stood(runs, reference):
    """Rank 1's Ctrl-C said only `interrupted`; now its status line first, as a finished
    or stopped rank's, and rank 0 stops with the last agreed step saved."""
    rank0, rank1 = runs["rank1_int"], runs["rank1_int-rank1"]
    assert rank1.rc == 130, rank1.err[-2000:]
    *_, status, last = rank1.err.strip().splitlines()
    assert last == "interrupted", rank1.err[-2000:]
    assert status.split(" ", 1)[1].startswith(  # after the time
        f"rank 1: stopped: interrupted (Ctrl-C) (step 2/4, state hash {reference.hashes[1][:16]}"
    ), status
    assert "Traceback" not in rank1.err
    assert rank0.rc == 3 and "saved the last agreed state (step 2)" in rank0.err, rank0.err[-2000:]


@pytest.mark.full
def test_a_group_of_three_stops_at_once_when_a_rank_is_interrupted(runs, reference):
    """Rank 2's Ctrl-C: it leaves its mark in the store as it closes, so ranks 0 and 1 name
    it lost at once. Their roll call waited the whole --timeout for it (a frozen minute at
    the default), with the progress bar stopped."""
    rank0, rank2 = runs["int3"], runs["int3-rank2"]
    assert rank2.rc == 130, rank2.err[-2000:]
    assert rank0.rc == 3, rank0.err[-2000:]
    last = rank0.err.strip().splitlines()[-1]
    assert last.startswith("error: the group stopped: PeerLost") and "lost [2]" in last, last
    stopped_after = rank0.ended - rank2.ended
    assert stopped_after < LONG_TIMEOUT_S / 2, f"rank 0 took {stopped_after:.1f} s to stop"
    assert "saved the last agreed state (step 2)" in rank0.err
    assert runs["int3-rank1"].rc == 3, runs["int3-rank1"].err[-2000:]


@pytest.mark.full
def test_local_peers_are_interrupted_with_their_leader(runs):
    """SIGINT to `train --peers 3`'s own process alone: it passes the interrupt on to its
    local peers before its hub closes. They said `stopped: PeerLost: lost the hub (...
    BrokenPipeError)`, as if something had broken."""
    done = runs["lead_int"]
    assert done.rc == 130, done.err[-2000:]
    lines = done.err.strip().splitlines()
    assert {"rank 1: interrupted", "rank 2: interrupted"} <= set(lines), done.err[-2000:]
    assert lines[-1] == "interrupted" and "PeerLost" not in done.err, done.err[-2000:]
    assert "Traceback" not in done.err


@pytest.mark.full
def test_a_rank_that_cannot_set_the_run_up_stops_the_group_at_once_naming_why(runs):
    """Rank 1 cannot import the custom task (both ranks are given it, as QUICKSTART says:
    the same command on every machine). It said why and left within a second; rank 0
    waited out the setup's 120 s and said only 'Connection closed by peer'."""
    rank0, rank1 = runs["setup"], runs["setup-rank1"]
    assert rank1.rc == 3, rank1.err[-2000:]
    assert "UnknownTaskError: task 'regtask:LinearRegressionTask': cannot import" in rank1.err
    assert rank0.rc == 3, rank0.err[-2000:]
    assert ("error: the group stopped: PeerLost: rank 1 could not take part in the run: "
            "UnknownTaskError: task 'regtask:LinearRegressionTask': cannot import") in rank0.err
    assert "Connection closed" not in rank0.err
    assert rank0.log == []  # no step trained


@pytest.mark.full
def test_restart_after_gloo_death_finishes_with_the_reference_hash(runs, reference):
    resumed = ok(runs["resume_death"])
    assert resumed.hashes == reference.hashes[2:]
    assert resumed.final_hash == reference.final_hash


@pytest.mark.full
def test_periodic_checkpoint_survives_a_crash_and_resumes_exactly(runs, reference):
    crash = runs["crash"]
    assert crash.rc == -9, crash.err[-2000:]  # the fault hook SIGKILLed the leader
    assert crash.hashes == reference.hashes[:2]
    resumed = ok(runs["resume_crash"])
    assert [row["step"] for row in resumed.log] == [3, 4]
    assert resumed.hashes == reference.hashes[2:]
    assert resumed.final_hash == reference.final_hash


def test_the_final_hash_is_the_last_line_a_terminal_shows(tmp_path):
    """stdout and stderr in one terminal: the local peers' status lines (their stderr) came
    after rank 0's hash line, or inside it; rank 0 now waits for them to end first."""
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "pynode", *TRAIN, *QUICK, "--peers", "3", "--no-progress"],
        cwd=repo, env={**os.environ, "PYTHONPATH": str(repo), "OPENBLAS_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout[-2000:]
    assert re.fullmatch("[0-9a-f]{64}", lines[-1]), lines[-4:]
    finished = [i for i, line in enumerate(lines) if re.match(r"rank \d: finished", line)]
    assert len(finished) == 3 and max(finished) < len(lines) - 1
