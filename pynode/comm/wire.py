"""Frames of the star protocol: a fixed 32-byte header, then `length` payload bytes.

Header (little-endian): magic b"DCHN", version u8, kind u8, status u8, pad u8,
seq u32, rank i32, arg i64, length u64. `status` is 0 or a refusal code of base.py;
`arg` is the broadcast root where one is needed.

`pack_message` / `unpack_message` is the one codec of structured messages: a u32 length, a
JSON object, then a binary blob. Star results, the run protocol (pynode.run.protocol), the
cluster bridge and every transport's int64 reductions use it.

An int64 vector as the blob travels losslessly compressed, since reductions are most of the
traffic: zigzag (small magnitudes of either sign become small unsigned words), then its
eight byte planes, lowest first. A fixed-point gradient of ~26 significant bits has zero
upper planes (a code byte each), noise in the lowest (sent raw: deflate would spend time
for nothing) and a mostly-zero plane between, which raw deflate with run-length matching
packs (zlib's Z_RLE, level 1; Pyodide has zlib too). So is a plane of skewed bytes without
zeros, for its Huffman codes: the low plane of an outer step's second-moment codes
(pynode.run.outer), 11 % of a --sync-every run's bytes (benchmarks/README.md). About 2.3x
fewer bytes for a per-step gradient, ~1 ms per 119k values each way, most of it zlib's
(numba makes the planes in one pass where it imports: 0.03 ms, numpy's ~0.9; zlib-ng, where
it imports, deflates and inflates the same streams ~2x faster); the decoded vector is the
same bits, so sums are unchanged. Peers of one machine pack with `local` (the loopback
group), where no network repays deflate's time: bit-packed blocks instead (blocks.py, a
leading code byte tells them apart), as few bytes for a gradient in a third of the time.
Every receiver reads both forms. The head names its element count under INT64_KEY, which
unpack_message removes again.
"""

from __future__ import annotations

import functools
import json
import logging
import struct
import zlib
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np

from pynode.comm import blocks
from pynode.comm.base import CollectiveUsageError, CommError

log = logging.getLogger(__name__)

MAGIC = b"DCHN"
VERSION = 1
HEADER = struct.Struct("<4sBBBxIiqQ")
_META_LEN = struct.Struct("<I")
INT64_KEY = "int64"  # head key of a message whose blob is a packed int64 vector: its length
_DEFLATE_RAW = -15  # zlib wbits: a raw deflate stream, no zlib header or checksum
# A packed int64 vector is eight byte planes, lowest first, each a code byte and then:
_PLANE_ZERO = b"\x00"  # nothing (every byte of the plane is zero)
_PLANE_RAW = b"\x01"  # its n bytes
_PLANE_DEFLATED = b"\x02"  # u32 length, then the plane as raw deflate
_PLANE_LEN = struct.Struct("<I")
# A plane is deflated when it has at least 1/16 zero bytes (runs to match) or its bytes'
# entropy is below _NOISE_BITS (Huffman codes save > ~6 %); other planes are noise, sent raw.
_MOSTLY_NOISE = 16
_NOISE_BITS = 7.5
# Where the bytes cross no network (`local`: peers of one machine) the vector is this code
# byte, then blocks.py's bit-packed blocks; a first plane's code is never 3.
_BLOCKS = b"\x03"
_ENTROPY_SAMPLE = 4096  # bytes of a plane its entropy is estimated from


class MessageError(CommError):
    """A structured message that does not decode (truncated, not JSON, not an object)."""


class Kind(IntEnum):
    HELLO = 1  # peer -> hub: JSON {rank, world_size, group, version}
    WELCOME = 2  # hub -> peer: meta {members}; the group is formed
    ALLREDUCE = 3
    BROADCAST = 4
    ALLGATHER = 5
    BARRIER = 6
    DROP = 7  # hub -> peer: you missed a deadline and are no longer a member
    BYE = 8  # either way: orderly close
    PART = 9  # hub -> the one other member: the hub's own packed int64 contribution



class Frame(NamedTuple):
    kind: Kind
    status: int
    seq: int
    rank: int
    arg: int
    payload: bytes


def encode_header(frame: Frame) -> bytes:
    return HEADER.pack(
        MAGIC,
        VERSION,
        frame.kind,
        frame.status,
        frame.seq & 0xFFFFFFFF,
        frame.rank,
        frame.arg,
        len(frame.payload),
    )


def decode_header(raw: bytes, max_payload: int) -> tuple[Kind, int, int, int, int, int]:
    """(kind, status, seq, rank, arg, length) of a header; CommError on anything foreign."""
    magic, version, kind, status, seq, rank, arg, length = HEADER.unpack(raw)
    if magic != MAGIC:
        raise CommError(f"not a DaisyChain frame (magic {magic!r})")
    if version != VERSION:
        raise CommError(f"wire version {version}, this peer speaks {VERSION}")
    try:
        kind = Kind(kind)
    except ValueError:
        raise CommError(f"unknown frame kind {kind}") from None
    if length > max_payload:
        raise CommError(f"frame of {length} bytes exceeds the limit of {max_payload}")
    return kind, status, seq, rank, arg, length


def pack_message(head: dict[str, Any], blob: bytes | np.ndarray = b"", *,
                 local: bool = False) -> bytes:
    """u32 length, the JSON object `head`, then `blob`; a (n,) int64 `blob` is packed
    (pack_int64, `local` as there) and `unpack_message` gives it back as the same array."""
    if isinstance(blob, np.ndarray):
        if INT64_KEY in head:
            raise CollectiveUsageError(f"the head key {INT64_KEY!r} is the codec's own")
        head = {**head, INT64_KEY: int(blob.shape[0]) if blob.ndim == 1 else -1}
        blob = pack_int64(blob, local=local)
    text = json.dumps(head, separators=(",", ":")).encode()
    return _META_LEN.pack(len(text)) + text + blob


def unpack_message(data: bytes | memoryview) -> tuple[dict[str, Any], Any]:
    """(head, blob) of a `pack_message`: blob is bytes, or the (n,) int64 array that was
    packed; MessageError for anything malformed."""
    try:
        (n,) = _META_LEN.unpack_from(data)
        if _META_LEN.size + n > len(data):
            raise ValueError(f"JSON of {n} bytes in a message of {len(data)}")
        head = json.loads(bytes(data[_META_LEN.size : _META_LEN.size + n]))
    except (struct.error, ValueError) as exc:
        raise MessageError(f"malformed message: {exc}") from None
    if not isinstance(head, dict):
        raise MessageError("malformed message: its head is not a JSON object")
    blob = bytes(data[_META_LEN.size + n :])
    if INT64_KEY not in head:
        return head, blob
    return head, unpack_int64(blob, head.pop(INT64_KEY))


def int64_saving(message: bytes, head: dict[str, Any], vector: np.ndarray) -> int:
    """Bytes the codec kept off the wire in `message` == pack_message(head, vector): what
    the message with `vector` as raw int64 bytes would have taken, less its length."""
    return len(pack_message(head)) + vector.nbytes - len(message)


def pack_int64(x: np.ndarray, *, local: bool = False) -> bytes:
    """The byte planes of zigzag(x), x (n,) int64, each zero, raw or deflated; see the
    module's docstring. `local`: the bytes stay on this machine (a loopback group), so they
    are bit-packed blocks (blocks.py): about the bytes of the planes for a gradient,
    without deflate's time, which a network link repays and a local socket does not.
    Either way unpack_int64 reads it."""
    if x.dtype != np.int64 or x.ndim != 1:
        raise CollectiveUsageError(f"pack_int64 takes a 1-D int64 array, got {x.dtype} "
                                   f"of shape {x.shape}")
    x = np.ascontiguousarray(x)
    if local:
        return _pack_blocks(x)
    native = _native_planes()
    planes = native[0](x) if native else _zigzag_planes(x)  # (8, n) u8
    n, out = x.shape[0], []
    for plane in planes:
        nonzero = int(np.count_nonzero(plane))
        if nonzero == 0:
            out.append(_PLANE_ZERO)
            continue
        if n - nonzero >= n // _MOSTLY_NOISE or _byte_entropy(plane) < _NOISE_BITS:
            deflated = _deflated(_deflate(), plane)
            if len(deflated) < n:
                out += [_PLANE_DEFLATED, _PLANE_LEN.pack(len(deflated)), deflated]
                continue
        out += [_PLANE_RAW, plane.tobytes()]
    return b"".join(out)


def _byte_entropy(plane: np.ndarray) -> float:
    """Bits per byte of `plane`'s byte histogram (8.0: uniform noise), from at most about
    _ENTROPY_SAMPLE evenly spaced bytes: what deflate's Huffman codes could reach."""
    counts = np.bincount(plane[:: max(1, plane.shape[0] // _ENTROPY_SAMPLE)], minlength=256)
    p = counts[counts > 0] / counts.sum()  # (distinct bytes,) f64
    return float(-(p * np.log2(p)).sum())


def unpack_int64(data: bytes, length: Any) -> np.ndarray:
    """The (length,) int64 vector `pack_int64` packed into `data`; MessageError unless
    `data` holds exactly eight planes of `length` bytes."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise MessageError(f"malformed message: int64 length {length!r}")
    if data[:1] == _BLOCKS:
        return _unpack_blocks(data, length)
    planes = np.empty((8, length), np.uint8)  # (8, n) u8
    at = 0
    try:
        for plane in planes:
            code, at = data[at : at + 1], at + 1
            if code == _PLANE_ZERO:
                plane[:] = 0
            elif code == _PLANE_RAW:
                plane[:] = np.frombuffer(data[at : at + length], np.uint8)
                at += length
            elif code == _PLANE_DEFLATED:
                (size,) = _PLANE_LEN.unpack_from(data, at)
                plane[:] = np.frombuffer(_inflate(data[at + 4 : at + 4 + size], length), np.uint8)
                at += 4 + size
            else:
                raise ValueError(f"plane code {code!r}")
    except (ValueError, struct.error, zlib.error, _deflate().error) as exc:
        raise MessageError(f"malformed int64 vector of {length} values: {exc}") from None
    if at != len(data):
        raise MessageError(f"malformed int64 vector: {len(data) - at} bytes after its planes")
    native = _native_planes()
    return native[1](planes) if native else _words_of_planes(planes)


def _zigzag_planes(x: np.ndarray) -> np.ndarray:
    """(8, n) u8: the little-endian byte planes of zigzag(x), x (n,) contiguous int64."""
    zigzag = blocks.zigzag(x).astype("<u8", copy=False)  # (n,) u64
    return np.ascontiguousarray(zigzag.view(np.uint8).reshape(-1, 8).T)


def _words_of_planes(planes: np.ndarray) -> np.ndarray:
    """(n,) int64 from the planes (8, n) u8 of _zigzag_planes."""
    zigzag = np.ascontiguousarray(planes.T).view("<u8").reshape(-1)  # (n,) u64 words
    return blocks.unzigzag(zigzag.astype(np.uint64, copy=False))


def _every_magnitude(n: int, shift: Any) -> np.ndarray:
    """(n,) int64 of hashed words shifted right by `shift` (n,) u64 (every magnitude, both
    signs), the int64 extremes first: what native codecs are checked on before first use."""
    i = np.arange(n, dtype=np.uint64)
    words = (i * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)  # wraps: a cheap hash
    x = words >> shift.astype(np.int64)
    x[:4] = [0, -1, 2**63 - 1, -(2**63)]
    return x


@functools.cache
def _native_planes() -> tuple[Any, Any] | None:
    """numba's one-pass _zigzag_planes and _words_of_planes (pynode.native_codec), where
    numba imports and both give the numpy functions' bits on a vector of every magnitude
    and of both signs; else None (Pyodide, or no `fast` extra): the numpy functions."""
    from pynode import native_codec

    if native_codec.numba is None:
        return None
    native = native_codec.zigzag_planes, native_codec.words_of_planes
    i = np.arange(1031, dtype=np.uint64)  # not a multiple of any vector width
    x = _every_magnitude(1031, i % np.uint64(64))
    planes = _zigzag_planes(x)
    if not (np.array_equal(native[0](x), planes) and np.array_equal(native[1](planes), x)):
        log.warning("numba's int64 codec planes differ from numpy's; packing with numpy")
        return None
    return native


def _pack_blocks(x: np.ndarray) -> bytes:
    """_BLOCKS, then blocks.py's widths and stream of x (n,) contiguous int64."""
    native = _native_blocks()
    if native is None:
        widths, words = blocks.pack(x)
    else:
        widths = np.empty(-(-x.shape[0] // blocks.BLOCK), np.uint8)
        words = np.empty(x.shape[0] + 2, np.uint64)  # 64 bits a value at most, and a spill
        words = words[: native.pack(x, blocks.BLOCK, widths, words)]
    return _BLOCKS + widths.tobytes() + words.astype("<u8", copy=False).tobytes()


def _unpack_blocks(data: bytes, length: int) -> np.ndarray:
    """The (length,) int64 of a _pack_blocks; MessageError unless `data` holds exactly
    its widths (each at most 64) and its stream."""
    count = -(-length // blocks.BLOCK)
    widths = np.frombuffer(data, np.uint8, count, 1) if len(data) >= 1 + count else None
    if widths is None or (count and int(widths.max()) > 64):
        raise MessageError(f"malformed int64 blocks of {length} values: bad or missing widths")
    words = blocks.stream_words(widths, length)
    if len(data) != 1 + count + 8 * words:
        raise MessageError(f"malformed int64 blocks of {length} values: {len(data)} bytes, "
                           f"not {1 + count + 8 * words}")
    stream = np.frombuffer(data, "<u8", words, 1 + count).astype(np.uint64, copy=False)
    native = _native_blocks()
    if native is None:
        return blocks.unpack(widths, stream, length)
    out = np.empty(length, np.int64)
    native.unpack(widths, stream, blocks.BLOCK, out)
    return out


@functools.cache
def _native_blocks() -> Any:
    """numba's bit-packed blocks (pynode.native_codec) where numba imports and they give
    the numpy form's bytes and values on a vector of every magnitude, both signs and a
    zero block; else None (Pyodide, or no `fast` extra): the numpy form."""
    from pynode import native_codec

    if native_codec.numba is None:
        return None
    i = np.arange(1031, dtype=np.uint64)  # blocks of every width, a short last one
    x = _every_magnitude(1031, i // np.uint64(blocks.BLOCK) * np.uint64(2) % np.uint64(64))
    x[64:96] = 0  # a zero block between others
    widths, stream = blocks.pack(x)
    got_widths = np.empty_like(widths)
    got = np.empty(x.shape[0] + 2, np.uint64)
    got = got[: native_codec.pack(x, blocks.BLOCK, got_widths, got)]
    back = np.empty_like(x)
    native_codec.unpack(widths, stream, blocks.BLOCK, back)
    if not (np.array_equal(got_widths, widths) and np.array_equal(got, stream)
            and np.array_equal(back, x) and np.array_equal(blocks.unpack(widths, stream,
                                                                         x.shape[0]), x)):
        log.warning("numba's bit-packed blocks differ from numpy's; packing with numpy")
        return None
    return native_codec


@functools.cache
def _deflate() -> Any:
    """zlib-ng's drop-in zlib module (the `fast` extra) where it imports and its raw deflate
    streams and plain zlib's read each other back: the same stream format, ~2x faster both
    ways (docs/DEPENDENCIES.md); else zlib (Pyodide, or no extra). Either reads what the
    other wrote."""
    try:
        from zlib_ng import zlib_ng
    except ImportError:
        return zlib
    plane = bytes(range(256)) * 8 + bytes(3000) + b"\x07" * 500  # noise, a zero run, a run
    try:
        both = (zlib.decompress(_deflated(zlib_ng, plane), _DEFLATE_RAW) == plane
                and zlib_ng.decompress(_deflated(zlib, plane), _DEFLATE_RAW) == plane)
    except (zlib.error, zlib_ng.error):
        both = False
    if not both:
        log.warning("zlib-ng's deflate streams do not round-trip with zlib's; using zlib")
        return zlib
    return zlib_ng


def _deflated(flate: Any, plane: Any) -> bytes:
    """`plane` as one raw deflate stream: level 1, run-length matches (Z_RLE)."""
    packer = flate.compressobj(1, flate.DEFLATED, _DEFLATE_RAW, 9, flate.Z_RLE)
    return packer.compress(plane) + packer.flush()


def _inflate(data: bytes, length: int) -> bytes:
    """Exactly `length` bytes deflated in `data`, or ValueError (never more than that)."""
    inflater = _deflate().decompressobj(_DEFLATE_RAW)
    raw = inflater.decompress(data, length + 1)
    if len(raw) != length or not inflater.eof or inflater.unused_data:
        raise ValueError(f"a deflated plane of {len(raw)} bytes, not {length}")
    return raw
