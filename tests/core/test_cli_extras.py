"""A missing optional dependency, as a user with only the base install meets it: one line
naming the extra to install, exit 2, no traceback.

Each command runs as `python -m ...` in a subprocess whose sitecustomize puts None in
sys.modules for the hidden modules, so `import torch` fails there as on a machine without
torch (and importlib.util.find_spec answers None).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pynode.cli.main import main

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # some ten interpreters, each refusing before any work

HIDE = """
import os, sys
for name in os.environ["HIDE_MODULES"].split(","):
    sys.modules[name] = None
"""
GLOO = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9", "WORLD_SIZE": "2", "RANK": "1"}

# (argv after `python -m`, hidden modules, the line's start, the extra, environment)
CASES = {
    "cluster": (["pynode", "cluster", "--steps", "1"], "torch",
                "cluster (the gloo transport) needs torch", "torch", GLOO),
    "train-float": (["pynode", "train", "--task", "float", "--steps", "1", "--no-progress"],
                    "torch", "task 'float' needs torch", "torch", {}),
    "train-float-peers": (["pynode", "train", "--task", "float", "--steps", "1", "--peers", "2",
                           "--no-progress"], "torch", "task 'float' needs torch", "torch", {}),
    "bench-train": (["pynode", "bench", "train", "--steps", "1"], "torch",
                    "bench train (it compares the int8 GPT with the float task) needs torch",
                    "torch", {}),
    "join": (["pynode", "join", "--server", "http://127.0.0.1:9"], "aiortc,websockets",
             "join needs aiortc and websockets", "webrtc", {}),
    "join-cluster": (["pynode", "join", "--server", "http://127.0.0.1:9", "--cluster"], "torch",
                     "join --cluster (the gloo transport) needs torch", "torch", GLOO),
    "server-flask": (["server", "--port", "0"], "flask", "the server needs flask", "server", {}),
    "server-sock": (["server", "--port", "0"], "flask_sock", "the server needs flask-sock",
                    "server", {}),
    "server-pyarrow": (["server", "--port", "0"], "pyarrow", "the server needs pyarrow",
                       "server", {}),
}


@pytest.fixture(scope="module")
def hide_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hide")
    (folder / "sitecustomize.py").write_text(HIDE)
    return folder


def run_hidden(hide_dir: Path, argv: list[str], hidden: str,
               env: dict) -> subprocess.CompletedProcess:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYNODE_")}
    full = {**inherited, **env, "HIDE_MODULES": hidden,
            "PYTHONPATH": os.pathsep.join([str(hide_dir), str(REPO)])}
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=full,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_missing_extra_is_one_line_naming_it(hide_dir, name):
    argv, hidden, start, extra, env = CASES[name]
    done = run_hidden(hide_dir, argv, hidden, env)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert start in lines[0] and f"pip install 'daisychain[{extra}]'" in lines[0], lines[0]
    assert done.stdout == ""


def test_the_hiding_really_hides(hide_dir):
    """The same commands get further with the modules present: the check is what refused."""
    done = run_hidden(hide_dir, ["pynode", "train", "--task", "float", "--steps", "1",
                                 "--resume", "missing.pt"], "numba", {})
    assert done.returncode == 2 and "missing.pt" in done.stderr and "needs" not in done.stderr


@pytest.mark.parametrize("name,named", [("torch.distributed", True), ("pyarrow.parquet", True),
                                        ("no_such_thing", False)])
def test_an_import_no_check_caught_still_names_the_extra(monkeypatch, capsys, name, named):
    """The safety net of main(): an ImportError of an optional dependency on a path without
    its own check is one line; any other ImportError is a bug and shown whole."""
    import pynode.cli.train

    async def fails(args):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(pynode.cli.train, "train_command", fails)
    if not named:
        with pytest.raises(ModuleNotFoundError):
            main(["train", "--steps", "1"])
        return
    assert main(["train", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: MissingExtraError: `train` needs ") and "daisychain[" in err


def test_a_parquet_data_file_without_pyarrow_names_the_extra(hide_dir, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": ["some words " * 50] * 4}), path)
    done = run_hidden(hide_dir, ["pynode", "train", "--steps", "1", "--no-progress",
                                 "--kernels", "numpy", "--data", str(path)], "pyarrow", {})
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: MissingExtraError: --data {path} (a parquet file) needs pyarrow, not "
        "installed here: pip install 'daisychain[server]'")


def test_a_cluster_rank_says_which_of_its_flags_rank_0_overrides():
    """Rank 1 given --task gpt --steps 99 --resume said only 'following rank 0's run' and
    trained rank 0's run: what it was given went unseen."""
    from pynode.cli.group import ignored_flags_note
    from pynode.cli.main import build_parser, parse_args
    from pynode.config import RunConfig

    cfg = RunConfig(task="mlp", steps=3, lr=0.01)
    args = parse_args(build_parser(), ["cluster", "--task", "gpt", "--steps", "99", "--lr",
                                       "0.01", "--resume", "base.pt", "--kernels", "numpy"])
    assert ignored_flags_note(1, args, cfg) == (
        "rank 1: --task gpt, --steps 99, --resume base.pt ignored: rank 0 chooses the run for "
        "every rank (here task mlp, 3 steps)")  # --lr agrees, --kernels is this rank's own
    same = parse_args(build_parser(), ["cluster", "--task", "mlp", "--kernels", "numpy"])
    assert ignored_flags_note(1, same, cfg) is None
    # every machine given the same --resume (QUICKSTART's restart): rank 0 resumed it
    resumed = parse_args(build_parser(), ["cluster", "--resume", "base.pt"])
    assert ignored_flags_note(1, resumed, cfg, resumed_from=12) is None
    # rank 1's --save and --log wrote nothing, and nothing said so
    outputs = parse_args(build_parser(), ["cluster", "--steps", "99", "--save", "r1.pt",
                                          "--log", "r1.jsonl"])
    assert ignored_flags_note(1, outputs, cfg) == (
        "rank 1: --steps 99 ignored: rank 0 chooses the run for every rank (here task mlp, "
        "3 steps)\nrank 1: --save r1.pt, --log r1.jsonl: only rank 0 writes files, on its "
        "machine; this rank writes none")


def test_a_cluster_rank_says_its_dashboard_is_rank_0s():
    """Rank 1's other overridden flags were named; its --dashboard was dropped silently."""
    from pynode.cli.dashboard import DashboardRun
    from pynode.cli.group import ignored_dashboard_note

    shared = DashboardRun("http://127.0.0.1:8000", "r", "t", "cluster on a", "cluster", 2)
    assert ignored_dashboard_note(1, None, shared) is None
    # the same server, as its browser address or a card's: nothing is ignored
    for same in ("http://127.0.0.1:8000", "http://127.0.0.1:8000/dashboard#run-r"):
        assert ignored_dashboard_note(1, same, shared) is None, same
    assert ignored_dashboard_note(1, "http://10.0.0.9:8000", shared) == (
        "rank 1: --dashboard http://10.0.0.9:8000 ignored: rank 0's --dashboard is the run's "
        "(it reports to http://127.0.0.1:8000)")
    assert ignored_dashboard_note(2, "http://127.0.0.1:8000", None) == (
        "rank 2: --dashboard http://127.0.0.1:8000 ignored: rank 0's --dashboard is the run's "
        "(rank 0 was given none, so this run reports to no dashboard)")


def test_log_lines_go_above_the_progress_bar_not_onto_it(capsys):
    """A native peer's warnings were written straight onto its bar's line
    (`...loss=3.0422]WARNING pynode.comm.webrtc: ...`): log records are report lines now."""
    import logging

    from tqdm import tqdm

    from pynode.cli.report import ReportHandler

    logger = logging.getLogger("pynode.test_report_handler")
    handler = ReportHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        bar = tqdm(total=10, file=sys.stderr, ncols=60, mininterval=0)
        bar.update(3)
        logger.warning("all-reduce #92: retrying")
        bar.close()
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    at = err.index("WARNING pynode.test_report_handler: all-reduce #92: retrying\n")
    assert at > 0 and err[at - 1] in "\r\n", repr(err[max(0, at - 80):at + 10])


def test_a_local_peer_lets_its_groups_ctrl_c_stop_it_before_it_reports_a_lost_hub():
    """A terminal's Ctrl-C reaches every local peer; one whose hub stopped first said
    `stopped: PeerLost: lost the hub (BrokenPipeError)` before its own signal was handled.
    `settle` is the pause in which that signal's cancel reaches the peer's task."""
    import asyncio

    from pynode.cli.signals import settle

    async def lost_hub() -> None:
        task = asyncio.current_task()
        asyncio.get_running_loop().call_later(0.05, task.cancel)  # asyncio's Ctrl-C handler
        await settle()

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(lost_hub())


def test_a_local_peers_status_line_starts_on_a_line_of_its_own(monkeypatch):
    """`train --peers 3`: rank 2's finished line landed on the end of rank 0's progress bar
    (`...loss=3.2449]rank 2: finished (...)`), one run in four."""
    from pynode.cli.group import end_status

    class Terminal:
        def __init__(self):
            self.text = ""

        def write(self, text):
            self.text += text

        def flush(self):
            pass

        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    end_status(None, 2, None, "finished", "", None)
    end_status(None, 0, None, "finished", "", None)
    assert terminal.text == ("\r\x1b[2Krank 2: finished (before the first step)\n"
                             "rank 0: finished (before the first step)\n"), repr(terminal.text)


STAMPED_WARNING = """
import logging, sys
from pynode.cli import main as cli
from pynode.cli.report import name_rank_in_logs

def command(args, argv):
    logging.getLogger("pynode.run").warning("step 31: re-planning lost microbatches [2, 3]")
    name_rank_in_logs(1)
    logging.getLogger("pynode.run").warning("as a rank of a group")
    return 0

cli.run_command = command
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("argv,stamped", [
    (["join", "--server", "http://127.0.0.1:9"], True),
    (["cluster"], True),
    (["train"], False),
])
def test_log_lines_carry_the_time_where_the_commands_own_lines_do(argv, stamped):
    """A join's and a cluster rank's lines carry the time of day (report.say); their log
    records came untimed among them ("WARNING pynode.run: step 31: re-planning ...")."""
    done = subprocess.run([sys.executable, "-c", STAMPED_WARNING, *argv], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = done.stderr.splitlines()
    time = r"\d\d:\d\d:\d\d " if stamped else ""
    assert re.fullmatch(time + r"WARNING pynode.run: step 31: re-planning lost microbatches "
                        r"\[2, 3\]", first), first
    assert re.fullmatch(time + r"rank 1: WARNING pynode.run: as a rank of a group", second), \
        second


SECOND_INTERRUPT = """
import os, signal
from pynode.cli import main as cli

def interrupted(args, argv):  # the terminal's Ctrl-C, in the run
    raise KeyboardInterrupt

cli.run_command = interrupted
code = cli.main(["_peer", "--rank", "1", "--world", "2", "--address", "127.0.0.1:9"])
os.kill(os.getpid(), signal.SIGINT)  # its leader's, passed on as the peer exits
os.kill(os.getpid(), signal.SIGTERM)
print("exit", code)
"""


def test_a_local_peer_that_is_leaving_lets_a_second_interrupt_pass():
    """`train --peers 2` stopped by a terminal's Ctrl-C: each local peer hears it, and its
    leader passes one more on; that second one landed in torch's exit hooks as a
    KeyboardInterrupt traceback (2 of 3 tries in a trial)."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", SECOND_INTERRUPT], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and done.stdout == "exit 130\n", done.stderr[-2000:]
    assert done.stderr == "rank 1: interrupted\n"


def test_a_cluster_ranks_note_of_a_lost_rank_0_reads_without_its_save():
    """Rank 1 given no --save does not know rank 0's: `its --save, if it was given one holds
    ...` read as one garbled clause (a trial)."""
    import argparse

    from pynode.cli.group import leader_lost_note

    note = leader_lost_note(1, argparse.Namespace(save=None))
    assert ("after a Ctrl-C or SIGTERM its --save (if it was given one) holds the last step "
            "every rank agreed on") in note, note


@pytest.mark.parametrize("name", ["gemm", "train", "scaling", "mesh-sim", "browser", "generate"])
def test_each_benchmarks_help_says_what_it_measures_and_its_defaults(name, capsys):
    """`bench train --help` and others had no description and no defaults; gemm's usage
    read `pynode bench gemm` (a trial)."""
    from pynode.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["bench", name, "--help"])
    said = capsys.readouterr().out
    assert done.value.code == 0
    usage, _, rest = said.partition("\n\n")
    assert usage.startswith(f"usage: python -m pynode bench {name} "), said
    assert not rest.startswith("options:"), said  # a description first
    if "--config" in said:
        assert "as inline JSON" in said and "(default: {})" in said, said
