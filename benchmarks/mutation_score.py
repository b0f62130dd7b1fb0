"""Mutation score of the GEMM verification: the share of deliberately wrong backends caught.

    python benchmarks/mutation_score.py [--json]

The corpus is tests/core/gemm_mutants.py (each mutant one real kernel bug). For each it
prints the gate case that refused it (`grid_*`: only the structured grid did), whether the
gate + per-call product check kept every wrong product from its caller (the check
recomputes a flagged product on the next gated backend), whether the check alone,
with no gate in front, would have, and what the cross-peer check alone does with it: three
tabs' room protocol (pynode.run.protocol over the in-memory mesh) trains a small GPT with
every microbatch cross-checked, one tab computing with the mutant and no gate or check.
`caught`: the others name it and end on the clean run's hashes; `stopped`: the agreement
check saw its GEMM probe differ and stopped the room before any step past the fork (no
wrong step reported, no clean end either); `harmless`: it never made a wrong product this
model uses, and nobody's hashes moved; `MISSED` otherwise. It exits 1
if gate + check misses any mutant. About a minute (`--no-cross-peer`: a few seconds); the
sampled audit is off throughout, so it is not what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "core"))

from gemm_mutants import classes, score  # noqa: E402  (the corpus lives with the tests)

from pynode.comm.mesh import MemoryNetwork  # noqa: E402
from pynode.config import RunConfig  # noqa: E402
from pynode.core.gemm import ExactGate, GemmAudit, select_gemm  # noqa: E402
from pynode.core.gemm.reference import ReferenceBackend  # noqa: E402
from pynode.run.assemble import build_trainer  # noqa: E402
from pynode.run.protocol import RoomPeer  # noqa: E402
from pynode.unitfiles import load_default_units  # noqa: E402

# width 36 and an MLP of 144 with 135-row products, as tests/core/test_mutants.py trains
ROOM = {"task": "gpt", "width": 36, "layers": 1, "heads": 2, "seq": 27, "microbatch_size": 5,
        "microbatches": 6, "steps": 3, "lr": 0.003, "seed": 5, "cross_check": 1}
NEVER = 10**9  # the sampled audit off


class _Named(logging.Handler):
    """Collects what the honest peers say about who computed wrong."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def cross_peer(cls: type, units: Any, reference: list[str]) -> str:
    """The cross-peer check alone against one mutant: three tabs, the last computing with
    the mutant (no gate, no per-call check, no audit); `caught`, `stopped`, `harmless` or
    `MISSED`."""
    def make(mutant: bool):
        def make_trainer(config, collective, resume):
            gemm = select_gemm(units, order=["numpy_int"], audit_every=NEVER, check=False)
            if mutant:
                gemm.backend, gemm.audit = cls(), GemmAudit(units.mul_lut, every=NEVER)
                gemm.audit.calls = 1
            return build_trainer(config, collective, resume, arithmetic=(units, gemm))
        return make_trainer

    async def room() -> list[list[tuple[str, dict]]]:
        net = MemoryNetwork()
        reports: list[list[tuple[str, dict]]] = [[], [], []]
        done = [asyncio.Event() for _ in reports]

        def reporter(i: int):
            def report(kind: str, fields: dict) -> None:
                reports[i].append((kind, fields))
                if kind in ("done", "failed"):
                    done[i].set()
            return report

        peers = [RoomPeer(net.join(f"tab{i}"), make(i == 2), reporter(i)) for i in range(3)]
        tasks = [asyncio.ensure_future(p.serve()) for p in peers]
        await asyncio.sleep(0.05)
        await peers[0].start(dict(ROOM))
        try:
            await asyncio.wait_for(asyncio.gather(*(d.wait() for d in done[:2])), 120)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return reports

    named = _Named()
    logger = logging.getLogger("pynode.run")
    logger.addHandler(named)
    try:
        reports = asyncio.run(room())
    except Exception:  # noqa: BLE001 - a room that breaks did not keep the mutant out
        return "MISSED"
    finally:
        logger.removeHandler(named)
    honest = [{f["step"]: f["hash"] for k, f in r if k == "step"} for r in reports[:2]]
    if any(h.get(s + 1, x) != x for h in honest for s, x in enumerate(reference)):
        return "MISSED"  # a wrong step was reported
    if not all(len(h) == len(reference) for h in honest):
        forked = all(any(k == "failed" and "fork detected" in f.get("error", "") for k, f in r)
                     for r in reports[:2])
        return "stopped" if forked else "MISSED"
    if any("computed it wrong" in line for line in named.lines):
        return "caught"
    return "harmless"


def reference_hashes(units: Any) -> list[str]:
    gemm = select_gemm(units, order=["numpy_int"], audit_every=NEVER, check=False)
    trainer = build_trainer(RunConfig.from_dict(ROOM), arithmetic=(units, gemm))

    async def steps() -> list[str]:
        return [(await trainer.step()).hash for _ in range(ROOM["steps"])]

    return asyncio.run(steps())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per mutant")
    parser.add_argument("--no-cross-peer", dest="cross_peer", action="store_false",
                        help="skip the cross-peer column (its room runs take about a minute)")
    args = parser.parse_args(argv)
    quiet = logging.getLogger("pynode")  # every demotion and dispute logs a line
    propagate, quiet.propagate = quiet.propagate, False
    try:
        return report(args)
    finally:
        quiet.propagate = propagate


def report(args: argparse.Namespace) -> int:
    units = load_default_units()
    gate = ExactGate(ReferenceBackend(units.mul_lut))
    results = [score(cls, units, gate) for cls in classes()]
    rooms: dict[str, str] = {}
    if args.cross_peer:
        reference = reference_hashes(units)
        rooms = {cls.name: cross_peer(cls, units, reference) for cls in classes()}
    total = len(results)
    shares = {
        "gate": sum(r.gate for r in results),
        "gate without the grid": sum(r.gate and not r.gate_case.startswith("grid_")
                                     for r in results),
        "gate + per-call check": sum(r.check for r in results),
        "per-call check alone": sum(r.check_alone for r in results),
    }
    if rooms:
        harmful = [name for name, seen in rooms.items() if seen != "harmless"]
        shares["cross-peer check alone (caught or stopped, of those the room notices)"] = sum(
            rooms[name] in ("caught", "stopped") for name in harmful)
    if args.json:
        for r in results:
            print(json.dumps({**dataclasses.asdict(r), **(
                {"cross_peer": rooms[r.name]} if rooms else {})}))
        summary = {"mutants": total, **{k: v / total for k, v in shares.items()}}
        if rooms:
            harmful = sum(seen != "harmless" for seen in rooms.values())
            key = "cross-peer check alone (caught or stopped, of those the room notices)"
            summary[key] = shares[key] / max(1, harmful)
            summary["wrong at the room's shapes"] = harmful
        print(json.dumps(summary))
    else:
        width = max(len(r.name) for r in results)
        print(f"{'mutant':{width}}  {'gate':28}  gate+check  check alone"
              + ("  cross-peer alone" if rooms else ""))
        for r in results:
            gate_col = r.gate_case if r.gate else "passed"
            print(f"{r.name:{width}}  {gate_col:28}  {'caught' if r.check else 'MISSED':10}  "
                  f"{'caught' if r.check_alone else 'missed':11}  {rooms.get(r.name, '')}")
        print()
        for what, caught in shares.items():
            of = total
            if what.startswith("cross-peer"):
                of = sum(seen != "harmless" for seen in rooms.values())
            print(f"{what:24} {caught:2} of {of} caught ({100 * caught / max(1, of):.0f} %)")
    return 0 if shares["gate + per-call check"] == total else 1


if __name__ == "__main__":
    sys.exit(main())
