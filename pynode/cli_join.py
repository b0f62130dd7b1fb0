"""`python -m pynode join`: this machine joins a room as a WebRTC peer, like a browser tab.

It checks its arithmetic (units, LUTs, GEMM gate), connects to the server's signaling,
waits for the host's approval like any tab, opens data channels to every approved peer
(pynode.comm.native_mesh) and runs the room's run protocol (pynode.room): it follows the
run a leader proposes, is synced into a run already going, or leads one with --start.
numpy, aiortc and websockets suffice; torch is imported only for --cluster (gloo).

Exit codes: 0 the run finished; 2 bad input, nothing joined or changed (a bad --resume file
is refused here, before the room hears of it); 3 this peer stopped in a run (fork, lost
leader, lost group); 4 the host declined or removed this peer.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from pynode.cli_train import StepReporter, check_writable, explicit_config
from pynode.config import ConfigError, RunConfig
from pynode.native_peer import NativePeer, say, verified_trainer

CLUSTER_TIMEOUT_S = 60.0  # how long the cluster's ranks wait for each other to form


def add_join_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The `join` subcommand and its flags (the config flags of `train` for --start)."""
    from pynode.__main__ import add_config_flags

    p = subparsers.add_parser("join", help="join a room as a WebRTC peer, like a browser tab")
    p.add_argument("--server", required=True, help="the DaisyChain server, http://HOST:PORT")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--room", help="code of a private room (its host approves this peer); "
                       "default: the automatic room of this network")
    where.add_argument("--create", action="store_true", help="make a private room, host it "
                       "and approve every peer that opens its link")
    p.add_argument("--start", action="store_true",
                   help="lead a run of the config flags (or of --resume) once approved")
    add_config_flags(p)
    p.add_argument("--min-peers", type=int, default=1, metavar="N",
                   help="--start: wait until N peers (this one included) are ready")
    p.add_argument("--wait", type=float, default=300.0, metavar="S",
                   help="--start: give up if --min-peers are not ready after S seconds")
    p.add_argument("--resume", help="--start: continue from this .pt checkpoint; it is "
                   "validated here and sent to every peer that joins the run")
    p.add_argument("--save", help="write a .pt checkpoint of the run's state here at the end "
                   "(of the last agreed step if this peer stops)")
    p.add_argument("--save-every", type=int, metavar="N", help="also write --save every N steps")
    p.add_argument("--log", help="append one JSON object per step to this file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="least seconds to wait for the other peers in a step (default 30)")
    p.add_argument("--backend", help="force a GEMM backend (default: best that passes)")
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="a STUN/TURN server (repeat); default: host candidates only")
    p.add_argument("--cluster", action="store_true",
                   help="this machine is one rank of a gloo cluster (MASTER_ADDR, MASTER_PORT, "
                   "WORLD_SIZE, RANK): rank 0 joins the room for all of them")
    return p


def start_plan(args: argparse.Namespace) -> tuple[RunConfig | None, Any]:
    """The run this peer leads (config, resumed checkpoint or None), checked before joining."""
    from pynode.__main__ import config_from_args
    from pynode.session import load_resume

    given = explicit_config(args)
    if not args.start:
        if given or args.resume:
            raise ConfigError("config flags and --resume need --start: the leader's config "
                              "and state reach every other peer")
        return None, None
    if args.min_peers < 1 or args.wait <= 0:
        raise ConfigError("--min-peers must be >= 1 and --wait positive")
    if args.resume:
        return load_resume(args.resume, given)
    return config_from_args(args), None


async def join_command(args: argparse.Namespace) -> int:
    """Run `join` to its end; returns the exit code."""
    from pynode.session import load_units_and_gemm

    require_webrtc()
    cfg, resume = start_plan(args)
    if args.save:
        check_writable(args.save)
    if args.save_every is not None and (args.save_every < 1 or not args.save):
        raise ConfigError("--save-every needs --save and a positive number of steps")
    if args.timeout is not None and args.timeout <= 0:
        raise ConfigError("--timeout must be a positive number of seconds")
    if resume is not None:
        say(f"checkpoint {args.resume}: step {resume.step}, hash {resume.state_hash[:16]}, "
            "valid")
    units, gemm = await asyncio.to_thread(load_units_and_gemm, args.backend)
    say(f"verified: unit networks exact over their domains, GEMM backend {gemm.backend_name}")
    if args.cluster:
        return await join_as_cluster(args, units, gemm, cfg, resume)
    peer = NativePeer(args, units, gemm)
    try:
        return await peer.run(cfg, resume)
    finally:
        await peer.close()


def require_webrtc() -> None:
    """ConfigError naming the install command if aiortc or websockets is missing."""
    import importlib.util

    missing = [m for m in ("aiortc", "websockets") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"join needs {' and '.join(missing)}: pip install 'daisychain[webrtc]'")


async def join_as_cluster(args: argparse.Namespace, units: Any, gemm: Any,
                          cfg: RunConfig | None, resume: Any) -> int:
    """--cluster: rank 0 is the room peer (the bridge); the other ranks follow it."""
    from pynode.comm import make_collective
    from pynode.comm.bridge import ClusterBridge, follow_bridge

    inner = await make_collective("gloo", timeout=CLUSTER_TIMEOUT_S)
    try:
        if inner.rank != 0:
            say(f"cluster rank {inner.rank} of {inner.world_size}: following rank 0, which "
                "joins the room for the cluster")
            reporters: list[StepReporter] = []

            def make(config: dict, coll: Any, state: bytes | None) -> Any:
                trainer = follower_trainer(args, units, gemm, config, coll, state)
                reporters.append(StepReporter(trainer, trainer.cfg.steps, args.log,
                                              progress=not args.no_progress))
                return trainer

            try:
                await follow_bridge(inner, make, say, lambda result: reporters[-1](result))
            finally:
                for reporter in reporters:
                    reporter.close()
            return 0
        say(f"cluster of {inner.world_size} ranks: this rank joins the room for all of them")
        bridge = ClusterBridge(inner)
        bridge.start()
        peer = NativePeer(args, units, gemm, bridge)
        try:
            return await peer.run(cfg, resume)
        finally:
            await peer.close()
            await bridge.stop()
    finally:
        await inner.close()


def follower_trainer(args: argparse.Namespace, units: Any, gemm: Any, config: dict,
                     collective: Any, state: bytes | None) -> Any:
    from pynode.core import checkpoint
    from pynode.session import checkpoint_expectations

    cfg = RunConfig.from_dict(config)
    ckpt = None if state is None else checkpoint.load_checkpoint(
        state, expect=checkpoint_expectations(cfg))
    trainer = verified_trainer(units, gemm, cfg, collective, ckpt, cluster=True)
    if args.timeout is not None:
        trainer.min_deadline = args.timeout
    return trainer


def main(argv: list[str] | None = None) -> int:
    """`python -m pynode.cli_join ...`: the same command before `pynode join` is wired."""
    import logging

    from pynode.core.errors import DaisyError

    parser = argparse.ArgumentParser(prog="python -m pynode")
    add_join_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["join", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(join_command(args))
    except (DaisyError, FileNotFoundError, IsADirectoryError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
