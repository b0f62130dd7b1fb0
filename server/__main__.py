"""``python -m server`` / ``daisychain-server``: run the server (gevent, one process).

``--dev-server`` runs Werkzeug's development server instead (a thread per connection, no
connection limits or header deadlines: for debugging, never on a public address).
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import socket
import sys
from pathlib import Path
from typing import Any

from pynode.core.errors import DaisyError
from pynode.extras import MissingExtraError, require

GEVENT_MISSING = ("error: python -m server needs gevent: pip install 'daisychain[server]' "
                  "(or --dev-server for Werkzeug's development server)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    prog = ("python -m server" if Path(sys.argv[0]).name == "__main__.py"
            else "daisychain-server")  # as it was started
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.replace("``", "`"),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="TCP port (default 8000; 0: any)")
    parser.add_argument("--config", type=Path, help="JSON file of ServerConfig fields")
    parser.add_argument("--trust-proxy-header", metavar="HEADER",
                        help="take the client address from HEADER (e.g. X-Forwarded-For); "
                             "only behind a reverse proxy that sets it")
    parser.add_argument("--proxy-hops", type=int, help="trusted proxies in front (default 1)")
    parser.add_argument("--allowed-origin", action="append", metavar="ORIGIN",
                        help="a web origin (https://host[:port]) whose pages may open /ws "
                             "(repeat; default: this server's own; '*': any)")
    parser.add_argument("--data-url", action="append", metavar="URL",
                        help="parquet shard URL or path (repeat; default FineWeb-Edu 10BT)")
    parser.add_argument("--data-dir", type=Path,
                        help="server state folder: signaling key, revocations, uploads "
                             "(default $DAISYCHAIN_SERVER_DATA, else <cache>/server)")
    parser.add_argument("--ice-server", action="append", metavar="URL",
                        help="a stun: or turn: URL handed to approved peers (repeat; "
                             "docs/NETWORKS.md)")
    parser.add_argument("--turn-secret", metavar="SECRET",
                        help="coturn's static-auth-secret, for per-peer TURN credentials "
                             "(or $DAISYCHAIN_TURN_SECRET, which stays out of `ps`)")
    parser.add_argument("--turn-ttl", type=int, metavar="S",
                        help="lifetime of a TURN credential in seconds (default 3600)")
    parser.add_argument("--ice-relay-only", action="store_true", default=None,
                        help="peers use TURN-relayed candidates only (for tests)")
    parser.add_argument("--dev-server", action="store_true",
                        help="Werkzeug's development server instead of gevent (no limits)")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                        help="the server's log level (default INFO)")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if args.config:
        try:
            values = json.loads(args.config.read_text())
        except ValueError as exc:
            raise ValueError(f"--config {args.config}: not JSON ({exc})") from None
        except OSError as exc:  # it read "[Errno 2] No such file ...", naming no flag
            raise ValueError(f"--config {args.config}: {exc.strerror or exc}") from None
        if not isinstance(values, dict):
            raise ValueError(f"--config {args.config}: not a JSON object of settings (it holds "
                             f"a {type(values).__name__})")
    overrides = {field: getattr(args, flag[2:].replace("-", "_"))
                 for field, flag in FLAG_OF.items()}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return values


# The command line's flag of each ServerConfig field it sets (the rest: --config only)
FLAG_OF = {"host": "--host", "port": "--port", "trust_proxy_header": "--trust-proxy-header",
           "proxy_hops": "--proxy-hops", "data_urls": "--data-url", "data_dir": "--data-dir",
           "allowed_origins": "--allowed-origin", "ice_servers": "--ice-server",
           "turn_secret": "--turn-secret", "turn_ttl_s": "--turn-ttl",
           "ice_relay_only": "--ice-relay-only"}


def named_as_given(text: str, args: argparse.Namespace) -> str:
    """A ServerConfig refusal (`port must be ...`) in the words the value was given in: its
    flag, or the --config file that holds it."""
    field = text.split(" ", 1)[0]
    flag = FLAG_OF.get(field)
    if flag is not None and getattr(args, flag[2:].replace("-", "_")) is not None:
        return flag + text[len(field):]
    return f"--config {args.config}: {text}" if args.config and field.isidentifier() else text


def reach_line(host: str, port: int) -> str | None:
    """Who can reach a server bound to `host`: a loopback bind only this machine (the other
    machines' peers were refused, with nothing here saying why), an all-interfaces bind at
    this machine's addresses (0.0.0.0 is no address to share)."""
    import psutil

    from pynode.addresses import only_this_machine

    if host in ("0.0.0.0", "::", ""):
        found = sorted({a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                        if a.family == socket.AF_INET
                        and not only_this_machine(a.address)})
        if not found:
            return "this machine has no network address but loopback: only it can reach it"
        return "reach it at " + ", ".join(f"http://{a}:{port}/" for a in found)
    if only_this_machine(host):
        return ("only this machine can reach it: --host 0.0.0.0 (or this machine's address) "
                "lets the network's other machines and their browsers join")
    return None


def data_line(urls: tuple[str, ...]) -> str:
    """Where the training text of `--data http://this-server` comes from: an operator
    offline learned that the default shards are on huggingface.co only from a run that
    stopped (or from /data's fallback reason)."""
    from urllib.parse import urlsplit

    remote = [url for url in urls if url.startswith(("http://", "https://"))]
    hosts = sorted({urlsplit(url).hostname or "?" for url in remote})
    parts = []
    if len(urls) > len(remote):
        parts.append(f"{len(urls) - len(remote)} local parquet shard(s), checked")
    if remote:
        parts.append(f"{len(remote)} parquet shard(s) at {', '.join(hosts)}, read when a run "
                     "first asks; if unreachable then, runs with --data-fallback builtin get "
                     "the built-in corpus and the others stop")
    return "training text (/data): " + "; ".join(parts)


def local_shard_problem(urls: tuple[str, ...]) -> str | None:
    """"PATH: what is wrong" for the first local shard that is no parquet file with a text
    column and a row (its footer read, as /data reads it), or None. Remote shards are read
    when a run first asks for text: their server may be down now and up then."""
    from server.shards import ShardError, read_footer

    for url in urls:
        if url.startswith(("http://", "https://")):
            continue
        path = url.removeprefix("file://")
        try:
            with open(path, "rb") as f:
                read_footer(f)
        except (ShardError, OSError) as exc:
            return f"{path}: {exc}"
        except Exception as exc:  # pyarrow's own errors for a footer it cannot parse
            return f"{path}: not a parquet file ({type(exc).__name__}: {exc})"
    return None


def stop_on_ctrl_c(httpd: Any) -> None:
    """Ctrl-C stops the gevent server: serve_forever returns, and main closes it (a
    KeyboardInterrupt raised in gevent's hub was printed with the hub's timestamp). SIGTERM
    still ends the process on the spot, as before."""
    import signal

    import gevent

    def stop(signum: int) -> None:
        logging.getLogger("server").info("stopping (%s)", signal.Signals(signum).name)
        gevent.spawn(httpd.stop, timeout=1)

    gevent.signal_handler(signal.SIGINT, stop, signal.SIGINT)


def missing_parts(cfg: Any) -> list[str]:
    """A warning for each part a page needs that this server has not fetched (the Pyodide
    runtime, the chart library): it started as usual, and its host learnt of them only when
    a friend's page failed (a trial)."""
    from server.chartlib import check_uplot, uplot_path
    from server.runtime_routes import resolve_runtime_dir

    said = []
    for part, check in (("pages cannot run Python", lambda: resolve_runtime_dir(cfg)),
                        ("pages and /dashboard draw no charts",
                         lambda: check_uplot(uplot_path()))):
        try:
            check()
        except DaisyError as exc:
            said.append(f"warning: {part}: {exc}")
    return said


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        require("the server", "flask", "flask_sock", "pyarrow")
    except MissingExtraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from server.config import ServerConfig, ServerConfigError  # no Flask, no sockets

    try:
        cfg = ServerConfig.from_dict(config_from_args(args))
        missing = [url for url in cfg.data_urls if not url.startswith(("http://", "https://"))
                   and not Path(url.removeprefix("file://")).is_file()]
        if missing:  # else every slice would be the built-in fallback text
            what = ("is a folder: give each parquet file in it (repeat --data-url)"
                    if Path(missing[0].removeprefix("file://")).is_dir() else "no such file")
            print(f"error: data shard {missing[0]}: {what} (a shard is an http(s) URL or a "
                  "local parquet file)", file=sys.stderr)
            return 2
        unreadable = local_shard_problem(cfg.data_urls)
        if unreadable:  # it was found only when a run asked for text, and stopped it
            print(f"error: data shard {unreadable}", file=sys.stderr)
            return 2
    except ServerConfigError as exc:
        print(f"error: {named_as_given(str(exc), args)}", file=sys.stderr)
        return 2
    except (DaisyError, OSError, ValueError) as exc:  # bad input: exit 2, as a missing shard
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.dev_server:
        try:
            from server.serving import monkey_patch
        except ImportError:
            print(GEVENT_MISSING, file=sys.stderr)
            return 2
        monkey_patch()  # before Flask, threads or sockets exist
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    from server.app import create_app, make_threaded_server
    from server.tokens import SecretError

    try:
        app = create_app(cfg)
        if args.dev_server:
            httpd = make_threaded_server(app, cfg.host, cfg.port)
            port = httpd.server_port
        else:
            from server.serving import make_server

            httpd = make_server(app, cfg)
            port = httpd.server_port
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            print(f"error: port {cfg.port} on {cfg.host} is in use (another server, or this "
                  "one still running): stop it, or choose another --port (--port 0 takes a "
                  "free one)", file=sys.stderr)
        elif exc.errno == errno.EADDRNOTAVAIL:  # it read "[Errno 99] Cannot assign ..."
            print(f"error: --host {cfg.host} is no address of this machine: give one of its "
                  "own (`ip -brief address` lists them), 0.0.0.0 for all of them, or leave "
                  "--host out for 127.0.0.1 (this machine only)", file=sys.stderr)
        elif exc.errno == errno.EACCES:
            print(f"error: port {cfg.port} on {cfg.host}: {exc.strerror} (ports below 1024 "
                  "need root on most systems: choose --port 8000 or above)", file=sys.stderr)
        else:
            print(f"error: cannot listen on {cfg.host} port {cfg.port}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    except SecretError as exc:  # its key file or data folder: bad input, as a bad setting
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (DaisyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        # a Ctrl-C right after the banner (before gevent's handler takes it) stops it as
        # one later does; it was a traceback through reach_line's imports
        print(f"DaisyChain server on http://{cfg.host}:{port}/ (Ctrl-C stops it)", flush=True)
        reach = reach_line(cfg.host, port)
        if reach:
            print(reach, flush=True)
        print(data_line(cfg.data_urls), flush=True)
        for line in missing_parts(cfg):
            print(line, flush=True)
        if not args.dev_server:
            stop_on_ctrl_c(httpd)
        httpd.serve_forever()
    except KeyboardInterrupt:
        logging.getLogger("server").info("stopping (SIGINT)")
    finally:
        if args.dev_server:
            httpd.server_close()
        else:
            httpd.stop(timeout=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # while it loads (imports, the app's set-up): nothing served yet
        print("interrupted", file=sys.stderr)
        sys.exit(130)
