"""gloo transport: ranks as OS processes over real sockets (127.0.0.1, and two namespaces)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from comm_helpers import free_port, oracle_sum, peer_script, run_peers
from netns import private_network

from pynode.comm import CollectiveUsageError, PeerLost, make_collective

pytest.importorskip("torch.distributed")

ROLL_CALL_SLACK_S = 6.0  # process start-up on a loaded machine, the roll call's own polling


def check_exact(records: dict[int, dict], world: int) -> None:
    expected = oracle_sum([peer_script.contribution(r, world, 0) for r in range(world)])
    assert set(records) == set(range(world))
    for record in records.values():
        for rnd in record["rounds"]:
            assert rnd["total"] == expected and rnd["dtype"] == "int64"
            assert rnd["contributors"] == list(range(world))
        assert record["gathered"] == [f"rank{r}" * r for r in range(world)]
        assert record["broadcast"] == "from the last rank"
        assert record["bytes_sent"] > 0 and record["bytes_received"] > 0
    # what the group took from the wire is what it handed to it; in a pair, rank by rank
    assert sum(r["bytes_received"] for r in records.values()) == \
        sum(r["bytes_sent"] for r in records.values())
    if world == 2:
        assert records[0]["bytes_received"] == records[1]["bytes_sent"]
        assert records[1]["bytes_received"] == records[0]["bytes_sent"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    """One 2-rank gloo group on 127.0.0.1 running peer_script's `exact` scenario."""
    out = tmp_path_factory.mktemp("gloo2")
    return run_peers("gloo", 2, f"127.0.0.1:{free_port()}", "exact", out)


def test_two_ranks_on_loopback_sum_exactly(two_ranks: dict[int, dict]) -> None:
    check_exact(two_ranks, 2)


def test_headroom_refused_on_every_rank_before_gloo_wraps(two_ranks: dict[int, dict]) -> None:
    for record in two_ranks.values():
        assert record["first"]["error"] == "FixedPointOverflowError"
        assert record["after"] == [0 + 1, 1 + 1]  # the group is still usable, and exact


@pytest.mark.full  # waits out its timeouts: seconds the quick tier has not
def test_rank_death_raises_peer_lost_in_bounded_time(tmp_path: Path, monkeypatch) -> None:
    timeout = 3.0  # the store calls share it: 2 s was seen to expire under load
    monkeypatch.setenv("PEER_TIMEOUT", str(timeout))
    records = run_peers(
        "gloo", 3, f"127.0.0.1:{free_port()}", "kill", tmp_path, kill_rank=peer_script.VICTIM
    )
    assert set(records) == {0, 1}
    for record in records.values():
        *before, failed = record["rounds"]
        assert len(before) == peer_script.KILL_AT
        for it, rnd in enumerate(before):
            xs = [peer_script.contribution(r, 3, it) for r in range(3)]
            assert rnd["total"] == oracle_sum(xs)
        assert failed["error"] == "PeerLost"
        assert failed["ranks"] == [peer_script.VICTIM]
        # gloo's words without its source file and its advice (users saw both, three times)
        assert "gloo group broken" in failed["message"], failed
        assert ".cc:" not in failed["message"] and "GLHF" not in failed["message"], failed
        assert failed["after_s"] < timeout + ROLL_CALL_SLACK_S


def test_a_pair_whose_other_rank_died_stops_without_waiting_out_the_timeout(
        tmp_path: Path, monkeypatch) -> None:
    """Rank 1 of a pair gone (its connection closed): rank 0 sat out the whole --timeout in
    its roll call, a frozen bar, before it said so."""
    timeout = 30.0
    monkeypatch.setenv("PEER_TIMEOUT", str(timeout))
    monkeypatch.setenv("VICTIM", "1")
    records = run_peers("gloo", 2, f"127.0.0.1:{free_port()}", "kill", tmp_path, kill_rank=1)
    failed = records[0]["rounds"][-1]
    assert failed["error"] == "PeerLost" and failed["ranks"] == [1], failed
    assert failed["after_s"] < timeout / 3, failed


def test_a_rank_waiting_on_rank_0_comes_to_the_roll_call_when_another_is_gone(
        tmp_path: Path, monkeypatch) -> None:
    """Rank 2 closed (a Ctrl-C) and ranks 0 and 1 came to the next all-reduce a second
    apart. One of them met the loss and went to its roll call; the other waited inside gloo
    on that one, not on rank 2, for the whole --timeout, and was named lost too when the
    roll call's own --timeout ran out (`lost [1, 2]`, CI on a loaded machine). A rank hangs
    up once it has checked in, which wakes the other."""
    timeout = 30.0
    monkeypatch.setenv("PEER_TIMEOUT", str(timeout))
    records = run_peers("gloo", 3, f"127.0.0.1:{free_port()}", "late", tmp_path, kill_rank=2)
    for rank, failed in records.items():
        assert failed["error"] == "PeerLost" and failed["ranks"] == [2], (rank, failed)
        assert failed["after_s"] < timeout / 3, (rank, failed)


def test_ranks_in_two_network_namespaces(tmp_path: Path) -> None:
    with private_network() as net:
        side = {0: "a", 1: "b"}
        records = run_peers(
            "gloo",
            2,
            f"{net.address['a']}:29500",
            "exact",
            tmp_path,
            wrap=lambda rank: net.command(side[rank], []),
            env=lambda rank: {"GLOO_SOCKET_IFNAME": net.ifname[side[rank]]},
        )
        check_exact(records, 2)
    assert not net.exists()


def test_missing_settings_are_named(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(CollectiveUsageError, match="gloo needs WORLD_SIZE: set the "
                       "environment variables MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK"):
        asyncio.run(make_collective("gloo"))
    with pytest.raises(CollectiveUsageError, match="MASTER_PORT"):
        asyncio.run(
            make_collective("gloo", rank=0, world_size=2, master_addr="127.0.0.1", master_port=0)
        )


@pytest.mark.parametrize("rank", [0, 1])
def test_a_master_addr_that_does_not_resolve_is_named_at_once(rank) -> None:
    """Rank 0, which hosts the store, took --timeout and printed C++ stack frames, then
    said only that the store timed out; rank 1 retried until its timeout too."""
    import time

    started = time.monotonic()
    with pytest.raises(CollectiveUsageError,
                       match=r"MASTER_ADDR 'no.such.host.invalid' does not resolve"):
        asyncio.run(make_collective("gloo", rank=rank, world_size=2,
                                    master_addr="no.such.host.invalid",
                                    master_port=free_port(), timeout=30.0))
    assert time.monotonic() - started < 15.0  # a lookup, not the 30 s timeout


def test_nobody_else_joins_peer_lost_names_them() -> None:
    """... and says what starts them (it ended at "did not join", no next step)."""
    port = free_port()
    with pytest.raises(PeerLost) as lost:
        asyncio.run(
            make_collective(
                "gloo",
                rank=0,
                world_size=3,
                master_addr="127.0.0.1",
                master_port=port,
                timeout=1.0,
            )
        )
    assert lost.value.ranks == (1, 2)
    assert str(lost.value).endswith(
        "rank 1, 2 of 3 did not join: start each with its RANK and this MASTER_ADDR, "
        f"MASTER_PORT and WORLD_SIZE (ranks on other machines must reach 127.0.0.1:{port}), "
        "or allow more time with --timeout"), str(lost.value)


def test_a_rank_whose_rank0_never_comes_gives_up_after_timeout_once() -> None:
    """TCPStore's own client retries for about twice its timeout; connect waits for the
    port itself and stops at --timeout, naming rank 0."""
    import time

    # long enough that once (~timeout) and twice (~2 x timeout) stay apart by more than a
    # loaded machine's start-up overhead
    timeout = 4.0
    started = time.monotonic()
    with pytest.raises(PeerLost) as lost:
        asyncio.run(make_collective("gloo", rank=1, world_size=2, master_addr="127.0.0.1",
                                    master_port=free_port(), timeout=timeout))
    took = time.monotonic() - started
    assert timeout - 0.5 < took < timeout + 3.0, took
    assert lost.value.ranks == (0,)
    assert "rank 0 did not come" in str(lost.value)


def test_cluster_without_rank0_says_so_in_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYNODE_")},
           "PYTHONPATH": str(repo), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": "2", "RANK": "1"}
    env.pop("TORCH_CPP_LOG_LEVEL", None)
    done = subprocess.run([sys.executable, "-m", "pynode", "cluster", "--timeout", "1"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1, done.stderr[-3000:]
    assert done.stderr.startswith("error: PeerLost: rank 0 did not come: nothing answered at "
                                  "127.0.0.1:"), done.stderr
    assert "within 1 s" in done.stderr


def test_ranks_given_different_world_sizes_say_so_at_once(tmp_path: Path) -> None:
    """Rank 0 given WORLD_SIZE 2 and rank 1 given 3: rank 0 timed out on gloo's own keys
    ("keys: /daisychain//0/pg/0/1") and rank 1 waited for a rank 2 nobody started, neither
    naming the cause. Each now names it, long before --timeout."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    base = {**{k: v for k, v in os.environ.items() if not k.startswith("PYNODE_")},
            "PYTHONPATH": str(repo), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    started = time.monotonic()
    ranks = [subprocess.Popen([sys.executable, "-m", "pynode", "cluster", "--timeout", "60"],
                              cwd=repo, env={**base, "RANK": str(rank), "WORLD_SIZE": size},
                              stderr=subprocess.PIPE, text=True)
             for rank, size in ((0, "2"), (1, "3"))]
    errs = [proc.communicate(timeout=120)[1] for proc in ranks]
    assert time.monotonic() - started < 40, errs  # not the 60 s of --timeout
    assert [proc.returncode for proc in ranks] == [2, 2], errs
    assert errs[0].endswith("error: CollectiveUsageError: rank 1 was started with WORLD_SIZE 3, "
                            "this rank (0) with 2: give every rank of the cluster the same "
                            "WORLD_SIZE\n"), errs
    assert errs[1].endswith("error: CollectiveUsageError: rank 0 was started with WORLD_SIZE 2, "
                            "this rank (1) with 3: give every rank of the cluster the same "
                            "WORLD_SIZE\n"), errs


def test_a_rank_waiting_for_its_group_says_so(tmp_path: Path) -> None:
    """A rank whose group has not formed within a few seconds says what it waits for: both
    ranks of a cluster said nothing for up to --timeout (60 s), which read as a hang."""
    import os
    import re
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYNODE_")},
           "PYTHONPATH": str(repo), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "WORLD_SIZE": "2", "RANK": "1"}
    done = subprocess.run([sys.executable, "-m", "pynode", "cluster", "--timeout", "5"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 2, done.stderr[-3000:]
    assert re.fullmatch(rf"\d\d:\d\d:\d\d rank 1 of 2: waiting for the other ranks at "
                        rf"127\.0\.0\.1:{port} \(up to 5 s, --timeout\)", lines[0]), lines
    assert lines[1].startswith("error: PeerLost: rank 0 did not come"), lines


def test_a_rank_whose_master_port_is_another_programs_exits_with_its_error(
        tmp_path: Path) -> None:
    """MASTER_PORT pointing at another program (the DaisyChain server's own port, a natural
    slip): the rank said its named error, then, as that program closed the connection while
    the interpreter shut down, the store's C++ thread woke and the process aborted (exit
    134, a C++ stack trace, "terminate called without an active exception"). Here the
    program closes its connections as soon as the error line is out."""
    import os
    import socket
    import subprocess
    import sys
    import threading

    repo = Path(__file__).resolve().parents[2]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYNODE_")},
           "PYTHONPATH": str(repo), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(listener.getsockname()[1]), "WORLD_SIZE": "2", "RANK": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "pynode", "cluster", "--timeout", "1"],
                            cwd=repo, env=env, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "no gloo store within" in line:
                for connection in held:
                    connection.close()
        proc.wait(timeout=120)
    finally:
        listener.close()
        if proc.poll() is None:
            proc.kill()
    err = "".join(lines)
    assert proc.returncode == 2, err[-3000:]
    assert err == (f"error: PeerLost: 127.0.0.1:{env['MASTER_PORT']} answered, but no gloo "
                   "store within 1 s: is another program listening on MASTER_PORT?\n"), err


class StoreThatCloses:
    """A store in which ranks 0 and 1 checked in; it goes away after `polls` checks (rank 0,
    its host, done with its own roll call, exited)."""

    def __init__(self, polls: int, present: set[str]) -> None:
        self.polls, self.present = polls, present

    def set(self, key: str, value: bytes) -> None:
        self.present.add(key)

    def check(self, keys: list[str]) -> bool:
        if self.polls <= 0:
            raise RuntimeError("Connection reset by peer")
        self.polls -= 1
        return all(k in self.present for k in keys)


def test_roll_call_after_rank0_left_names_who_was_missing_not_rank0() -> None:
    from pynode.comm.gloo import roll_call

    seen_rank0 = StoreThatCloses(polls=3, present={"rc/0"})  # one full poll of 3 ranks
    assert roll_call(seen_rank0, "rc/", 1, 3, timeout=5.0) == (2,)
    never_seen = StoreThatCloses(polls=0, present={"rc/0"})  # gone before any poll
    assert roll_call(never_seen, "rc/", 1, 3, timeout=5.0) == (0,)
    rank0_absent = StoreThatCloses(polls=3, present=set())  # rank 0 never checked in
    assert roll_call(rank0_absent, "rc/", 1, 3, timeout=5.0) == (0,)


def test_roll_call_does_not_wait_for_a_rank_that_said_it_left() -> None:
    """Rank 2 closed its collective (its Ctrl-C) and left its mark: the roll call names it
    at once. A rank that left no mark (a crash) is waited for, up to the timeout."""
    from pynode.comm.gloo import roll_call

    store = StoreThatCloses(polls=1000, present={"rc/0", "left/2"})
    started = time.monotonic()
    assert roll_call(store, "rc/", 1, 3, timeout=30.0, left="left/") == (2,)
    assert time.monotonic() - started < 5
    crashed = StoreThatCloses(polls=1000, present={"rc/0"})
    started = time.monotonic()
    assert roll_call(crashed, "rc/", 1, 3, timeout=0.5, left="left/") == (2,)
    assert time.monotonic() - started >= 0.5


def test_gloos_message_is_told_plainly() -> None:
    from pynode.comm.gloo import plain_reason

    said = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
            "closed by peer [127.0.0.1]:7045. This is typically caused by a remote worker "
            "crashing. Check the logs of the remote worker before reporting an error. GLHF!")
    assert plain_reason(said) == "Connection closed by peer [127.0.0.1]:7045."
    assert plain_reason("Timed out waiting 10 s") == "Timed out waiting 10 s"


def test_a_master_port_held_by_another_program_is_named_in_bounded_time() -> None:
    """Rank 1 whose MASTER_PORT answered but was no gloo store (a web server there) waited
    on it for 10 minutes with --timeout 5; rank 0 on a port in use said `PeerLost: no gloo
    store ... within 5 s` after 1.4 s."""
    import socket
    import threading
    import time

    from pynode.comm import CommError

    held: list[socket.socket] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def accept_and_keep() -> None:  # reads nothing, answers nothing, as a web server waits
        try:
            while True:
                held.append(listener.accept()[0])
        except OSError:
            return

    threading.Thread(target=accept_and_keep, daemon=True).start()
    try:
        timeout = 2.0
        started = time.monotonic()
        with pytest.raises(PeerLost) as lost:
            asyncio.run(make_collective("gloo", rank=1, world_size=2, master_addr="127.0.0.1",
                                        master_port=port, timeout=timeout))
        took = time.monotonic() - started
        assert took < timeout + 5.0 + ROLL_CALL_SLACK_S, took
        assert lost.value.ranks == (0,)
        assert "answered, but no gloo store within 2 s: is another program listening on " \
            "MASTER_PORT?" in str(lost.value), str(lost.value)
        in_use = f"MASTER_PORT {port} is in use on this machine .*another rank 0: is this"
        with pytest.raises(CommError, match=in_use):
            asyncio.run(make_collective("gloo", rank=0, world_size=2, master_addr="127.0.0.1",
                                        master_port=port, timeout=timeout))
    finally:
        listener.close()
        for conn in held:
            conn.close()


def test_a_cluster_environment_that_cannot_be_is_named_by_its_variables(monkeypatch):
    """WORLD_SIZE=0 read "world_size must be ...", RANK=2 of two "rank 2 is outside 0..1":
    neither named what a user sets."""
    from pynode.comm import gloo

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    for size, rank, said in (("0", "0", "WORLD_SIZE must be a positive int, got 0"),
                             ("2", "2", "RANK 2 is outside 0..1 (WORLD_SIZE 2): give each "
                                        "process of the cluster its own RANK")):
        monkeypatch.setenv("WORLD_SIZE", size)
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(CollectiveUsageError, match=said.replace("(", r"\(").replace(
                ")", r"\)").replace(".", r"\.")):
            asyncio.run(gloo.connect(timeout=5))
