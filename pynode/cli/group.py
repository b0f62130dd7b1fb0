"""`train --peers N` (loopback processes on this machine) and `cluster` (gloo across machines).

Rank 0 is the leader: it prints the plan, the per-step progress and the final hash, writes
--log and --save. Other ranks are quiet. When a gloo member dies the group cannot go on:
the survivors stop within the collective's deadline and rank 0, if it is among them, writes
a checkpoint of the last step everybody agreed on. Under torchrun's elastic
agent (`cluster --elastic`, pynode.cli.elastic) the agent restarts the group instead and
it resumes from the last checkpoint the ranks agreed on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pynode import platform
from pynode.cli.dashboard import (
    DashboardRun,
    StatusReporter,
    register,
    server_of,
    share_run,
)
from pynode.cli.elastic import ElasticRank, check_elastic_flags, launch
from pynode.cli.faults import install_fault
from pynode.cli.flags import (
    CONFIG_FLAGS,
    OUTPUT_FLAGS,
    capacity_note,
    check_output_flags,
    explicit_config,
    parse_capacity,
    replicas_note,
    resume_line,
    resume_notes,
    train_options,
    unsaved_note,
)
from pynode.cli.report import (
    Saver,
    StepReporter,
    echo,
    final_status,
    name_rank_in_logs,
    print_summary,
    run_header,
    say,
    stop_reason,
    write_summary,
)
from pynode.cli.signals import settle, terminated
from pynode.comm import CommError, PeerLost, make_collective
from pynode.config import ConfigError, RunConfig
from pynode.core.errors import DaisyError
from pynode.extras import require
from pynode.run.assemble import checkpoint_bytes, read_resume
from pynode.run.errors import ForkError, VerificationError
from pynode.run.group import run_member
from pynode.run.trainer import StepResult, Trainer
from pynode.tasks import load_task


async def lead(args: argparse.Namespace, cfg: RunConfig | None, collective, capacities,
               dashboard: DashboardRun | None = None, elastic: ElasticRank | None = None,
               followers: Callable[[], Awaitable[None]] | None = None,
               resumed: bytes | None = None) -> int:
    """Rank 0's side: everything the user sees. `cfg`: the run's config (None: --resume's,
    read here); `dashboard`: the run registered for --dashboard, shared with every rank
    here; `elastic`: this rank under torchrun's agent (resume from the checkpoint the ranks
    agree on); `followers`: awaited once the run is done and saved, before the last lines
    (local peers: until they have said how they ended, so the final hash is the last line
    of the terminal too); `resumed`: the --resume checkpoint the caller read, checked and
    told about already, `cfg` being its run's."""
    platform.pin_to_core(0)
    if collective.world_size > 1:
        name_rank_in_logs(0)
    await share_run(collective, dashboard)
    status = StatusReporter(dashboard, 0, collective) if dashboard else None
    if elastic is not None:  # its --resume, or a newer checkpoint after a restart
        resume = await elastic.agree(cfg)
    else:
        resume = (checkpoint_bytes(args.resume, "--resume") if args.resume and resumed is None
                  else None)
    if resume is not None:
        given = explicit_config(args)  # --data FILE: its sha256
        cfg, ckpt = read_resume(resume, given, source="" if elastic is not None
                                else f"--resume {args.resume}")
        if elastic is None:  # under torchrun's agent ElasticRank says which it agreed on
            print(resume_line(args.resume, ckpt, cfg.steps), file=sys.stderr)
        for note in [*resume_notes(ckpt.config, ckpt.step, given), unsaved_note(args)]:
            if note:
                print(note, file=sys.stderr)
    resume = resume if resume is not None else resumed
    note = replicas_note(cfg, capacities, collective.world_size) if cfg.outer else \
        capacity_note(cfg.microbatches, capacities, collective.world_size)
    if note:
        print(note, file=sys.stderr)
    saver = Saver(args.save, args.save_every, log=args.log, owns_state=True)
    reporter: StepReporter | None = None
    hooks: list = []  # the loop's on_step hooks, filled once the trainer exists
    last: list[StepResult] = []

    def prepare(trainer: Trainer) -> None:
        nonlocal reporter
        install_fault(trainer, 0)
        echo(run_header(trainer))
        reporter = StepReporter(trainer, trainer.cfg.steps, args.log, not args.no_progress)
        hooks.extend([reporter, saver.hook(trainer), last.append, members_watch(collective)])
        if elastic is not None:
            hooks.extend(elastic.hooks(trainer))
        if status is not None:
            status.attach(trainer)
            hooks.append(status)

    options = train_options(args, capacities=capacities)
    try:
        trainer, traffic, timings = await run_member(
            collective, cfg, resume=resume, backend=args.backend, kernels=args.kernels,
            options=options,
            check_products=args.check_products,
            on_step=hooks, report=echo, prepare=prepare,
        )
    except (CommError, ForkError, VerificationError) as exc:
        if reporter is not None:
            reporter.close()
        saved = saver.tell_last_agreed()
        reason = stop_reason(exc)
        stopped = reporter and reporter.trainer
        end_status(status, 0, stopped, "stopped", reason, collective, quiet=True)
        where = f" (step {stopped.state.step}/{stopped.cfg.steps})" if stopped else ""
        # one line: the rank's status line said the same reason again
        print(f"error: the group stopped: {reason}{where}"
              + (f"; to go on from there, start the group again with {saver.resume_flags()}"
                 if saved else ""), file=sys.stderr)
        return 3
    except BaseException as exc:  # refused mid-run (a non-finite step, ...), or interrupted
        if reporter is not None:
            reporter.close()
        saver.tell_last_agreed()
        end_status(status, 0, reporter and reporter.trainer, "stopped",
                   stop_reason(exc), collective, quiet=True)
        raise
    finally:
        if reporter is not None:
            reporter.close()
    saved = saver.final(trainer)
    if saved:  # a stop says where its state went; so does a finished run
        print(saved, file=sys.stderr)
    if args.summary:
        write_summary(args.summary, trainer, collective.world_size, traffic, timings)
    if followers is not None:
        await followers()
    end_status(status, 0, trainer, "finished", "", collective)
    elapsed = reporter.elapsed if reporter is not None else 0.0
    print_summary(trainer, last[-1] if last else None, elapsed, local_units=False)
    print(trainer.state.hash())
    return 0


async def follow(collective, args: argparse.Namespace, capacities,
                 elastic: ElasticRank | None = None) -> int:
    """A rank > 0. A cluster's ranks (each on its own terminal) say that they follow and
    how their run ended; local peers (train --peers) only when they stop, rank 0 speaks
    for the rest. `elastic`: this rank under torchrun's agent."""
    rank = collective.rank
    announce = args.command == "cluster"
    platform.pin_to_core(rank)
    name_rank_in_logs(rank)
    options = train_options(args, capacities=capacities)
    if announce:
        say(f"rank {rank} of {collective.world_size}: in the group, following rank 0's run")
    dashboard = await share_run(collective, None)
    status = StatusReporter(dashboard, rank, collective) if dashboard else None
    note = ignored_dashboard_note(rank, getattr(args, "dashboard", None), dashboard)
    if announce and note:
        say(note)
    if elastic is not None:
        await elastic.agree(None)
    built: list[Trainer] = []
    hooks: list = []  # the loop's on_step hooks, filled once the trainer exists

    def prepare(trainer: Trainer) -> None:
        install_fault(trainer, rank)
        built.append(trainer)
        note = (ignored_flags_note(rank, args, trainer.cfg, trainer.state.step) if announce
                else None)
        for line in (note or "").splitlines():
            say(line)
        if status is not None:
            status.attach(trainer)
            hooks.append(status)
        if elastic is not None:
            hooks.extend(elastic.hooks(trainer))

    try:
        trainer, *_ = await run_member(collective, None, backend=args.backend,
                                       kernels=args.kernels, options=options,
                                       check_products=args.check_products,
                                       report=lambda line: None, prepare=prepare,
                                       on_step=hooks)
    except DaisyError as exc:
        if not announce and isinstance(exc, PeerLost) and 0 in exc.ranks:
            await settle()  # a local peer whose hub a Ctrl-C stopped: interrupted as well
        end_status(status, rank, built[-1] if built else None, "stopped",
                   stop_reason(exc), collective)
        if announce and isinstance(exc, PeerLost) and 0 in exc.ranks:
            say(leader_lost_note(rank, args))
        return 3
    except BaseException as exc:
        end_status(status, rank, built[-1] if built else None, "stopped",
                   stop_reason(exc), collective, quiet=True)
        if announce and isinstance(exc, KeyboardInterrupt | asyncio.CancelledError):
            # its own Ctrl-C: where it stood, as a finished or stopped rank says (an error
            # says itself on its way out)
            say(final_status(rank, built[-1] if built else None, "stopped", stop_reason(exc),
                             collective))
        raise
    end_status(status, rank, trainer, "finished", "", collective, quiet=announce)
    if announce:  # one status line, as every rank's (it said "finished" twice)
        say(final_status(rank, trainer, "finished", "", collective)
            + ": every step agreed with the group")
    return 0


def members_watch(collective) -> Callable[[StepResult], None]:
    """A step hook of rank 0: one line for each rank that left the group, at the step it
    was lost (a SIGKILLed local peer showed only the transport's and re-plan's warnings)."""
    before = set(collective.members)

    def watch(result: StepResult) -> None:
        nonlocal before
        now = set(collective.members)
        for rank in sorted(before - now):
            echo(f"rank {rank} left the group at step {result.step}: its microbatches went to "
                 f"the others, and the run goes on with {len(now)} peer(s), the same bits")
        before = now

    return watch


def leader_lost_note(rank: int, args: argparse.Namespace) -> str:
    """What a cluster rank > 0 says when rank 0 is gone: only rank 0 saves, so the run's
    state is on rank 0's machine, if anywhere."""
    save = getattr(args, "save", None)
    where = f"its --save {save}" if save else "its --save (if it was given one)"
    # this rank's status line above may be a step past what rank 0 saved (a newcomer read
    # rank 1's step 56 against rank 0's "saved ... (step 55)" and could not tell which held)
    return (f"rank {rank}: rank 0 left the run. Only rank 0 saves, on its machine: after a "
            f"Ctrl-C or SIGTERM {where} holds the last step every rank agreed on (this "
            "rank's step above may be one past it), else its last --save-every checkpoint "
            "does; to go on, start every rank again, rank 0 with --resume that file")


def ignored_dashboard_note(rank: int, given: str | None, shared: DashboardRun | None,
                           ) -> str | None:
    """What a cluster rank > 0 given --dashboard hears where rank 0's (the run's) is not
    that server: the other flags rank 0 overrides were named, this one dropped silently."""
    if not given or (shared is not None and server_of(given) == shared.url):
        return None
    theirs = (f"it reports to {shared.url}" if shared is not None
              else "rank 0 was given none, so this run reports to no dashboard")
    return (f"rank {rank}: --dashboard {given} ignored: rank 0's --dashboard is the run's "
            f"({theirs})")


def ignored_flags_note(rank: int, args: argparse.Namespace, cfg: RunConfig,
                       resumed_from: int = 0) -> str | None:
    """What a cluster rank > 0 was given that rank 0's run overrides (its config flags that
    differ, and --resume where rank 0's run starts at step 0: `resumed_from`) or that only
    rank 0 acts on (--save, --log, --summary), said once; None when nothing was. (--data
    is left out: the same file is named by its path here and by its hash in the run's
    config.)"""
    given = {n: getattr(args, n) for n in CONFIG_FLAGS if getattr(args, n, None) is not None}
    differ = [f"--{n.replace('_', '-')} {v}" for n, v in given.items()
              if n != "data" and getattr(cfg, n) != v]
    if getattr(args, "resume", None) and resumed_from == 0:  # rank 0 did not resume a run
        differ.append(f"--resume {args.resume}")
    outputs = [f"{flag} {getattr(args, name)}" for flag, name in OUTPUT_FLAGS
               if getattr(args, name, None)]
    lines = []
    if differ:
        lines.append(f"rank {rank}: {', '.join(differ)} ignored: rank 0 chooses the run for "
                     f"every rank (here task {cfg.task}, {cfg.steps} steps)")
    if outputs:  # a user looked for r1.pt on rank 1's machine
        lines.append(f"rank {rank}: {', '.join(outputs)}: only rank 0 writes files, on its "
                     "machine; this rank writes none")
    return "\n".join(lines) or None


def end_status(status: StatusReporter | None, rank: int, trainer: Trainer | None, state: str,
               reason: str, collective, quiet: bool = False) -> None:
    """The rank's last dashboard report and its one-line status on stderr (`quiet`: the
    report only, an exception is on its way to say the rest)."""
    if status is not None:
        status.finish(state, reason)
    if not quiet:
        # a local peer shares its terminal with rank 0's progress bar: its line starts on
        # a cleared line, not at the end of the bar (rank 0 draws the bar again below it)
        clear = "\r\x1b[2K" if rank > 0 and sys.stderr.isatty() else ""
        print(clear + final_status(rank, trainer, state, reason, collective), file=sys.stderr)


PEERS_PER_CORE = 4  # `train --peers` refuses more local peers than this a core ...
MIN_MOST_PEERS = 8  # ... unless there are no more than this many


async def train_local_peers(args, cfg: RunConfig, capacities, resumed: bytes | None = None,
                            ) -> int:
    """Rank 0 in this process, ranks 1..N-1 as child processes over a Unix socket.
    `resumed`: the --resume checkpoint, read and checked (cfg is its run's)."""
    if args.peers < 1:
        raise ConfigError(f"--peers must be >= 1, got {args.peers}")
    cores = platform.cpu_count()
    most = max(MIN_MOST_PEERS, PEERS_PER_CORE * cores)
    if args.peers > most:  # 200 on 2 cores started 199 interpreters and said nothing
        raise ConfigError(f"--peers {args.peers} on {cores} core(s): each local peer is a "
                          f"process holding the whole model; at most {most} here (one a "
                          "core is the fastest; more only share the cores)")
    # train's lines carry no time (join's and a cluster's do: STAMPED_COMMANDS)
    if args.peers > cores:
        echo(f"note: {args.peers} local peers on {cores} core(s) share the cores: the run "
             "shows the same bits, not more speed")
    dashboard = register(args.dashboard, f"train --peers {args.peers}", args.peers) \
        if args.dashboard else None
    if dashboard is not None:
        echo(dashboard.card_line())
    with tempfile.TemporaryDirectory(prefix="pynode-") as tmp:
        address = str(Path(tmp) / "hub.sock")
        children = [spawn_peer(rank, args.peers, address, args) for rank in range(1, args.peers)]
        try:
            collective = await make_collective(
                "loopback", rank=0, world_size=args.peers, address=address, timeout=60.0
            )
            try:
                return await lead(args, cfg, collective, capacities, dashboard,
                                  followers=lambda: asyncio.to_thread(wait_for, children),
                                  resumed=resumed)
            except (KeyboardInterrupt, asyncio.CancelledError):
                pass_on_interrupt(children)
                raise
            finally:
                await collective.close()
        finally:
            wait_for(children)


def pass_on_interrupt(children: list[subprocess.Popen]) -> None:
    """Rank 0 was interrupted: its local peers are too, before its collective closes. A
    signal for this process alone (`kill -INT`, an IDE's stop button, a supervisor) left
    them to find the hub gone and say `stopped: PeerLost: lost the hub`, as if something
    had broken. A terminal's Ctrl-C reached them already (the process group): one more is
    what a user's second Ctrl-C is to them, an interrupt all the same."""
    signum = terminated() or signal.SIGINT
    for child in children:
        if child.poll() is None:
            child.send_signal(signum)


def wait_for(children: list[subprocess.Popen]) -> None:
    """Until each local peer has ended (killed if it has not within 30 s)."""
    for child in children:
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def spawn_peer(rank: int, world: int, address: str, args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pynode", "_peer", "--rank", str(rank), "--world", str(world),
           "--address", address]
    if args.backend:
        cmd += ["--backend", args.backend]
    if args.kernels:
        cmd += ["--kernels", args.kernels]
    if args.capacity:
        cmd += ["--capacity", args.capacity]
    if not args.check_products:
        cmd += ["--no-check-products"]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, env=threads_per_peer(world))


def threads_per_peer(peers: int) -> dict[str, str]:
    """Split this machine's cores between the local peers: a BLAS pool per process that
    wants every core makes N processes on N cores wait on each other at every GEMM."""
    share = str(max(1, platform.cpu_count() // peers))
    env = dict(os.environ)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, share)
    return env


async def peer_command(args) -> int:
    """Hidden `_peer` subcommand: one loopback follower process."""
    collective = await make_collective(
        "loopback", rank=args.rank, world_size=args.world, address=args.address, timeout=60.0
    )
    try:
        return await follow(collective, args, parse_capacity(args.capacity, args.world))
    finally:
        await collective.close()


FORMING_NOTICE_S = 3.0  # a group not formed by then: its rank says what it waits for


async def told_while_forming(forming: Awaitable[Any], timeout: float) -> Any:
    """The gloo group `forming` makes; if it has not formed within FORMING_NOTICE_S, this
    rank says what it waits for. Both ranks of a cluster started a step apart said nothing
    for up to --timeout (60 s), which read as a hang (a newcomer trial)."""
    task = asyncio.ensure_future(forming)
    try:
        if timeout > FORMING_NOTICE_S:
            await asyncio.wait({task}, timeout=FORMING_NOTICE_S)
            if not task.done():
                env = os.environ
                say(f"rank {env.get('RANK')} of {env.get('WORLD_SIZE')}: waiting for the other "
                    f"ranks at {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')} (up to "
                    f"{timeout:g} s, --timeout)")
        return await task
    except BaseException:
        task.cancel()
        raise


async def cluster_command(args, cfg: RunConfig | None, argv: list[str] | None = None) -> int:
    """gloo group from MASTER_ADDR / MASTER_PORT / WORLD_SIZE / RANK; with --elastic (outside
    torchrun's agent) the agent that starts this machine's ranks from `argv`. `cfg`: the
    flags' config, None with --resume (rank 0 reads the checkpoint's and judges the flags
    given with it)."""
    check_elastic_flags(args)
    if args.elastic and not os.environ.get("TORCHELASTIC_RUN_ID"):
        return launch(args, argv if argv is not None else sys.argv[1:])  # its signal handlers
    require("cluster (the gloo transport)", "torch")
    # rank 0 writes the outputs; under torchrun's agent every rank writes --save
    check_output_flags(args, writes=os.environ.get("RANK", "0") == "0" or args.elastic,
                       lock_log=os.environ.get("RANK", "0") == "0" and not args.elastic)
    # a task's own extras (a resumed checkpoint's task: by its reading), on rank 0, which
    # chooses the run: another rank that cannot load it says so to the group once it forms
    # (pynode.run.group.tell_setup_failed), not to itself before
    if cfg is not None and os.environ.get("RANK", "0") == "0":
        load_task(cfg.task)
    dashboard = None
    if args.dashboard and os.environ.get("RANK") == "0":  # refused before the group forms
        dashboard = register(args.dashboard, "cluster", int(os.environ.get("WORLD_SIZE", "1")))
        say(dashboard.card_line())
    collective = await told_while_forming(make_collective("gloo", timeout=args.timeout),
                                          args.timeout)
    elastic = ElasticRank(collective, args) if collective.restartable else None
    capacities = parse_capacity(args.capacity, collective.world_size)
    rc = 1
    try:
        if elastic is not None:
            elastic.install()
        if collective.rank == 0:
            rc = await lead(args, cfg, collective, capacities, dashboard, elastic)
        else:
            rc = await follow(collective, args, capacities, elastic)
        return rc
    finally:
        if elastic is not None:
            elastic.farewell(f"exited ({rc})")
        await asyncio.shield(collective.close())
