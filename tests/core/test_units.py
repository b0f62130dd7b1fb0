"""Verified INT8 units: every shipped path over its full domain, and every refusal."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from pynode.core.errors import ShapeError, UnitVerificationError
from pynode.core.units import UnitCounter, UnitCountError, certify_luts, load_units
from pynode.unitfiles import (
    ENV_DIR,
    MANIFEST,
    read_unit_weights,
    weights_dir,
    write_unit_weights,
)

A8 = np.arange(-128, 128, dtype=np.int64)  # (256,) every int8
X16 = np.arange(-32768, 32768, dtype=np.int64)  # (65536,) every int16


@pytest.fixture(scope="module")
def weights():
    return read_unit_weights()


@pytest.fixture(scope="module")
def units(weights):
    return load_units(weights)


def golden_requant(x: np.ndarray) -> np.ndarray:
    # Independent of the shift form: float64 is exact here; round half up = floor(v + 0.5).
    return np.clip(np.floor(x / 256.0 + 0.5), -128, 127).astype(np.int64)


def test_mul_full_domain(units):
    a, b = np.meshgrid(A8, A8, indexing="ij")  # (256, 256) int64
    golden = a * b
    before = units.counts.mul
    got = units.mul_array(a.astype(np.int8), b.astype(np.int8))
    assert got.dtype == np.int32 and np.array_equal(got, golden)
    assert units.mul_lut.dtype == np.int32 and np.array_equal(units.mul_lut, golden)
    assert units.counts.mul - before == 65536
    assert got[0, 0] == 16384 and got[0, 255] == -16256  # (-128)(-128), (-128)(127)


def test_mul_array_broadcasts(units):
    col = A8.astype(np.int8)[:, None]  # (256, 1)
    got = units.mul_array(col, np.array([-128, 3, 127], dtype=np.int8))
    assert got.shape == (256, 3)
    assert np.array_equal(got, A8[:, None] * np.array([-128, 3, 127]))


def test_requant_full_domain(units):
    before = units.counts.requant
    got = units.requant_array(X16.astype(np.int16))
    assert got.dtype == np.int8
    assert np.array_equal(got, golden_requant(X16))
    assert np.array_equal(units.requant_lut, golden_requant(X16))
    assert units.counts.requant - before == 65536
    ties = {128: 1, -128: 0, -384: -1, 384: 2, 32639: 127, 32640: 127, 32767: 127, -32768: -128}
    probe = np.array(list(ties), dtype=np.int16)
    assert units.requant_array(probe).tolist() == list(ties.values())


def test_relu_full_domain(units):
    before = units.counts.relu
    got = units.relu_array(A8.astype(np.int8))
    golden = np.where(A8 > 0, A8, 0)
    assert got.dtype == np.int8 and np.array_equal(got, golden)
    assert np.array_equal(units.relu_lut, golden)
    assert units.counts.relu - before == 256


def test_report_and_read_only_tables(units):
    rows = units.verify_report()
    assert [(r.unit, r.domain, r.result) for r in rows] == [
        ("mul8", 65536, "pass"), ("requant16", 65536, "pass"), ("relu8", 256, "pass")]
    assert all(r.seconds >= 0 for r in rows)
    with pytest.raises(ValueError):
        units.mul_lut[0, 0] = 0


def test_bad_operands_refused_and_not_counted(units):
    before = units.counts.snapshot()
    with pytest.raises(ShapeError, match="int8"):
        units.mul_array(np.zeros(3, np.int16), np.zeros(3, np.int8))
    with pytest.raises(ShapeError, match="broadcast"):
        units.mul_array(np.zeros(3, np.int8), np.zeros(4, np.int8))
    with pytest.raises(ShapeError, match="int16"):
        units.requant_array(np.zeros(3, np.int32))
    with pytest.raises(ShapeError, match="int8"):
        units.relu_array([1, 2])
    assert units.counts.snapshot() == before


def test_counter_require_refuses_under_invocation():
    counts = UnitCounter()
    with pytest.raises(UnitCountError, match="mul = 0"):
        counts.require(mul=1)
    counts.add("mul", np.int64(6))
    counts.add("relu", 2)
    counts.require(mul=6, relu=1)
    with pytest.raises(UnitCountError, match="requant = 0"):
        counts.require(mul=1, requant=5)
    assert counts.snapshot() == {"mul": 6, "requant": 0, "relu": 2}
    for bad in ({}, {"mul": 0}, {"gelu": 1}):
        with pytest.raises(UnitCountError):
            counts.require(**bad)
    for name, n in (("mul", -1), ("mul", 1.5), ("mul", True), ("add", 1)):
        with pytest.raises(UnitCountError):
            counts.add(name, n)
    assert counts.snapshot() == {"mul": 6, "requant": 0, "relu": 2}


@pytest.fixture()
def copied_dir(tmp_path):
    target = tmp_path / "weights"
    shutil.copytree(weights_dir(), target)
    return target


def test_bit_flip_refused_by_manifest(copied_dir):
    path = copied_dir / "mul8.npz"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(UnitVerificationError, match=r"mul8\.npz is corrupted: sha256"):
        read_unit_weights(copied_dir)


def test_missing_files_refused(copied_dir):
    (copied_dir / "relu8.npz").unlink()
    with pytest.raises(UnitVerificationError, match=r"relu8\.npz is missing"):
        read_unit_weights(copied_dir)
    (copied_dir / MANIFEST).unlink()
    with pytest.raises(UnitVerificationError, match="MANIFEST.json is missing"):
        read_unit_weights(copied_dir)


def test_env_override(copied_dir, monkeypatch):
    monkeypatch.setenv(ENV_DIR, str(copied_dir))
    assert weights_dir() == copied_dir
    manifest = json.loads((copied_dir / MANIFEST).read_text())
    manifest["files"]["requant16.npz"]["sha256"] = "0" * 64
    (copied_dir / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UnitVerificationError, match="requant16.npz is corrupted"):
        read_unit_weights()


def _with_unit(weights, unit, **changes):
    return {**weights, unit: {**weights[unit], **changes}}


def _relu_wrong_only_at_127(arrays):
    # An extra hidden unit relu(bits0..6 - 6 - 7*bit7) fires only for x = 127 and adds
    # exactly 1 to the output there; every other input is unchanged.
    f0, f1 = (int(f) for f in arrays["frac_bits"])
    column = np.array([1] * 7 + [-7], dtype=np.int64)[:, None] << f0  # (8, 1)
    return {
        "w0": np.hstack([arrays["w0"], column]),
        "b0": np.append(arrays["b0"], -6 << f0),
        "w1": np.vstack([arrays["w1"], [[1 << f1]]]),
    }


def test_network_wrong_on_one_input_refused_by_name(weights, tmp_path):
    bad = _with_unit(weights, "relu8", **_relu_wrong_only_at_127(weights["relu8"]))
    write_unit_weights(bad, tmp_path)  # re-manifested: the files themselves look fine
    reread = read_unit_weights(tmp_path)
    with pytest.raises(UnitVerificationError) as err:
        load_units(reread)
    assert "relu8" in str(err.value) and "x=127" in str(err.value)
    assert "network gives 128, integer op gives 127 (1 wrong" in str(err.value)


def test_perturbed_weight_beyond_margin_refused(weights):
    arrays = weights["mul8"]
    one = 1 << int(arrays["frac_bits"].sum())  # 1.0 at the output's scale
    within = _with_unit(weights, "mul8", b1=arrays["b1"] + one // 10)
    load_units(within)  # the shipped margin is >= 1/4, so a 0.1 drift changes nothing
    beyond = _with_unit(weights, "mul8", b1=arrays["b1"] + one)
    with pytest.raises(UnitVerificationError, match=r"mul8: .* at a=-128, b=-128: network gives"):
        load_units(beyond)


MALFORMED = {
    "missing unit": lambda w: {k: v for k, v in w.items() if k != "relu8"},
    "wrong encoding": lambda w: _with_unit(w, "relu8", encoding=np.array("bits16")),
    "wrong version": lambda w: _with_unit(w, "relu8", format_version=np.array(2)),
    "wrong shape": lambda w: _with_unit(w, "requant16", w0=w["requant16"]["w0"][:8]),
    "float weights": lambda w: _with_unit(w, "relu8", w1=w["relu8"]["w1"].astype(np.float64)),
    "could overflow": lambda w: _with_unit(w, "relu8", w0=w["relu8"]["w0"] << 30),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_weights_refused(weights, case):
    with pytest.raises(UnitVerificationError):
        load_units(MALFORMED[case](weights))


@pytest.mark.parametrize(
    ("field", "cell", "message"),
    [
        ("mul_lut", (200, 3), r"mul_lut\[a=72, b=-125\] = -8999, integer op gives -9000"),
        ("requant_lut", (32768 + 128,), r"requant_lut\[x=128\]"),
        ("relu_lut", (0,), r"relu_lut\[x=-128\]"),
    ],
)
def test_certify_luts_catches_a_corrupted_cell(units, field, cell, message):
    certify_luts(units)
    table = getattr(units, field).copy()
    table[cell] += 1
    with pytest.raises(UnitVerificationError, match=message):
        certify_luts(dataclasses.replace(units, **{field: table}))
    with pytest.raises(UnitVerificationError, match="must be int"):
        certify_luts(dataclasses.replace(units, **{field: table.astype(np.int64)}))


def test_written_files_are_reproducible_and_small(weights, tmp_path):
    sizes = write_unit_weights(weights, tmp_path / "a")
    write_unit_weights(weights, tmp_path / "b")
    for name, size in sizes.items():
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert size < 100_000
    shipped = json.loads((weights_dir() / MANIFEST).read_text())["files"]
    assert {k: v["sha256"] for k, v in shipped.items()} == {
        k: v["sha256"]
        for k, v in json.loads((tmp_path / "a" / MANIFEST).read_text())["files"].items()
    }
