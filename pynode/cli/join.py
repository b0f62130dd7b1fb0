"""`python -m pynode join`: this machine joins a room as a WebRTC peer, like a browser tab.

It checks its arithmetic (units, LUTs, GEMM gate), connects to the server's signaling,
waits for the host's approval like any tab, opens data channels to every approved peer
(pynode.comm.native_mesh) and runs the room's run protocol (pynode.run.protocol, hosted by
pynode.cli.peer): it follows the run a leader proposes, is synced into a run already
going, or leads one with --start.
numpy, aiortc and websockets suffice; torch is imported only for --cluster (gloo).

Exit codes: 0 the run finished; 2 bad input, nothing joined or changed (a bad --resume file
is refused here, before the room hears of it); 3 this peer stopped in a run (fork, lost
leader, lost group); 4 the host declined or removed this peer; 130 Ctrl-C, 143 SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from pynode.cli.dashboard import StatusReporter, register
from pynode.cli.faults import install_fault
from pynode.cli.flags import (
    add_arithmetic_flags,
    add_config_flags,
    add_dashboard_flag,
    add_output_flags,
    check_output_flags,
    config_from_args,
    explicit_config,
    resume_line,
    resume_notes,
    train_options,
    unsaved_note,
)
from pynode.cli.peer import NativePeer
from pynode.cli.report import StepReporter, clip_note, say, stop_reason
from pynode.comm.signaling import SignalingError, check_room_code, split_link, ws_url
from pynode.config import ConfigError, RunConfig
from pynode.datafile import is_file_spec
from pynode.extras import require
from pynode.run.assemble import build_trainer, load_resume, load_units_and_gemm, preflight

CLUSTER_TIMEOUT_S = 60.0  # how long the cluster's ranks wait for each other to form


def add_join_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The `join` subcommand and its flags (the config flags of `train` for --start)."""
    p = subparsers.add_parser("join", help="join a room as a WebRTC peer, like a browser tab",
                              description="Join a DaisyChain room as a peer, as a browser tab "
                              "does: the room's host approves this peer's id, then it trains "
                              "the room's runs over WebRTC (--start leads one).")
    p.add_argument("--server", required=True, help="the DaisyChain server, http://HOST:PORT, "
                   "or a room's link, http://HOST:PORT/?room=CODE (that room, as --room)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--room", help="code of a private room (its host approves this peer); "
                       "default: the automatic room of this network")
    where.add_argument("--create", action="store_true", help="make a private room, host it "
                       "and approve every peer that opens its link")
    p.add_argument("--start", action="store_true",
                   help="lead a run of the config flags (or of --resume) once approved")
    # every peer of a room reads the run's text, and a tab has no disk to read a file from
    add_config_flags(p, {"data": "the text: builtin or a DaisyChain server http://HOST:PORT "
                                 "(a file is refused: the room's tabs cannot read it) "})
    p.add_argument("--min-peers", type=int, default=1, metavar="N",
                   help="--start: wait until N peers (this one included) are ready (default 1)")
    p.add_argument("--wait", type=float, default=300.0, metavar="S",
                   help="--start: give up if --min-peers are not ready after S seconds "
                        "(default 300)")
    p.add_argument("--resume", help="--start: continue from this .pt checkpoint; it is "
                   "validated here and sent to every peer that joins the run")
    add_output_flags(p)
    add_dashboard_flag(p)
    p.add_argument("--timeout", type=float, metavar="S",
                   help="seconds a step waits for a peer's part before the room drops that "
                   "peer and goes on without it, at least: the deadline is this or 4x the "
                   "step's expected time, whichever is longer (default 30)")
    add_arithmetic_flags(p)
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="a STUN/TURN server (repeat), added to the server's own "
                        "(docs/NETWORKS.md)")
    p.add_argument("--approval-wait", type=float, default=300.0, metavar="S",
                   help="give up if no host approved this peer after S seconds (default 300)")
    p.add_argument("--stay", action="store_true",
                   help="stay in the room after a run ends, ready for its next run, as a tab "
                   "does (each run has its own --save, which it writes over, and its own "
                   "--log rows, appended); without it the peer exits with the run's end. "
                   "Ctrl-C leaves")
    p.add_argument("--cluster", action="store_true",
                   help="this machine is one rank of a gloo cluster (MASTER_ADDR, MASTER_PORT, "
                   "WORLD_SIZE, RANK): rank 0 joins the room for all of them")
    return p


def start_plan(args: argparse.Namespace) -> tuple[RunConfig | None, Any]:
    """The run this peer leads (config, resumed checkpoint or None), checked before joining."""
    given = explicit_config(args)
    if not args.start:
        if given or args.resume:  # named as typed: `--steps 5 needs --start`
            named = [f"--{name.replace('_', '-')}" for name in given]
            named += ["--resume"] if args.resume else []
            raise ConfigError(f"{' and '.join(named)} need{'s' if len(named) == 1 else ''} "
                              "--start: the leader's config and state reach every other peer")
        return None, None
    if args.min_peers < 1 or args.wait <= 0:
        raise ConfigError("--min-peers must be >= 1 and --wait positive")
    ckpt = None
    if args.resume:
        cfg, ckpt = load_resume(args.resume, given)
        for note in [*resume_notes(ckpt.config, ckpt.step, given), unsaved_note(args)]:
            if note:
                say(note)
    else:
        cfg = config_from_args(args)
    if is_file_spec(cfg.data):
        raise ConfigError("--data FILE is read by each peer from its own disk, and a room's "
                          "tabs have none: serve a parquet file with `python -m server "
                          "--data-url FILE` and give --data http://SERVER")
    if note := clip_note(cfg):  # as train's header: this peer leads a room's run
        say(f"note: {note}")
    if ckpt is None:  # load_resume did it for a resume
        preflight(cfg)  # a text this leader cannot read, a config too large: said before joining
    return cfg, ckpt


def take_room_from_link(args: argparse.Namespace) -> None:
    """A room's share link given as --server: its room, as --room (the same code given
    twice is fine; another, or --create, is refused)."""
    server, linked = split_link(args.server)
    if linked is None:
        return
    if args.create:
        raise SignalingError(f"--create makes a new room, but --server is the link of room "
                             f"{linked}: give the server's address ({server}) with --create, "
                             "or drop --create to join that room")
    if args.room not in (None, linked):
        raise SignalingError(f"--server is the link of room {linked}, --room names room "
                             f"{args.room}: give one")
    if args.room is None:
        say(f"room {linked}: from the link given as --server")
    args.server, args.room = server, linked


async def join_command(args: argparse.Namespace) -> int:
    """Run `join` to its end; returns the exit code."""
    require_webrtc()
    if args.cluster:
        require("join --cluster (the gloo transport)", "torch")
        if args.stay:
            raise ConfigError("--stay is for a peer of its own: a --cluster's ranks end "
                              "with their run (start them again for the next)")
    take_room_from_link(args)
    ws_url(args.server)  # a malformed address or room code: said before the unit checks
    if args.room is not None:
        check_room_code(args.room)
    cfg, resume = start_plan(args)
    check_output_flags(args)
    if args.timeout is not None and args.timeout <= 0:
        raise ConfigError("--timeout must be a positive number of seconds")
    if args.approval_wait <= 0:
        raise ConfigError("--approval-wait must be a positive number of seconds")
    if not args.cluster:
        require_network()
    if resume is not None:
        say(resume_line(args.resume, resume, cfg.steps))
    dashboard = register(args.dashboard, "join", 1) if args.dashboard else None
    if dashboard is not None:
        say(dashboard.card_line())
    units, gemm = await asyncio.to_thread(load_units_and_gemm, args.backend, args.kernels,
                                          args.check_products)
    say(f"verified: unit networks exact over their domains, GEMM backend {gemm.backend_name}")
    if args.cluster:
        return await join_as_cluster(args, units, gemm, cfg, resume, dashboard)
    status = StatusReporter(dashboard, 0, state="waiting") if dashboard else None
    peer = NativePeer(args, units, gemm, status=status)
    try:
        return await peer.run(cfg, resume)
    except BaseException as exc:  # Ctrl-C, SIGTERM: the dashboard showed it training on
        if peer.status is not None and not peer.status.closed:  # --stay: the run's own
            peer.status.finish("stopped", stop_reason(exc))
        raise
    finally:
        await peer.close()


def require_webrtc() -> None:
    """MissingExtraError naming the install command if aiortc or websockets is missing."""
    require("join", "aiortc", "websockets")


def require_network() -> None:
    """NoNetworkError at once on a machine with only loopback (pynode.comm.rtclink)."""
    from pynode.comm.rtclink import require_network as check

    check()


async def join_as_cluster(args: argparse.Namespace, units: Any, gemm: Any,
                          cfg: RunConfig | None, resume: Any, dashboard: Any = None) -> int:
    """--cluster: rank 0 is the room peer (the bridge); the other ranks follow it. Rank 0
    reports to --dashboard for the cluster."""
    from pynode.comm import make_collective
    from pynode.run.cluster import ClusterBridge, follow_bridge

    inner = await make_collective("gloo", timeout=CLUSTER_TIMEOUT_S)
    try:
        if inner.rank != 0:
            say(f"cluster rank {inner.rank} of {inner.world_size}: following rank 0, which "
                "joins the room for the cluster")
            reporters: list[StepReporter] = []

            def make(cfg: RunConfig, coll: Any, ckpt: Any) -> Any:
                options = train_options(args, share=(inner.rank, inner.world_size))
                trainer = build_trainer(cfg, coll, ckpt, arithmetic=(units, gemm),
                                        options=options)
                install_fault(trainer)
                reporters.append(StepReporter(trainer, trainer.cfg.steps, args.log,
                                              progress=not args.no_progress))
                return trainer

            try:
                await follow_bridge(inner, make, say, (lambda result: reporters[-1](result),))
            finally:
                for reporter in reporters:
                    reporter.close()
            say(f"cluster rank {inner.rank}: rank 0 left the room; this rank is done")
            return 0
        require_network()
        say(f"cluster of {inner.world_size} ranks: this rank joins the room for all of them")
        bridge = ClusterBridge(inner)
        bridge.start()
        status = StatusReporter(dashboard, 0, state="waiting") \
            if dashboard and inner.rank == 0 else None
        peer = NativePeer(args, units, gemm, bridge, status=status)
        try:
            return await peer.run(cfg, resume)
        finally:
            await peer.close()
            await bridge.stop()
    finally:
        await inner.close()
