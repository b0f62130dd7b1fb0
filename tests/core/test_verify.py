"""`python -m pynode verify` in-process: a corrupted LUT cell or a wrong backend fails it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

import pynode.unitfiles
from pynode import verify


def corrupted_units(table: str, index: tuple[int, ...]):
    units = pynode.unitfiles.load_default_units()
    lut = getattr(units, table).copy()
    lut[index] += 1
    return dataclasses.replace(units, **{table: lut})


def test_verify_passes_on_the_shipped_units(capsys):
    assert verify.verify_command() == 0
    out = capsys.readouterr().out
    assert "verify passed" in out
    for row in ("unit mul8", "unit requant16", "unit relu8", "LUT == integer op", "exact gate",
                "bit generator", "kernel gate", "backend per shape"):
        assert row in out


def test_verify_json_marks_no_timing_row_failed(capsys):
    """`verify --json` of a passing verify gave every timing row "passed": false: a script
    checking all of them called a healthy machine failed (a trial)."""
    assert verify.verify_command(json_rows=True) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()
            if line.startswith("{")]
    timings = [r for r in rows if r["result"] == "measured"]
    assert timings and all(r["passed"] is None for r in timings)
    assert not [r for r in rows if r["passed"] is False], rows
    assert all(r["passed"] is True for r in rows if r["result"] == "pass")


def test_backend_per_shape_rows_name_a_gated_backend_and_its_times():
    rows = verify.run_checks()
    gated = [r.backend for r in rows if r.check == "exact gate" and r.passed]
    routes = [r for r in rows if r.check == "backend per shape"]
    assert len(routes) >= 5  # the default model's distinct GEMM shapes
    for r in routes:
        assert r.backend in gated and r.backend != "reference"
        fastest = r.domain.split(": ")[1].split(" ")[0]  # listed fastest first
        assert r.backend in (fastest, gated[0])  # near-ties stay with the first gated


def test_a_corrupted_lut_cell_fails_verify_with_its_address(monkeypatch, capsys):
    bad = corrupted_units("mul_lut", (255, 255))  # 127 * 127, the last row and column
    monkeypatch.setattr(pynode.unitfiles, "load_default_units", lambda: bad)
    assert verify.verify_command() == 1
    out = capsys.readouterr().out
    lut_row = next(line for line in out.splitlines() if line.startswith("LUT == integer op"))
    assert "FAIL" in lut_row and "a=127, b=127" in lut_row
    assert "verify FAILED" in out


def test_a_corrupted_requant_cell_fails_verify(monkeypatch, capsys):
    bad = corrupted_units("requant_lut", (0,))
    monkeypatch.setattr(pynode.unitfiles, "load_default_units", lambda: bad)
    assert verify.verify_command(json_rows=True) == 1
    assert "x=-32768" in capsys.readouterr().out


def test_gate_rows_fail_for_a_backend_with_one_wrong_cell(monkeypatch):
    from pynode.core.gemm import select

    real = select.make_backend

    class OffByOne:
        def __init__(self, inner):
            self.inner, self.name = inner, inner.name

        def matmul(self, a, b):
            out = self.inner.matmul(a, b)
            out[-1, -1] += 1
            return out

        def bmm(self, a, b):
            out = self.inner.bmm(a, b)
            out[..., -1, -1] += 1
            return out

    def broken(name, lut):
        backend = real(name, lut)
        return OffByOne(backend) if name == "numpy_int" else backend

    monkeypatch.setattr("pynode.gemm_backends.make_backend", broken)
    units = pynode.unitfiles.load_default_units()
    rows = {row.backend: row for row in verify.gate_rows(units)}
    assert rows["numpy_int"].result.startswith("FAIL")
    assert rows["blas_float"].passed and rows["reference"].passed
    assert np.array_equal(units.mul_lut, pynode.unitfiles.load_default_units().mul_lut)
