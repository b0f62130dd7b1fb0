"""`python -m pynode train` and `verify` as a user runs them, in subprocesses.

The independent runs start together in one module fixture (each is a separate interpreter
on a 2-core machine) and the tests read their results. Hashes are compared exactly: the
last stdout line of `train` is the final state hash, --log holds one JSON row per step.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the run harness
from pynode_runs import ONE_THREAD, REPO, Done, Launched  # noqa: E402

from pynode.core.checkpoint import load_checkpoint  # noqa: E402
from pynode.unitfiles import SHIPPED_DIR  # noqa: E402

# All but one test read `runs`: some 20 interpreters on 2 cores, tens of seconds.
pytestmark = pytest.mark.slow

# A small model: the default one's start-up tuning and steps cost seconds per run here
# (test_gemm_tuning covers the tuned runs).
SMALL = ["--width", "64", "--layers", "1", "--seq", "32"]
TRAIN = ["train", "--steps", "3", "--seed", "1", "--no-progress", *SMALL]


def simd_off_env() -> dict[str, str]:
    """NPY_DISABLE_CPU_FEATURES naming every SIMD target this numpy dispatches to."""
    from numpy._core import _multiarray_umath

    targets = " ".join(_multiarray_umath.__cpu_dispatch__)
    if not targets:
        pytest.skip("this numpy build dispatches no SIMD targets")
    return {"NPY_DISABLE_CPU_FEATURES": targets}


def corrupted_units(folder: Path) -> Path:
    copy = folder / "units-corrupt"
    shutil.copytree(SHIPPED_DIR, copy)
    blob = bytearray((copy / "mul8.npz").read_bytes())
    blob[len(blob) // 2] ^= 0x04
    (copy / "mul8.npz").write_bytes(bytes(blob))
    return copy


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every independent run at once; the resume of `first2`'s checkpoint once it exists."""
    folder = tmp_path_factory.mktemp("cli")
    bad_units = {"PYNODE_UNITS_DIR": str(corrupted_units(folder))}
    plans = {
        "ref": (TRAIN + ["--save", str(folder / "ref.pt")], None),
        "again": (TRAIN, dict.fromkeys(ONE_THREAD)),
        "simd_off": (TRAIN, simd_off_env()),
        "numpy_int": (TRAIN + ["--backend", "numpy_int"], None),
        "first2": (["train", "--steps", "2", "--seed", "1", "--no-progress", *SMALL,
                    "--save", str(folder / "step2.pt")], None),
        "mlp_env": (TRAIN, {"PYNODE_TASK": "mlp"}),
        "mlp_flag": (TRAIN + ["--task", "mlp"], None),
        "unknown_task": (TRAIN + ["--task", "gtp"], None),
        "unknown_env": (TRAIN, {"PYNODE_TASK": "gtp"}),
        "verify": (["verify"], None),
        "verify_bad": (["verify"], bad_units),
        "train_bad_units": (TRAIN, bad_units),
    }
    refusals = bad_checkpoint_plans(folder)
    plans.update({name: (args, None) for name, (args, *_) in refusals.items()})
    started = {name: Launched(folder, name, args, env) for name, (args, env) in plans.items()}
    done: dict = {"first2": started.pop("first2").wait()}
    started["resumed"] = Launched(folder, "resumed", ["train", "--resume",
                                  str(folder / "step2.pt"), "--steps", "3", "--no-progress"])
    done.update({name: proc.wait() for name, proc in started.items()})
    done["folder"] = folder
    done["refused"] = {name: (done[name], *rest) for name, (_, *rest) in refusals.items()}
    return done


def ok(done: Done) -> Done:
    assert done.rc == 0, done.err[-3000:]
    return done


# --- same bits -------------------------------------------------------------------------------

def test_train_prints_the_final_hash_and_logs_every_step(runs):
    ref = ok(runs["ref"])
    assert [row["step"] for row in ref.log] == [1, 2, 3]
    assert len(set(ref.hashes)) == 3 and all(len(h) == 64 for h in ref.hashes)
    assert ref.final_hash == ref.hashes[-1]
    assert all(np.isfinite(row["loss"]) for row in ref.log)
    assert "unit invocations: mul" in ref.err
    # where its state went, as a stop says it (a finished run said nothing)
    assert f"saved the state (step 3) to {runs['folder'] / 'ref.pt'}" in ref.err


@pytest.mark.parametrize("name", ["again", "simd_off", "numpy_int"])
def test_train_twice_without_simd_or_on_another_backend_gives_the_same_hashes(runs, name):
    ref, other = ok(runs["ref"]), ok(runs[name])
    assert other.hashes == ref.hashes
    assert other.final_hash == ref.final_hash


def test_numpy_int_run_really_used_numpy_int(runs):
    assert "backend numpy_int" in ok(runs["numpy_int"]).err
    assert "backend numpy_int" not in ok(runs["ref"]).err


def test_simd_is_really_off_under_that_environment():
    check = (
        "from numpy._core import _multiarray_umath as m\n"
        "print([t for t in m.__cpu_dispatch__ if m.__cpu_features__.get(t)])\n"
    )
    env = {**os.environ, **simd_off_env()}
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


# --- checkpoints -----------------------------------------------------------------------------

def test_saved_checkpoint_is_read_by_torch_weights_only(runs):
    torch = pytest.importorskip("torch")
    ref = ok(runs["ref"])
    obj = torch.load(runs["folder"] / "ref.pt", weights_only=True)
    assert obj["magic"] == "DAISYCHAIN-CKPT" and obj["step"] == 3
    assert obj["state_hash"] == ref.final_hash
    assert obj["config"]["seed"] == 1 and obj["task"] == "gpt"
    ours = load_checkpoint((runs["folder"] / "ref.pt").read_bytes())
    for name, tensor in obj["params"].items():
        assert tensor.dtype == torch.float32
        assert np.array_equal(tensor.numpy().view(np.uint32), ours.params[name].view(np.uint32))


def test_resume_continues_bit_identically(runs):
    ref, first, resumed = ok(runs["ref"]), ok(runs["first2"]), ok(runs["resumed"])
    # Steps 1-2 are inside the 10-step warm-up, whose learning rate does not depend on the
    # run length: a 2-step run is the prefix of a 3-step run.
    assert first.hashes == ref.hashes[:2]
    assert "from step 2" in resumed.err
    # its first line names the checkpoint (the header's "from step 2" alone did not)
    checkpoint = runs["folder"] / "step2.pt"
    assert resumed.err.startswith(f"resuming {checkpoint}: step 2 of 3, state hash "
                                  f"{ref.hashes[1][:16]}\n"), resumed.err[:300]
    assert [row["step"] for row in resumed.log] == [3]
    assert resumed.hashes == ref.hashes[2:]
    assert resumed.final_hash == ref.final_hash


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def flipped(data: bytes) -> bytes:
    blob = bytearray(data)
    blob[len(blob) // 2] ^= 0x10
    return bytes(blob)


def edited(data: bytes) -> bytes:
    """One weight bit changed and the archive written again as pynode writes it, with fresh
    CRCs: only the hash can tell."""
    from pynode.core.ptzip import write_stored

    source, records = zipfile.ZipFile(io.BytesIO(data)), []
    for info in source.infolist():
        blob = source.read(info.filename)
        if info.filename == "archive/data/0":
            blob = bytes([blob[0] ^ 0x01]) + blob[1:]
        records.append((info.filename, blob))
    return write_stored(records)


BAD_CHECKPOINTS = {
    "flipped": (flipped, [], "CheckpointError: .*damaged"),
    "truncated": (lambda d: d[: len(d) // 2], [], "CheckpointError: .*damaged"),
    "header": (lambda d: b"PK\x03\x04junk" + d[10:], [], "CheckpointError"),
    "empty": (lambda d: b"", [], "CheckpointError"),
    "narrower": (lambda d: d, ["--width", "32"], r"'wte' has shape \(256, 64\), .*\(256, 32\)"),
    "other_task": (lambda d: d, ["--task", "mlp"], "task 'gpt', expected 'mlp'"),
    "edited": (edited, [], "state hash mismatch"),
}


def initial_checkpoint() -> bytes:
    """A valid step-0 checkpoint of the default GPT (no units needed to build it)."""
    from pynode.config import RunConfig
    from pynode.run.trainer import Trainer
    from pynode.tasks.gpt import GPTTask

    return Trainer(RunConfig(steps=3, seed=1), GPTTask(), None).state_bytes()


def bad_checkpoint_plans(folder: Path) -> dict[str, tuple[list[str], Path, Path, str, str]]:
    """name -> (argv, checkpoint, --save target, their sha256 before the run)."""
    good = initial_checkpoint()
    plans = {}
    for name, (corrupt, extra, _) in BAD_CHECKPOINTS.items():
        ckpt, target = folder / f"bad-{name}.pt", folder / f"target-{name}.pt"
        ckpt.write_bytes(corrupt(good))
        target.write_bytes(b"")  # a file the refused run must not write into
        args = ["train", "--resume", str(ckpt), "--steps", "4", "--save", str(target), *extra]
        plans[f"refuse-{name}"] = (args, ckpt, target, sha256(ckpt), sha256(target))
    ckpt, fresh = folder / "bad-flipped.pt", folder / "never-written.pt"
    args = ["train", "--resume", str(ckpt), "--save", str(fresh), "--no-progress"]
    plans["refuse-no-target"] = (args, ckpt, fresh, sha256(ckpt), "")
    return plans


@pytest.mark.parametrize("name", sorted(BAD_CHECKPOINTS))
def test_bad_checkpoint_is_refused_and_files_untouched(runs, name):
    done, ckpt, target, ckpt_sha, target_sha = runs["refused"][f"refuse-{name}"]
    assert done.rc == 2, done.err[-2000:]
    assert re.search(BAD_CHECKPOINTS[name][2], done.err), done.err
    assert "Traceback" not in done.err
    assert done.log == [] and done.out == ""
    assert sha256(ckpt) == ckpt_sha
    assert sha256(target) == target_sha


def test_refused_resume_creates_no_save_file(runs):
    done, _, target, _, _ = runs["refused"]["refuse-no-target"]
    assert done.rc == 2 and "CheckpointError" in done.err
    assert not target.exists()


# --- tasks -----------------------------------------------------------------------------------

def test_unknown_task_exits_2_listing_the_tasks(runs):
    for name in ("unknown_task", "unknown_env"):
        done = runs[name]
        assert done.rc == 2, done.err
        assert "UnknownTaskError" in done.err and "'gtp'" in done.err
        assert "float, gpt, mlp" in done.err
        assert "Traceback" not in done.err and done.log == []


def test_pynode_task_env_selects_the_task(runs):
    env, flag, gpt = ok(runs["mlp_env"]), ok(runs["mlp_flag"]), ok(runs["ref"])
    assert "task mlp" in env.err
    assert env.hashes == flag.hashes and env.final_hash == flag.final_hash
    assert env.final_hash != gpt.final_hash


# --- verify ----------------------------------------------------------------------------------

def test_verify_passes_and_prints_the_table(runs):
    done = ok(runs["verify"])
    lines = done.out.splitlines()
    assert lines[0].split() == ["check", "domain", "result", "backend", "time"]
    for row in ("unit mul8", "unit requant16", "unit relu8", "LUT == integer op"):
        assert any(line.startswith(row) and " pass " in line for line in lines), row
    assert sum("exact gate" in line for line in lines) >= 2
    assert "verify passed" in done.out


def test_verify_fails_on_a_corrupted_unit_weight_file(runs):
    done = runs["verify_bad"]
    assert done.rc == 1, done.out + done.err
    assert "mul8.npz is corrupted" in done.out
    assert "verify FAILED" in done.out and "must not train" in done.out


def test_train_refuses_corrupted_unit_weights(runs):
    done = runs["train_bad_units"]
    assert done.rc == 2, done.err
    assert "UnitVerificationError" in done.err and "mul8.npz is corrupted" in done.err
    assert done.log == []


# --- interrupted ------------------------------------------------------------------------------

@pytest.mark.parametrize(("signum", "rc", "said", "background"), [
    (signal.SIGINT, 130, "interrupted", False), (signal.SIGTERM, 143, "terminated", False),
    (signal.SIGTERM, 143, "terminated", True)])
def test_ctrl_c_stops_a_run_between_steps_and_saves_the_last_agreed_step(tmp_path, signum,
                                                                         rc, said, background):
    """SIGINT (a terminal's Ctrl-C) stops a one-peer run at the next step boundary, exit
    130, with --save holding the last step it logged: it used to train on to the last step
    (a one-peer step never yields to the event loop that takes the signal) and say
    "interrupted" only then, or leave the last --save-every checkpoint behind. SIGTERM
    (kill, timeout, docker stop) does the same, exit 143: it used to end the process at
    once, silent, with no --save written. So does a background job of a script, whose
    SIGINT is ignored (asyncio then has no Ctrl-C handler to hand SIGTERM to: a
    KeyboardInterrupt raised inside a task was logged as "Task exception was never
    retrieved" with its traceback)."""
    saved = tmp_path / "c.pt"
    run = Launched(tmp_path, "long", ["train", "--steps", "20000", "--seed", "1", *SMALL,
                                      "--no-progress", "--save", str(saved),
                                      "--save-every", "10000"], ignore_sigint=background)
    for _ in range(1200):  # start-up (the gates) takes seconds
        if run.log.exists() and len(run.log.read_text().splitlines()) >= 3:
            break
        if run.proc.poll() is not None:
            break
        time.sleep(0.1)
    os.kill(run.proc.pid, signum)
    done = run.wait(120)
    steps = len(done.log)
    assert done.rc == rc and done.err.rstrip().endswith(said), done.err[-2000:]
    assert "Traceback" not in done.err and "never retrieved" not in done.err, done.err[-2000:]
    assert 3 <= steps < 20000, steps
    assert f"saved the last agreed state (step {steps}) to {saved}" in done.err
    state = load_checkpoint(saved.read_bytes())
    assert (state.step, state.state_hash) == (steps, done.log[-1]["hash"])


@pytest.mark.parametrize("delay", [0.1, 0.2])
def test_ctrl_c_while_the_command_line_loads_says_interrupted_without_a_traceback(delay):
    """A Ctrl-C in the first ~0.3 s, while `python -m pynode` imports its modules or parses
    its flags, ends the command as one later does: "interrupted", exit 130. It printed a
    traceback through the imports and ended by the signal."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pynode", "train", "--steps", "1", "--no-progress"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **ONE_THREAD},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err[-2000:]
    # 130, or the SIGINT itself (a shell reports 130 for both): where the interrupt met code
    # that an extension module runs through PyRun_String, CPython notes it as unhandled and
    # ends the process by SIGINT after our exit, whatever it exits with (3 in 40 tries)
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, err[-2000:])
    assert err.rstrip().endswith("interrupted"), err[-2000:]


# A command whose second task is running when SIGTERM comes, in a background job of a
# script (SIGINT ignored): pynode.cli.signals.run cancels the command's task instead.
SIGTERM_IN_A_SIDE_TASK = """
import asyncio, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
from pynode.cli import signals

async def side():
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
    try:
        for _ in range(200_000):  # the handler runs here, in this task
            pass
        await asyncio.sleep(30)
    except BaseException as exc:
        print("the side task:", type(exc).__name__, flush=True)
        raise

async def command():
    task = asyncio.ensure_future(side())
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        print("the command's task was cancelled", flush=True)
        task.cancel()
        raise
    return 0

with signals.sigterm_as_interrupt():
    try:
        signals.run(command())
    except KeyboardInterrupt:
        print("KeyboardInterrupt", signals.terminated() == signal.SIGTERM, flush=True)
        sys.exit(143)
"""


def test_sigterm_with_sigint_ignored_cancels_the_commands_task():
    """Not a KeyboardInterrupt raised in whatever task runs (a peer's network task: logged
    as "Task exception was never retrieved", its work cut mid-way): the command's task is
    cancelled, and it ends its own tasks, as on Ctrl-C."""
    done = subprocess.run([sys.executable, "-c", SIGTERM_IN_A_SIDE_TASK], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 143, (done.stdout, done.stderr)
    assert done.stdout.splitlines() == ["the command's task was cancelled",
                                        "the side task: CancelledError",
                                        "KeyboardInterrupt True"], done.stdout
    assert done.stderr == "", done.stderr


# Two Ctrl-C: the first cancels the command's task (asyncio.run's handler), the second
# lands while another task runs, which asyncio.run's handler raises KeyboardInterrupt in.
DOUBLE_CTRL_C = """
import asyncio, gc, os, signal
signal.signal(signal.SIGINT, signal.default_int_handler)
from pynode.cli import signals
kept = []

async def side():
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)  # its clean-up is under way
    await asyncio.sleep(30)

async def command():
    kept.append(asyncio.ensure_future(side()))  # a RoomPeer holds its run's task
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        await asyncio.shield(asyncio.sleep(1))
        raise

try:
    signals.run(command())
except KeyboardInterrupt:
    print("interrupted", flush=True)
kept.clear()
gc.collect()
"""


def test_a_second_ctrl_c_in_another_task_prints_no_traceback():
    """A `join` leader's double Ctrl-C: its state was saved and it said interrupted, then
    ~60 lines of "Task exception was never retrieved" for RoomPeer.train's task, which
    the second Ctrl-C's KeyboardInterrupt was raised in."""
    done = subprocess.run([sys.executable, "-c", DOUBLE_CTRL_C], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.splitlines() == ["interrupted"], (done.stdout, done.stderr)
    assert done.stderr == "", done.stderr


# A Ctrl-C that comes while asyncio makes the command's loop (its selector, here).
CTRL_C_AS_THE_LOOP_IS_MADE = """
import asyncio, gc, os, selectors, signal
signal.signal(signal.SIGINT, signal.default_int_handler)
from pynode.cli import signals
made = selectors.DefaultSelector

def interrupted_selector():
    os.kill(os.getpid(), signal.SIGINT)
    return made()

selectors.DefaultSelector = interrupted_selector

async def command():
    return "ran"

try:
    print(signals.run(command()), flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
gc.collect()
"""


def test_a_ctrl_c_while_the_loop_is_made_prints_no_traceback():
    """CI's Ctrl-C test met asyncio.run making its loop (1 in ~40 tries): "interrupted",
    then the half-made loop's __del__ printed "'_UnixSelectorEventLoop' object has no
    attribute '_signal_handlers'" with its traceback. The loop is now made whole first."""
    done = subprocess.run([sys.executable, "-c", CTRL_C_AS_THE_LOOP_IS_MADE], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.splitlines() == ["interrupted"], (done.stdout, done.stderr)
    assert done.stderr == "", done.stderr


# --- processes sharing one terminal -----------------------------------------------------------

# After main() (here a command it refuses), the writer waits for the go file, then writes
# ranked lines to its stderr: one by print, two at a time by echo (the run header's way).
SHARED_STDERR_WRITER = """
import os, sys, time
from pynode.cli.main import main
from pynode.cli.report import echo
main(["generate", "--checkpoint", "no-such.pt", "--prompt", "a"])
while not os.path.exists("go"):
    time.sleep(0.001)
line = f"rank {sys.argv[1]}: " + "x" * 60
for _ in range(1500):
    print(line, file=sys.stderr)
    echo(line + "\\n" + line)
"""


def test_processes_sharing_one_stderr_write_whole_lines(tmp_path):
    """The local peers of `train --peers` share their parent's stderr. Unbuffered
    (PYTHONUNBUFFERED=1, as containers and CI often run Python), stderr wrote print's text
    and its newline apart, and two peers' status lines came out spliced: "rank 1: ...rank
    2: ..." over an empty line."""
    read, write = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    writers = [subprocess.Popen([sys.executable, "-c", SHARED_STDERR_WRITER, str(rank)],
                                cwd=tmp_path, stderr=write, env=env) for rank in (1, 2)]
    os.close(write)
    time.sleep(0.5)  # both started: they write at once
    (tmp_path / "go").touch()
    with os.fdopen(read) as shared:
        lines = shared.read().splitlines()
    assert [writer.wait(60) for writer in writers] == [0, 0]
    ranked = [line for line in lines if not line.startswith("error: ")]
    spliced = [line for line in ranked if not re.fullmatch("rank [12]: x{60}", line)]
    assert len(ranked) == 9000 and spliced == [], spliced[:3]
