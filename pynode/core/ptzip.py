"""The zip container of a .pt file, as torch writes it and torch.load reads it.

Members are stored (never compressed), each starting on a STORAGE_ALIGNMENT boundary
(torch's "FB" extra field pads the local header), under one folder. Reading checks more
than zipfile does: zipfile reads only the fields it needs, so a flipped bit in a local
header, the padding or a directory entry's lengths or attributes went unseen, where
torch.load, which reads other fields, refuses some such files. Here every byte of an
archive pynode wrote is checked (docs/CHECKPOINTS.md, "What loading checks").

pynode/core/checkpoint.py is its one user: the pickle and the tensors inside.
"""

from __future__ import annotations

import io
import re
import struct
import zipfile
import zlib

from pynode.core.errors import DaisyError

STORAGE_ALIGNMENT = 64
ZIP64_EXTRA = b"\x01\x00"  # the extra field of a member past zip's 4 GiB fields
# the members a .pt archive holds, under its folder: ours, and those torch.save writes
_RECORD = re.compile(r"data\.pkl|data/\d+|version|byteorder|\.format_version"
                     r"|\.storage_alignment|\.data/version|\.data/serialization_id")


class ArchiveError(DaisyError, ValueError):
    """An archive that is not a .pt file's (damaged, truncated, or packed otherwise); the
    checkpoint loader says it as a CheckpointError."""


def write_stored(records: list[tuple[str, bytes]]) -> bytes:
    """An uncompressed zip whose members start on STORAGE_ALIGNMENT boundaries, as torch's."""
    if len(records) >= 2**16:
        raise ArchiveError(f"{len(records)} tensors: over the zip member limit of this writer")
    out, central = bytearray(), bytearray()
    for name, data in records:
        raw_name = name.encode("utf-8")
        offset = len(out)
        pad = -(offset + 30 + len(raw_name) + 4) % STORAGE_ALIGNMENT
        extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
        crc = zlib.crc32(data)
        if offset + len(data) >= 2**32:
            raise ArchiveError("checkpoint over 4 GiB: zip64 is not supported by this writer")
        fixed = struct.pack("<HHHHHIII", 20, 0x0800, 0, 0, 0x21, crc, len(data), len(data))
        out += b"PK\x03\x04" + fixed + struct.pack("<HH", len(raw_name), len(extra))
        out += raw_name + extra + data
        central += b"PK\x01\x02" + struct.pack("<H", 20) + fixed
        central += struct.pack("<HHHHHII", len(raw_name), 0, 0, 0, 0, 0, offset) + raw_name
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(records), len(records),
                      len(central), len(out), 0)
    return bytes(out + central + end)


def what_it_is(b: bytes) -> str:
    """What a file that is no archive holds, in a word: a run's --log, notes or a script
    given for a checkpoint (easy slips) read as text."""
    if not b:
        return "empty"
    try:
        b[:4096].decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < 4090:  # not a character cut at the end of the sample
            return "not one"
    return "text"


def read_members(b: bytes) -> dict[str, bytes]:
    """Members under the archive folder that holds data.pkl, by name relative to it: every
    member one torch writes (_RECORD), each local header as the central directory says
    (_check_local), the `version` record torch.load requires among them."""
    if not b.startswith(b"PK\x03\x04"):  # no archive at all: not "truncated or damaged?"
        raise ArchiveError(f"not a checkpoint: a .pt checkpoint is a zip archive, and this "
                           f"file is {what_it_is(b)}")
    try:
        with zipfile.ZipFile(io.BytesIO(b)) as zf:
            infos = zf.infolist()
            if len(infos) >= 0xFFFF or any(
                    info.extra[:2] == ZIP64_EXTRA
                    or 0xFFFFFFFF in (info.compress_size, info.header_offset)
                    for info in infos):
                raise ArchiveError("the archive is over this reader's limits (65,534 members, "
                                   "4 GiB, no zip64 fields): no checkpoint of a model that "
                                   "trains here is that large")
            names = [info.filename for info in infos]
            if len(set(names)) != len(names):
                raise ArchiveError("archive lists a member twice")
            pkl = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pkl) != 1:
                raise ArchiveError(f"archive has {len(pkl)} data.pkl members, needs exactly 1")
            prefix = pkl[0][: -len("data.pkl")]
            records = {}
            for info in infos:
                name = info.filename[len(prefix):]
                if not info.filename.startswith(prefix) or not _RECORD.fullmatch(name):
                    raise ArchiveError(f"member {info.filename!r} is not a record this reader "
                                       "knows (a damaged name, or another torch version?)")
                if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1:
                    raise ArchiveError(f"member {info.filename} is compressed or encrypted")
                records[name] = zf.read(info)
            _check_layout(b, infos)
    except ArchiveError:
        raise
    except Exception as exc:  # zipfile signals damage with many exception types
        raise ArchiveError(f"not a readable .pt archive (truncated or damaged?): {exc}") from exc
    if not re.fullmatch(rb"\d+\n?", records.get("version", b"")):
        raise ArchiveError(f"archive has no readable {prefix}version record (torch.load "
                           "needs one; damaged?)")
    return records


def _check_layout(b: bytes, infos: list[zipfile.ZipInfo]) -> None:
    """Every byte of the archive means something and says it once: the members lie end to
    end from byte 0, the central directory right after them and its end record last, with
    no comment, extra field or attribute, and each central entry agrees with its member's
    local header (_check_local). zipfile reads only what it needs, so a flipped byte in a
    field it skips (a local header's sizes, an attribute, the padding) went unseen, where
    torch.load, which reads other fields, may refuse the file."""
    end = 0
    for info in sorted(infos, key=lambda i: i.header_offset):
        if info.header_offset != end:
            raise ArchiveError(f"member {info.filename} is not where the previous one ends "
                               "(damaged?)")
        if (info.create_system, info.reserved, info.volume, info.internal_attr,
                info.external_attr, info.extra, info.comment) != (0, 0, 0, 0, 0, b"", b"") \
                or info.create_version != info.extract_version:
            raise ArchiveError(f"member {info.filename}: its directory entry holds fields "
                               "no .pt writer sets (damaged, or packed again by another "
                                  "zip tool?)")
        end = _check_local(b, info)
    n, eocd = len(infos), len(b) - 22
    record = struct.unpack_from("<4sHHHHIIH", b, eocd) if eocd >= 0 else ()
    size = record[5] if len(record) == 8 else -1  # the central directory's
    zip64 = b[end + size : eocd] if size >= 0 else b""
    if zip64:  # torch's writer adds zip64's end record and its locator
        zip64 = struct.unpack("<4sQHHIIQQQQ4sIQI", zip64) if len(zip64) == 76 else ()
        made_by = zip64[2] if zip64 else 0
        if zip64 != (b"PK\x06\x06", 44, made_by, 45, 0, 0, n, n, size, end,
                     b"PK\x06\x07", 0, end + size, 1):
            raise ArchiveError("the archive's zip64 end record does not close its directory "
                               "(damaged?)")
    if record != (b"PK\x05\x06", 0, 0, n, n, size, end, 0) or size < 0:
        raise ArchiveError("the archive's end record does not close its directory "
                           "(damaged or followed by other bytes?)")
    pos = end  # zipfile reads a name, extra field or comment cut short by the end silently
    for info in infos:
        sig, nlen, xlen, clen = struct.unpack_from("<4s24xHHH", b, pos)
        name = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
        if (sig, b[pos + 46 : pos + 46 + nlen], xlen, clen) != (b"PK\x01\x02", name, 0, 0):
            raise ArchiveError(f"member {info.filename}: its directory entry is damaged")
        pos += 46 + nlen
    if pos != end + size:
        raise ArchiveError("the archive's directory is not the size its end record says "
                           "(damaged?)")


def _check_local(b: bytes, info: zipfile.ZipInfo) -> int:
    """A member's local header (and data descriptor, where its flags say it has one) must
    say what the central directory says of it, field by field, and its alignment padding
    (torch's "FB" extra field) be torch's. Returns where the member ends."""
    at = info.header_offset
    fields = struct.unpack_from("<4sHHHHHIIIHH", b, at)
    (sig, version, flags, method, time, date, crc, csize, usize, nlen, xlen) = fields
    y, mo, d, h, mi, sec = info.date_time
    dos = ((y - 1980) << 9 | mo << 5 | d, h << 11 | mi << 5 | sec // 2)
    sizes = (crc, csize, usize)
    # with a data descriptor (flag 8: torch's writer) the local sizes may be left 0
    sizes_ok = sizes == (info.CRC, info.compress_size, info.file_size) or (
        flags & 8 and sizes == (0, 0, 0))
    if not sizes_ok or (sig, version, flags, method, (date, time)) != (
            b"PK\x03\x04", info.extract_version, info.flag_bits, info.compress_type, dos):
        raise ArchiveError(f"member {info.filename}: its local header differs from the "
                           "archive's directory (damaged?)")
    extra = b[at + 30 + nlen : at + 30 + nlen + xlen]
    if extra and (extra[:2] != b"FB" or extra[2:4] != struct.pack("<H", xlen - 4)
                  or extra[4:].strip(b"Z")):
        raise ArchiveError(f"member {info.filename}: its local extra field is not torch's "
                           "alignment padding (damaged?)")
    end = at + 30 + nlen + xlen + info.compress_size
    if not flags & 8:
        return end
    # a data descriptor after the data (torch's writer): crc and sizes, maybe a signature
    signed = b[end : end + 4] == b"PK\x07\x08"
    tail = b[end + 4 * signed : end + 4 * signed + 12]
    if tail != struct.pack("<III", info.CRC, info.compress_size, info.file_size):
        raise ArchiveError(f"member {info.filename}: its data descriptor differs from "
                           "the archive's directory (damaged?)")
    return end + 4 * signed + 12
