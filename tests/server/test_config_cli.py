"""Config, client addresses, resume tokens, rate buckets and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from server.__main__ import config_from_args, local_shard_problem, main, parse_args
from server.addresses import address_group, client_address
from server.config import ServerConfig, ServerConfigError
from server.ratelimit import LinesPerKey, TokenBucket
from server.tokens import SecretError, TokenSigner, load_secret

REPO = Path(__file__).resolve().parents[2]


def test_config_from_dict_coerces_and_refuses() -> None:
    cfg = ServerConfig.from_dict({"port": 0, "data_dir": "state", "data_urls": "a.parquet"})
    assert cfg.data_dir == Path("state") and cfg.data_urls == ("a.parquet",)
    assert cfg.to_dict()["secret"] is None
    assert ServerConfig(secret="s" * 20).to_dict()["secret"] == "<set>"
    assert ServerConfig.from_dict({"allowed_origins": "https://a.example"}).allowed_origins \
        == ("https://a.example",)
    for bad in ({"prot": 1}, {"port": 70000}, {"rate_per_s": 0}, {"rate_burst": True},
                {"max_frame_bytes": 10}, {"data_urls": []}, {"trust_proxy_header": " "},
                {"allowed_origins": ["a.example"]}, {"allowed_origins": ["https://a/b"]},
                {"max_ws_per_address": 0}, {"header_timeout_s": -1},
                {"max_connections": -1}, {"rate_per_s": float("inf")},
                {"bytes_per_s": float("nan")}, {"rate_per_s": 10**400}):  # no OverflowError
        with pytest.raises(ServerConfigError):
            ServerConfig.from_dict(bad)


def test_cli_arguments_override_the_config_file(tmp_path: Path) -> None:
    file = tmp_path / "server.json"
    file.write_text(json.dumps({"port": 9000, "host": "0.0.0.0", "rate_per_s": 5}))
    values = config_from_args(parse_args(["--config", str(file), "--port", "9100",
                                          "--trust-proxy-header", "X-Forwarded-For",
                                          "--allowed-origin", "https://a.example",
                                          "--allowed-origin", "https://b.example"]))
    assert values == {"port": 9100, "host": "0.0.0.0", "rate_per_s": 5,
                      "trust_proxy_header": "X-Forwarded-For",
                      "allowed_origins": ["https://a.example", "https://b.example"]}
    # Refused before gevent is imported: main() in this process must not monkey-patch it.
    assert main(["--port", "-5", "--data-dir", str(tmp_path)]) == 2
    assert main(["--config", str(tmp_path / "missing.json")]) == 2
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    assert main(["--config", str(listed)]) == 2  # was a traceback (a list has no .update)
    assert "gevent.monkey" not in sys.modules or not _patched()


def test_a_broken_config_file_and_a_bad_log_level_are_one_named_line(tmp_path: Path,
                                                                       capsys) -> None:
    """They were a JSON error naming no file, and a ValueError traceback from logging."""
    broken = tmp_path / "server.json"
    broken.write_text("{port: 1}")
    assert main(["--config", str(broken)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --config {broken}: not JSON (")
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--log-level", "bogus"])
    assert stopped.value.code == 2 and "invalid choice: 'BOGUS'" in capsys.readouterr().err
    assert parse_args(["--log-level", "warning"]).log_level == "WARNING"


def _patched() -> bool:
    from gevent import monkey

    return monkey.is_module_patched("socket")


def test_without_gevent_python_m_server_names_the_extra(tmp_path: Path) -> None:
    blocker = tmp_path / "gevent"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('gevent is not installed')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    done = subprocess.run([sys.executable, "-m", "server", "--port", "0",
                           "--data-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: python -m server needs gevent: pip install 'daisychain[server]' "
        "(or --dev-server for Werkzeug's development server)"]


def test_client_address_trusts_the_header_only_when_configured() -> None:
    environ = {"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 203.0.113.9"}
    assert client_address(environ, None) == "10.0.0.1"
    assert client_address(environ, "X-Forwarded-For") == "203.0.113.9"  # the proxy's entry
    assert client_address(environ, "X-Forwarded-For", hops=2) == "6.6.6.6"
    assert client_address({"REMOTE_ADDR": "10.0.0.1"}, "X-Forwarded-For") == "10.0.0.1"
    bogus = {"REMOTE_ADDR": "10.0.0.1", "HTTP_X_REAL_IP": "not-an-ip"}
    assert client_address(bogus, "X-Real-IP") == "10.0.0.1"


def test_address_groups() -> None:
    assert address_group("198.51.100.7") == "198.51.100.7"
    assert address_group("2001:db8:1:2:aaaa::1") == address_group("2001:db8:1:2:bbbb::9")
    assert address_group("2001:db8:1:2::1") != address_group("2001:db8:1:3::1")
    assert address_group("::ffff:198.51.100.7") == "198.51.100.7"


def test_tokens_round_trip_and_refuse_tampering_and_age() -> None:
    now = [1000.0]
    signer = TokenSigner(b"k" * 32, ttl_s=60, clock=lambda: now[0])
    token = signer.issue("room", "peer1", True)
    claim = signer.verify(token)
    assert (claim.room, claim.peer, claim.host) == ("room", "peer1", True)
    head, payload, mac = token.split(".")
    forged = signer.issue("room", "peer2", True).split(".")[1]
    for bad in (f"{head}.{forged}.{mac}", token[:-2], "v2" + token[2:], "junk", "a.b.c"):
        assert signer.verify(bad) is None
    now[0] += 61
    assert signer.verify(token) is None
    assert TokenSigner(b"x" * 32, 60).room_key_for_address("1.2.3.4") != \
        signer.room_key_for_address("1.2.3.4")


def test_secret_is_created_once_and_kept(tmp_path: Path) -> None:
    first = load_secret(None, tmp_path / "state")
    assert load_secret(None, tmp_path / "state") == first and len(first) == 32
    assert os.stat(tmp_path / "state" / "signaling.key").st_mode & 0o077 == 0
    assert load_secret("configured-secret-value", tmp_path) == b"configured-secret-value"
    with pytest.raises(SecretError):
        load_secret("short", tmp_path)
    (tmp_path / "state" / "signaling.key").write_text("zz not hex")
    with pytest.raises(SecretError):
        load_secret(None, tmp_path / "state")


def test_a_key_file_that_holds_no_key_is_refused_with_the_way_out(tmp_path: Path) -> None:
    """An empty signaling.key (a crash between creating and writing it) was used as the
    key, and a 1-byte one too: every token it signs, anyone could forge (a trial)."""
    state = tmp_path / "state"
    state.mkdir()
    key = state / "signaling.key"
    for text, said in (("", "holds 0 bytes"), ("ab\n", "holds 1 bytes"),
                       ("zz not hex", "is no key (not hexadecimal)")):
        key.write_text(text)
        with pytest.raises(SecretError) as refused:
            load_secret(None, state)
        assert said in str(refused.value), str(refused.value)
        assert "remove it and start the server again to make a new one" in str(refused.value)
        assert key.read_text() == text, "the file stays as it was"
    notes = tmp_path / "notes.txt"
    notes.write_text("not a folder\n")
    with pytest.raises(SecretError, match=r"data folder .*notes\.txt is a file: give a folder"):
        load_secret(None, notes)
    assert notes.read_text() == "not a folder\n"
    done = subprocess.run([sys.executable, "-m", "server", "--port", "0", "--data-dir",
                           str(notes)], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 2 and "is a file: give a folder" in done.stderr, done.stderr
    fresh = tmp_path / "fresh"  # made whole, no stray files beside it
    assert len(load_secret(None, fresh)) == 32
    assert [p.name for p in fresh.iterdir()] == ["signaling.key"]


def test_a_server_says_at_start_which_parts_a_page_needs_it_has_not_fetched(
        tmp_path: Path, monkeypatch) -> None:
    """Started without the runtime and the chart library, the server said nothing: its
    host learnt of them when a friend's page failed (a trial)."""
    from server.__main__ import missing_parts
    from server.config import ServerConfig

    cfg = ServerConfig.from_dict({"data_dir": str(tmp_path / "state")})
    monkeypatch.setenv("DAISYCHAIN_CACHE", str(tmp_path / "empty-cache"))
    said = missing_parts(cfg)
    assert [line.split(": ")[1] for line in said] == [
        "pages cannot run Python", "pages and /dashboard draw no charts"], said
    assert "python -m server.runtime fetch" in said[0], said
    assert "python -m server.chartlib fetch" in said[1], said


def test_token_bucket_refills_at_its_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2, burst=3, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] += 0.5
    assert bucket.take() and not bucket.take()
    assert not bucket.take(10)  # more than the burst never passes
    with pytest.raises(ValueError):
        TokenBucket(0, 1)


def test_log_lines_per_key_say_how_many_they_left_out() -> None:
    now = [0.0]
    lines = LinesPerKey(rate=0.5, burst=2, keys=2, clock=lambda: now[0])
    assert [lines.admit("a") for _ in range(5)] == [0, 0, None, None, None]
    assert lines.admit("b") == 0  # each key its own budget
    now[0] += 2.0
    assert lines.admit("a") == 3 and lines.admit("a") is None
    lines.admit("c")  # a third key: "b", quiet longest, is forgotten
    assert lines.admit("a") is None and lines.admit("b") == 0 and lines.admit("b") == 0
    with pytest.raises(ValueError):
        LinesPerKey(1, 1, keys=0)


def test_python_m_server_serves(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", "0",
         "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )
    try:
        line = proc.stdout.readline()
        assert "DaisyChain server on http://127.0.0.1:" in line
        assert proc.stdout.readline().startswith("only this machine can reach it: --host "
                                                 "0.0.0.0 (or this machine's address)")
        # where its text comes from (offline, the default shards are out of reach)
        assert proc.stdout.readline() == (
            "training text (/data): 14 parquet shard(s) at huggingface.co, read when a run "
            "first asks; if unreachable then, runs with --data-fallback builtin get the "
            "built-in corpus and the others stop\n")
        url = line.split()[3]
        with urllib.request.urlopen(url + "healthz", timeout=10) as response:
            assert json.load(response)["ok"] is True
        proc.send_signal(signal.SIGINT)  # Ctrl-C: stops, without gevent's hub traceback
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0 and "stopping (SIGINT)" in err, err
        assert "KeyboardInterrupt" not in err and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_a_ctrl_c_right_after_the_banner_stops_the_server_without_a_traceback(
        tmp_path: Path) -> None:
    """The banner invites a Ctrl-C at once; before gevent's handler took it (reach_line's
    imports ran in between) it was a KeyboardInterrupt traceback and exit -2."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", "0",
         "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert "DaisyChain server on" in proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0 and "stopping (SIGINT)" in err, err
        assert "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_config_fields_of_the_wrong_kind_and_a_missing_file_are_one_named_line(
        tmp_path: Path, capsys) -> None:
    """A --config file's "port": "abc" or "host": 5 was a TypeError's traceback, exit 1; a
    missing --config file read "[Errno 2] No such file ...", naming no flag."""
    for values, said in (({"port": "abc"}, "port must be an integer, got 'abc'"),
                         ({"host": 5}, "host must be a string, got 5"),
                         ({"ice_relay_only": 1}, "ice_relay_only must be true or false, got 1"),
                         ({"data_urls": [1]}, "data_urls must be a string or a list of "
                                              "strings, got [1]")):
        given = tmp_path / "server.json"
        given.write_text(json.dumps(values))
        assert main(["--config", str(given)]) == 2
        assert capsys.readouterr().err == f"error: --config {given}: {said}\n"
    whole = ServerConfig.from_dict({"rate_burst": 1e6, "port": 8000.0})  # JSON's 1e6
    assert (whole.rate_burst, whole.port) == (1_000_000, 8000)
    assert isinstance(whole.rate_burst, int) and isinstance(whole.port, int)
    given.write_text(json.dumps({"port": 80.5}))
    assert main(["--config", str(given)]) == 2
    assert capsys.readouterr().err == f"error: --config {given}: port must be an integer, got " \
                                      "80.5\n"
    # a flag's value is named by its flag (it read "port must be ...")
    assert main(["--port", "70000", "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: --port must be in 0..65535, got 70000\n"
    missing = tmp_path / "nothing.json"
    assert main(["--config", str(missing)]) == 2
    assert capsys.readouterr().err == f"error: --config {missing}: No such file or directory\n"


def test_a_port_in_use_is_said_with_what_to_do(tmp_path: Path) -> None:
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:  # as users run it (gevent patches the process it serves in: not this one)
        done = subprocess.run(
            [sys.executable, "-m", "server", "--port", str(port), "--data-dir", str(tmp_path)],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=tmp_path, timeout=60)
    finally:
        holder.close()
    assert done.returncode == 1 and done.stderr.endswith(
        f"error: port {port} on 127.0.0.1 is in use (another server, or this one still "
        "running): stop it, or choose another --port (--port 0 takes a free one)\n"), done.stderr


def test_a_host_that_is_no_address_here_names_the_flag(tmp_path) -> None:
    """--host of another machine (192.0.2.1: a documentation address, bound to nothing
    here; the bind fails before any packet) said `[Errno 99] Cannot assign requested
    address`, naming no flag."""
    done = subprocess.run(
        [sys.executable, "-m", "server", "--host", "192.0.2.1", "--port", "0", "--data-dir",
         str(tmp_path)], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path, timeout=60)
    assert done.returncode == 1 and done.stderr.endswith(
        "error: --host 192.0.2.1 is no address of this machine: give one of its own (`ip "
        "-brief address` lists them), 0.0.0.0 for all of them, or leave --host out for "
        "127.0.0.1 (this machine only)\n"), done.stderr


def test_the_server_says_who_can_reach_it(monkeypatch) -> None:
    """A loopback bind (the default) reaches no other machine; 0.0.0.0 is no address to
    open or share: the machine's own are named."""
    import socket
    from types import SimpleNamespace

    import psutil

    from server.__main__ import reach_line

    assert reach_line("127.0.0.1", 8000).startswith("only this machine can reach it")
    assert reach_line("localhost", 8000).startswith("only this machine can reach it")
    assert reach_line("10.0.0.5", 8000) is None
    addrs = {"lo": [SimpleNamespace(family=socket.AF_INET, address="127.0.0.1")],
             "eth0": [SimpleNamespace(family=socket.AF_INET, address="10.79.0.1"),
                      SimpleNamespace(family=socket.AF_INET6, address="fe80::1")]}
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: addrs)
    assert reach_line("0.0.0.0", 8000) == "reach it at http://10.79.0.1:8000/"
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: {"lo": addrs["lo"]})
    assert reach_line("0.0.0.0", 8000).startswith("this machine has no network address")


def test_a_local_shard_that_cannot_serve_text_is_refused_at_start(tmp_path: Path,
                                                                   capsys) -> None:
    """A README given as a shard, or a parquet file without a text column, started fine and
    stopped the first run that asked for text (DataSourceError ... ShardError)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    other = tmp_path / "body.parquet"
    pq.write_table(pa.table({"body": ["a", "b"]}), other)
    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), numbers)
    notes = tmp_path / "README.md"
    notes.write_text("# not parquet\n" * 10)
    for shard, said in ((other, "no 'text' column (columns: ['body'])"),
                        (numbers, "its 'text' column holds int64, not text"),
                        (notes, "not a parquet file (no PAR1 trailer)")):
        assert main(["--data-url", str(shard), "--data-dir", str(tmp_path)]) == 2
        assert capsys.readouterr().err == f"error: data shard {shard}: {said}\n"
    assert "gevent.monkey" not in sys.modules or not _patched()


def test_a_local_shard_with_no_rows_is_refused_at_start(tmp_path: Path, capsys) -> None:
    """An empty parquet file with a text column was "checked" at start, then every run on
    it stopped: "shard 0 unavailable: ValueError: the shard has no rows"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    empty = tmp_path / "empty.parquet"  # one row group of no rows
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), empty)
    no_groups = tmp_path / "no_groups.parquet"  # a writer closed before any row group
    pq.ParquetWriter(no_groups, pa.schema([("text", pa.string())])).close()
    for shard in (empty, no_groups):
        # asked first: a shard it lets through would start a server that never returns
        assert local_shard_problem((str(shard),)) is not None
        assert main(["--data-url", str(shard), "--data-dir", str(tmp_path)]) == 2
        assert capsys.readouterr().err == \
            f"error: data shard {shard}: no rows (its 'text' column is empty)\n"
