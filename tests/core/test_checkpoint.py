"""Checkpoints: torch-readable .pt bytes written and read without torch; bad files refused."""

import io
import pickle
import struct
import zipfile

import numpy as np
import pytest

from pynode.core import checkpoint as ck
from pynode.core import ptzip
from pynode.core.checkpoint import (
    CheckpointError,
    CheckpointState,
    load_checkpoint,
    save_checkpoint,
)
from pynode.core.optim import AdamState
from pynode.core.statehash import state_hash

CONFIG = {"task": "gpt", "width": 8, "layers": 1, "heads": 2, "seq": 4, "lr": 0.003,
          "vocab": 256, "tags": ["a", 1, None, True, 2.5], "nested": {"k": -(2**40)}}


def make_state(seed: int = 0, **changes) -> CheckpointState:
    rs = np.random.RandomState(seed)
    shapes = {"wte": (256, 8), "blocks.0.w": (8, 24), "ln.b": (8,), "scale": (), "empty": (0, 3)}
    params = {k: np.asarray(rs.standard_normal(s), np.float32) for k, s in shapes.items()}
    m = {k: np.asarray(rs.standard_normal(s) * 0.01, np.float32) for k, s in shapes.items()}
    v = {k: np.asarray(rs.uniform(0, 1e-4, s), np.float32) for k, s in shapes.items()}
    fields = dict(task="gpt", config=dict(CONFIG), step=12, params=params, adam_m=m, adam_v=v,
                  adam_step=12, data_cursor=12)
    fields.update(changes)
    return CheckpointState(**fields)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def same_tensors(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(
        a[k].shape == b[k].shape and np.array_equal(bits(a[k]), bits(b[k])) for k in a)


def raw_file(payload: dict, pkl: bytes | None = None, drop: str | None = None) -> bytes:
    """A .pt archive of any payload (bypassing save's checks), or of a hand-made pickle."""
    pickled, storages = ck._TorchPickler().dump(payload)
    records = [("archive/data.pkl", pkl if pkl is not None else pickled)]
    records += [(f"archive/data/{i}", s) for i, s in enumerate(storages)]
    records.append(("archive/version", b"3\n"))
    return ptzip.write_stored([(n, d) for n, d in records if n != drop])


def payload_of(state: CheckpointState, **changes) -> dict:
    out = {"magic": ck.MAGIC, "format_version": 1, "task": state.task, "config": state.config,
           "step": state.step, "params": state.params, "adam_m": state.adam_m,
           "adam_v": state.adam_v, "adam_step": state.adam_step,
           "data_cursor": state.data_cursor, "state_hash": state.computed_hash()}
    out.update(changes)
    return out


def test_round_trip_is_bit_exact_and_deterministic():
    state = make_state()
    data = save_checkpoint(state)
    back = load_checkpoint(data)
    assert same_tensors(back.params, state.params)
    assert same_tensors(back.adam_m, state.adam_m) and same_tensors(back.adam_v, state.adam_v)
    assert (back.task, back.config, back.step, back.adam_step, back.data_cursor) == (
        "gpt", CONFIG, 12, 12, 12)
    assert back.state_hash == state_hash(state.params, state.adam_state(), 12)
    assert save_checkpoint(back) == data
    assert all(a.flags.writeable and a.flags.c_contiguous for a in back.params.values())
    opt = back.adam_state()
    assert isinstance(opt, AdamState) and opt.step == 12


def test_members_are_aligned_like_torch():
    data = save_checkpoint(make_state())
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
        assert names[0] == "archive/data.pkl" and "archive/version" in names
        for info in zf.infolist():
            assert data_start(data, info) % ptzip.STORAGE_ALIGNMENT == 0, info.filename


def data_start(data: bytes, info: zipfile.ZipInfo) -> int:
    """Where a member's bytes begin, from its local header (name and extra lengths)."""
    at = info.header_offset
    name_len, extra_len = struct.unpack("<HH", data[at + 26 : at + 30])
    return at + 30 + name_len + extra_len


def test_torch_reads_it_natively_with_weights_only():
    torch = pytest.importorskip("torch")
    state = make_state(1)
    loaded = torch.load(io.BytesIO(save_checkpoint(state)), weights_only=True)
    assert loaded["magic"] == ck.MAGIC and loaded["config"] == CONFIG
    for group, arrays in (("params", state.params), ("adam_m", state.adam_m),
                          ("adam_v", state.adam_v)):
        for name, arr in arrays.items():
            t = loaded[group][name]
            assert t.dtype == torch.float32 and tuple(t.shape) == arr.shape
            assert np.array_equal(bits(t.numpy()), bits(arr))


def test_reads_a_file_that_torch_save_wrote():
    torch = pytest.importorskip("torch")
    state = make_state(2)
    payload = payload_of(state)
    for group in ("params", "adam_m", "adam_v"):
        payload[group] = {k: torch.from_numpy(a.copy()) for k, a in payload[group].items()}
    buf = io.BytesIO()
    torch.save(payload, buf)
    back = load_checkpoint(buf.getvalue())
    assert same_tensors(back.params, state.params) and back.state_hash == state.computed_hash()


def test_torch_save_views_and_odd_strides_rebuild_correctly():
    torch = pytest.importorskip("torch")
    state = make_state(3)
    base = torch.from_numpy(np.arange(40, dtype=np.float32).reshape(5, 8))
    params = {**state.params, "blocks.0.w": base.t()[1:, :].contiguous().numpy()}
    st = make_state(3, params=params, adam_m={**state.adam_m, "blocks.0.w": params["blocks.0.w"]},
                    adam_v={**state.adam_v, "blocks.0.w": params["blocks.0.w"]})
    payload = payload_of(st)
    for group in ("params", "adam_m", "adam_v"):
        payload[group] = {k: torch.from_numpy(a.copy()) for k, a in payload[group].items()}
    payload["params"]["blocks.0.w"] = base.t()[1:, :]  # a strided view into a larger storage
    buf = io.BytesIO()
    torch.save(payload, buf)
    assert same_tensors(load_checkpoint(buf.getvalue()).params, st.params)


def test_reads_a_big_endian_archive():
    state = make_state(4)
    pickled, storages = ck._TorchPickler().dump(payload_of(state))
    swapped = [np.frombuffer(b, "<f4").astype(">f4").tobytes() for b in storages]
    records = [("archive/data.pkl", pickled), ("archive/byteorder", b"big")]
    records += [(f"archive/data/{i}", b) for i, b in enumerate(swapped)]
    records.append(("archive/version", b"3\n"))
    back = load_checkpoint(ptzip.write_stored(records))
    assert same_tensors(back.params, state.params) and same_tensors(back.adam_v, state.adam_v)
    records[1] = ("archive/byteorder", b"middle")
    with pytest.raises(CheckpointError, match="byteorder"):
        load_checkpoint(ptzip.write_stored(records))


def test_expectations_checked():
    data = save_checkpoint(make_state())
    shapes = {k: a.shape for k, a in make_state().params.items()}
    load_checkpoint(data, expect={"task": "gpt", "config": {"width": 8, "seq": 4}, "vocab": 256,
                                  "param_shapes": lambda cfg: shapes})
    refusals = {
        "task 'gpt'": {"task": "mlp"},
        "config width": {"config": {"width": 16}},
        "config heads": {"config": {"heads": 2.0}},
        "config depth": {"config": {"depth": 3}},
        "vocab": {"vocab": 512},
        "shape": {"param_shapes": {**shapes, "wte": (512, 8)}},
        "names differ": {"param_shapes": {k: s for k, s in shapes.items() if k != "ln.b"}},
        "unknown expectations": {"dims": 3},
    }
    for message, expect in refusals.items():
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(data, expect=expect)


def test_corrupted_and_truncated_files_refused():
    data = save_checkpoint(make_state())
    with pytest.raises(CheckpointError, match="truncated or damaged"):
        load_checkpoint(data[: len(data) // 2])
    with pytest.raises(CheckpointError):
        load_checkpoint(data[:-5])
    with pytest.raises(CheckpointError):
        load_checkpoint(b"")
    with pytest.raises(CheckpointError):
        load_checkpoint(b"PK\x03\x04" + b"\0" * 100)
    start = data_start(data, zipfile.ZipFile(io.BytesIO(data)).getinfo("archive/data/0"))
    flipped = bytearray(data)
    flipped[start + 17] ^= 0x40
    with pytest.raises(CheckpointError, match="CRC|damaged"):
        load_checkpoint(bytes(flipped))
    with pytest.raises(CheckpointError, match="takes bytes"):
        load_checkpoint("not bytes")


def small_state() -> CheckpointState:
    """A checkpoint of a few hundred bytes of tensors: every byte of it flipped is cheap."""
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}
    zeros = {k: np.zeros_like(v) for k, v in params.items()}
    return CheckpointState(task="t", config={"width": 3}, step=1, params=params, adam_m=zeros,
                           adam_v=zeros, adam_step=1, data_cursor=1)


def accepted_flips(data: bytes) -> list[int]:
    """The places where a flipped bit (bit place % 8 of byte place) still loads."""
    kept = []
    for place in range(len(data)):
        flipped = bytearray(data)
        flipped[place] ^= 1 << (place % 8)
        try:
            load_checkpoint(bytes(flipped))
        except CheckpointError:
            continue
        kept.append(place)
    return kept


def test_every_flipped_bit_is_refused():
    """CHECKPOINTS.md says a flipped byte is refused. zipfile reads only the fields it
    needs, so 880 places of a 3 KB checkpoint could be flipped and still load: a local
    header's sizes, the alignment padding, a directory entry's attributes and lengths (a
    flipped `archive/version` name, which torch.load refuses, among them)."""
    data = save_checkpoint(small_state())
    assert accepted_flips(data) == []
    cut = data.rfind(b"version")
    renamed = data[:cut - 1] + b"Q" + data[cut:]  # archive/version -> archiveQversion
    with pytest.raises(CheckpointError, match="'archiveQversion' is not a record this reader "
                       "knows"):
        load_checkpoint(renamed)
    with pytest.raises(CheckpointError, match="end record"):
        load_checkpoint(data + b"\0")
    out = io.BytesIO()  # the same members packed by Python's zipfile: attributes, a time
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as dest:
        for info in source.infolist():
            dest.writestr(info.filename, source.read(info))
    with pytest.raises(CheckpointError, match="packed again by another zip tool"):
        load_checkpoint(out.getvalue())
    out = io.BytesIO()  # 65,535 members, as a torch.save of 70,000 tensors: named as a limit
    with zipfile.ZipFile(out, "w") as dest:
        for key in range(0xFFFF):
            dest.writestr(f"archive/data/{key}", b"")
    with pytest.raises(CheckpointError, match="over this reader's limits"):
        load_checkpoint(out.getvalue())


def test_a_file_torch_wrote_is_refused_wherever_a_bit_flips_but_in_one_field():
    torch = pytest.importorskip("torch")
    buffer = io.BytesIO()
    state = small_state()
    torch.save({**payload_of(state), "state_hash": state.computed_hash(),
                **{k: {n: torch.from_numpy(a) for n, a in getattr(state, k).items()}
                   for k in ("params", "adam_m", "adam_v")}}, buffer)
    data = buffer.getvalue()
    load_checkpoint(data)
    # what torch's zip64 end record says made it, which nothing reads
    made_by = data.rfind(b"PK\x06\x06") + 12
    assert set(accepted_flips(data)) <= {made_by, made_by + 1}


@pytest.mark.parametrize(("changes", "message"), [
    ({"magic": "SOMETHING-ELSE"}, "magic"),
    ({"format_version": 2}, "format version 2"),
    ({"format_version": True}, "format version"),
    ({"step": -1}, "step"),
    ({"data_cursor": 1.5}, "data_cursor"),
    ({"task": ""}, "task"),
    ({"config": {"t": np.zeros(2, np.float32)}}, "JSON"),
    ({"state_hash": "abc"}, "sha256"),
    ({"extra_key": 1}, "unknown"),
])
def test_bad_contents_refused(changes, message):
    state = make_state()
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(raw_file(payload_of(state, **changes)))


def test_nan_inside_refused():
    state = make_state()
    for group in ("params", "adam_m", "adam_v"):
        arrays = {k: a.copy() for k, a in getattr(state, group).items()}
        arrays["ln.b"][3] = np.nan
        with pytest.raises(CheckpointError, match=rf"{group}\['ln.b'\].*NaN"):
            load_checkpoint(raw_file(payload_of(state, **{group: arrays})))


def test_dims_mismatch_between_params_and_moments_refused():
    state = make_state()
    m = {**state.adam_m, "wte": np.zeros((8, 256), np.float32)}
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(raw_file(payload_of(state, adam_m=m)))
    with pytest.raises(CheckpointError, match="float32"):
        load_checkpoint(raw_file(payload_of(state, params={
            **state.params, "ln.b": state.params["ln.b"].astype(np.float64)})))


def test_hash_mismatch_refused():
    state = make_state()
    other = make_state(9)
    with pytest.raises(CheckpointError, match="state hash mismatch"):
        load_checkpoint(raw_file(payload_of(state, state_hash=other.computed_hash())))
    edited = {**state.params, "ln.b": state.params["ln.b"] + np.float32(1e-3)}
    with pytest.raises(CheckpointError, match="state hash mismatch"):
        load_checkpoint(raw_file(payload_of(state, params=edited,
                                            state_hash=state.computed_hash())))


def test_malicious_pickle_refused_without_running_anything(tmp_path):
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Evil(str(marker)), protocol=2)
    assert b"system" in evil
    with pytest.raises(CheckpointError, match="refused: the pickle references"):
        load_checkpoint(raw_file({}, pkl=evil))
    assert not marker.exists()
    builtin = b"\x80\x02cbuiltins\neval\nX\x04\x00\x00\x001+1\x85R."
    with pytest.raises(CheckpointError, match="builtins.eval"):
        load_checkpoint(raw_file({}, pkl=builtin))


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.path}",))


def test_storage_problems_refused():
    state = make_state()
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(raw_file(payload_of(state), drop="archive/data/1"))
    pickled, storages = ck._TorchPickler().dump(payload_of(state))
    storages[0] = storages[0][:-4]
    short = ptzip.write_stored([("archive/data.pkl", pickled), ("archive/version", b"3\n")] + [
        (f"archive/data/{i}", s) for i, s in enumerate(storages)])
    with pytest.raises(CheckpointError, match="expected"):
        load_checkpoint(short)
    overreach = pickled.replace(b"(K\x08K\x01t", b"(K\x09K\x01t", 1)  # stride 8 -> 9
    assert overreach != pickled
    with pytest.raises(CheckpointError, match="past its storage"):
        load_checkpoint(raw_file(payload_of(state), pkl=overreach))


def test_tensor_hooks_metadata_and_odd_flags_refused():
    state = make_state()
    pickled, _ = ck._TorchPickler().dump(payload_of(state))
    tail = b"\x89ccollections\nOrderedDict\n)Rt"
    assert tail in pickled
    edits = (
        b"\x89ccollections\nOrderedDict\n)R}X\x01\x00\x00\x00aK\x01st",  # metadata {'a': 1}
        b"\x89ccollections\nOrderedDict\n](K\x01K\x02\x86e\x85Rt",  # hooks {1: 2}
        b"K\x01ccollections\nOrderedDict\n)Rt",  # requires_grad 1, not a bool
    )
    for replacement in edits:
        with pytest.raises(CheckpointError, match="hooks or metadata"):
            load_checkpoint(raw_file(payload_of(state), pkl=pickled.replace(tail, replacement, 1)))


def test_save_refuses_bad_state_and_produces_nothing():
    state = make_state()
    nan_params = {**state.params, "scale": np.asarray(np.float32("nan"))}
    bad = [
        make_state(params=nan_params),
        make_state(adam_m={k: a for k, a in state.adam_m.items() if k != "wte"}),
        make_state(params={**state.params, "wte": state.params["wte"].astype(np.float16)}),
        make_state(config={"lr": float("inf")}),
        make_state(config={"shape": (1, 2)}),
        make_state(step=True),
        make_state(state_hash="0" * 64),
        make_state(params={}),
    ]
    for s in bad:
        with pytest.raises(CheckpointError):
            save_checkpoint(s)
