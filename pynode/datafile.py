"""`--data FILE`: a run's text from a local file, a text file or a parquet file with a
`text` column (FineWeb-Edu's schema), named in the config with its sha256.

The config holds ``file:PATH#sha256=HEX``: PATH as the user gave it (relative paths are
read from each peer's working directory), HEX the digest of the file's bytes. Every peer
reads PATH and refuses a file with another digest, so a run's text cannot differ between
peers, or between a run and its resume. The whole text is held in memory; for shards of
gigabytes, serve them (`python -m server --data-url FILE.parquet`) and give --data URL.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from pynode.core.errors import DaisyError

PREFIX = "file:"
PARQUET_MAGIC = b"PAR1"
DOC_SEPARATOR = b"\n\n"  # between a parquet file's documents


class DataFileError(DaisyError):
    """The run's data file is missing, changed, or holds no usable text."""


def is_file_spec(data: str) -> bool:
    return data.startswith(PREFIX)


def file_spec(path: str) -> str:
    """The config value of `--data PATH`: DataFileError if PATH is not a file."""
    file = Path(path)
    if not file.is_file():
        raise DataFileError(f"--data: {path} is not a file; give builtin, a DaisyChain server "
                          "(http://HOST:PORT) or a text or parquet file")
    return f"{PREFIX}{path}#sha256={_sha256(file)}"


def split_spec(spec: str) -> tuple[str, str]:
    """(path, sha256 hex) of a ``file:PATH#sha256=HEX`` value; ValueError if malformed."""
    path, _, digest = spec.removeprefix(PREFIX).rpartition("#sha256=")
    if not path or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"data {spec!r}: expected file:PATH#sha256=<64 hex digits>")
    return path, digest


def file_text(spec: str) -> np.ndarray:
    """The (N,) uint8 text of the file `spec` names, checked against its digest (read again
    when the file's size or modification time changes)."""
    path, _ = split_spec(spec)
    try:
        stat = Path(path).stat()
    except OSError as exc:
        raise DataFileError(unreadable(path, exc)) from None
    return _read_checked(spec, stat.st_size, stat.st_mtime_ns)


def unreadable(path: str, exc: OSError) -> str:
    where = ("" if Path(path).is_absolute() else
             " (a relative path, read from the folder the command runs in; a resume can give "
             "--data with the file's path from here: the same file goes on bit for bit)")
    return (f"the run's data file {path} cannot be read here ({exc.strerror or exc}): every "
            f"peer needs it at that path{where}")


@lru_cache(maxsize=2)
def _read_checked(spec: str, size: int, mtime_ns: int) -> np.ndarray:
    path, digest = split_spec(spec)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise DataFileError(unreadable(path, exc)) from None
    have = hashlib.sha256(raw).hexdigest()
    if have != digest:
        raise DataFileError(f"the run's data file {path} has sha256 {have[:16]}..., the run's "
                            f"is {digest[:16]}...: the file changed, or this peer has another")
    if raw.startswith(PARQUET_MAGIC):
        text = parquet_text(path, raw)
    elif path.lower().endswith(".parquet"):  # trained on as text, it gave a run of junk
        raise DataFileError(not_parquet(path, raw))
    else:
        text = raw
    return np.frombuffer(text, dtype=np.uint8)


def not_parquet(path: str, raw: bytes) -> str:
    """Why a file named .parquet that does not begin with PAR1 is refused."""
    if raw.startswith(b"version https://git-lfs"):
        what = ("a Git LFS pointer, not the shard: fetch the file itself (git lfs pull, or "
                "download it)")
    else:
        what = "a failed or partial download, or another kind of file under that name?"
    return f"{path} is named .parquet but is not a parquet file ({len(raw):,} bytes, " \
           f"no PAR1 at its start): {what}"


def is_text_type(kind: Any) -> bool:
    """Whether an arrow type holds text: string, large_string, string_view, or a dictionary
    of those (a pandas `category` column written to parquet)."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    view = getattr(pa.types, "is_string_view", lambda _: False)
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or view(kind)


def parquet_text(path: str, raw: bytes) -> bytes:
    """The documents of a parquet file's `text` column joined by DOC_SEPARATOR (`path`
    names it in errors)."""
    from pynode.extras import require

    require(f"--data {path} (a parquet file)", "pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    # a damaged file raises ArrowException, OSError (a page pyarrow cannot deserialize) or
    # ValueError: each is this file's fault, said in one line
    damaged = (pa.ArrowException, OSError, ValueError, KeyError)
    try:
        names = pq.read_schema(pa.BufferReader(raw)).names
    except damaged as exc:
        raise DataFileError(f"{path}: no readable 'text' column ({exc})") from None
    if "text" not in names:  # said with the file's own columns, not pyarrow's internals
        raise DataFileError(f"{path}: no readable 'text' column (its columns: "
                            f"{', '.join(names[:12]) or 'none'})")
    try:
        table = pq.read_table(pa.BufferReader(raw), columns=["text"])
    except damaged as exc:
        raise DataFileError(f"{path}: no readable 'text' column ({exc})") from None
    kind = table.column(0).type
    if not is_text_type(kind):
        raise DataFileError(f"{path}: its 'text' column holds {kind}, not text")
    docs = (doc.encode("utf-8") for doc in table.column(0).to_pylist() if doc)
    return DOC_SEPARATOR.join(docs)


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
