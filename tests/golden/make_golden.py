"""Write tests/golden/golden_v2.npz: inputs and expected outputs for every core function.

Run natively only, from the reference implementation (see README.md beside this file):

    python tests/golden/make_golden.py [--out PATH] [--allow-missing]

Expected outputs come from integer arithmetic where the contract defines them (units LUTs,
GEMM results) and otherwise from the current native pynode/numpy functions, evaluated by
the same `run_case` that tests/core/test_golden.py uses to check them. Inputs are drawn from
a fixed-seed numpy generator: they are stored in the file, so their source does not matter.
The file's bytes depend only on its contents (sorted entries, fixed zip timestamps).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO))

from golden_cases import FAMILY_BUILDERS  # noqa: E402  (next to this file)


def _load_checker():
    path = REPO / "tests" / "core" / "test_golden.py"
    spec = importlib.util.spec_from_file_location("golden_checker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class GoldenWriter:
    """Collects cases and their arrays; evaluates a case unless its expectation is given."""

    def __init__(self, checker) -> None:
        self.checker = checker
        self.cases: list[dict] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.context = {"units": checker.default_units}

    def _encode(self, name: str, value):
        if isinstance(value, np.ndarray):
            self.arrays[name] = value
            return {"npz": name}
        if isinstance(value, tuple):
            return {"tuple": [int(v) for v in value]}
        return value

    def add(self, family: str, name: str, call: str, *args, expect=None, **kwargs) -> None:
        """Add case `family.name`: call(*args, **kwargs) must give `expect` (computed if None).

        `expect` is a list of arrays (from integer arithmetic) or an error class name.
        """
        full = f"{family}.{name}"
        assert all(c["name"] != full for c in self.cases), f"duplicate case {full}"
        case = {
            "name": full,
            "family": family,
            "call": call,
            "args": [self._encode(f"{full}.arg{i}", a) for i, a in enumerate(args)],
            "kwargs": {k: self._encode(f"{full}.{k}", v) for k, v in kwargs.items()},
            "expected_from": "integer arithmetic" if expect is not None else "reference run",
        }
        if expect is None:
            expect = self.checker.run_case(case, self.arrays, self.context)
        if isinstance(expect, str):
            case["raises"] = expect
        else:
            case["outputs"] = [f"{full}.out{i}" for i in range(len(expect))]
            for ref, array in zip(case["outputs"], expect, strict=True):
                self.arrays[ref] = np.asarray(array).copy(order="C")  # keeps 0-d shapes
        self.cases.append(case)

    def drop_family(self, family: str) -> None:
        self.cases = [c for c in self.cases if c["family"] != family]
        self.arrays = {k: v for k, v in self.arrays.items() if not k.startswith(family + ".")}

    def to_bytes(self, families: list[str]) -> bytes:
        header = np.frombuffer(
            self.checker.MAGIC + struct.pack("<I", self.checker.VERSION), np.uint8
        )
        index = {
            "generator": "tests/golden/make_golden.py",
            "numpy": np.__version__,
            "families": families,
            "cases": self.cases,
        }
        entries = {
            "header": header,
            "index": np.frombuffer(json.dumps(index, indent=1).encode(), np.uint8),
            **self.arrays,
        }
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as zf:
            for name in sorted(entries):
                info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                npy = io.BytesIO()
                np.lib.format.write_array(npy, entries[name], allow_pickle=False)
                zf.writestr(info, npy.getvalue(), compresslevel=9)
        return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "golden_v2.npz")
    parser.add_argument(
        "--allow-missing",
        action="store_true",
        help="leave out a family whose module does not import yet (never for a committed file)",
    )
    args = parser.parse_args(argv)
    writer = GoldenWriter(_load_checker())
    families = []
    for family, build in FAMILY_BUILDERS.items():
        try:
            build(writer)
        except ImportError as exc:
            if not args.allow_missing:
                raise SystemExit(f"{family}: {exc} (--allow-missing while it is written)") from exc
            writer.drop_family(family)
            print(f"skipped {family}: {exc}")
            continue
        families.append(family)
    data = writer.to_bytes(families)
    args.out.write_bytes(data)
    print(f"wrote {args.out.name}: {len(writer.cases)} cases, families {families}, "
          f"{len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
