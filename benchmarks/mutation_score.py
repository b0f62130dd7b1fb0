"""Mutation score of the GEMM verification: the share of deliberately wrong backends caught.

    python benchmarks/mutation_score.py [--json]

The corpus is tests/core/gemm_mutants.py (each mutant one real kernel bug). For each it
prints the gate case that refused it (`grid_*`: only the structured grid did), whether the
gate + per-call product check kept every wrong product from its caller (the check
recomputes a flagged product on the next gated backend), and whether the check alone,
with no gate in front, would have. It exits 1 if gate + check misses any mutant. A few
seconds; the sampled audit is off throughout, so it is not what is measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "core"))

from gemm_mutants import classes, score  # noqa: E402  (the corpus lives with the tests)

from pynode.core.gemm import ExactGate  # noqa: E402
from pynode.core.gemm.reference import ReferenceBackend  # noqa: E402
from pynode.unitfiles import load_default_units  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per mutant")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # every demotion would log a line
    units = load_default_units()
    gate = ExactGate(ReferenceBackend(units.mul_lut))
    results = [score(cls, units, gate) for cls in classes()]
    total = len(results)
    shares = {
        "gate": sum(r.gate for r in results),
        "gate without the grid": sum(r.gate and not r.gate_case.startswith("grid_")
                                     for r in results),
        "gate + per-call check": sum(r.check for r in results),
        "per-call check alone": sum(r.check_alone for r in results),
    }
    if args.json:
        for r in results:
            print(json.dumps(dataclasses.asdict(r)))
        print(json.dumps({"mutants": total, **{k: v / total for k, v in shares.items()}}))
    else:
        width = max(len(r.name) for r in results)
        print(f"{'mutant':{width}}  {'gate':28}  gate+check  check alone")
        for r in results:
            gate_col = r.gate_case if r.gate else "passed"
            print(f"{r.name:{width}}  {gate_col:28}  {'caught' if r.check else 'MISSED':10}  "
                  f"{'caught' if r.check_alone else 'missed'}")
        print()
        for what, caught in shares.items():
            print(f"{what:24} {caught:2} of {total} caught ({100 * caught / total:.0f} %)")
    return 0 if shares["gate + per-call check"] == total else 1


if __name__ == "__main__":
    sys.exit(main())
