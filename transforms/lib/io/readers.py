"""Reading rollout files (Parquet, JSONL, slime/miles .pt dumps) into Arrow tables.

Every byte goes through transforms/lib/io/filesystem.py, so gs://, s3://, hdfs:// and
mem:// paths work like local ones. No Beam pipeline code here.
"""
from __future__ import annotations

import io
import os
import pickle
import stat

import pyarrow as pa
import pyarrow.parquet as pq

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile, InputChanged
from rollout_relabel.transforms.lib.io import filesystem
from rollout_relabel.transforms.lib.io.dump_samples import samples_to_table
from rollout_relabel.transforms.lib.io.jsonl import read_jsonl
from rollout_relabel.transforms.lib.labeling.settings import DEFAULT_MAX_FILE_BYTES

PT_SUFFIXES = (".pt", ".pth")
PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
ROLLOUT_SUFFIXES = PT_SUFFIXES + PARQUET_SUFFIXES + JSONL_SUFFIXES
# Schema metadata key of a JSONL table: {row: text} for each line that is not a JSON object (its row is all
# nulls, and slim extraction dead-letters it as malformed-line, in a group of its own)


def file_format(path: str) -> str:
    lower = path.lower()
    if lower.endswith(PT_SUFFIXES):
        return "pt"
    if lower.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if lower.endswith(JSONL_SUFFIXES):
        return "jsonl"
    raise BadFile(Reason.UNREADABLE_FILE, f"{path}: unknown file type (expected .pt, .parquet, .jsonl or .jsonl.gz)")


def read_input(record: dict, columns=None, max_bytes: int = DEFAULT_MAX_FILE_BYTES,
               use_threads: bool = True) -> tuple[pa.Table, dict]:
    """An input as the plan listed it ({path, size, mtime, problem?}), read with read_table.

    Refused (BadFile) before any byte is read when its name cannot travel, it is not a regular file
    (a FIFO would hang the run, /dev/zero would fill memory) or it is over max_bytes; InputChanged
    when its size or mtime is no longer what the plan saw. `use_threads`: as read_table's.
    """
    path = record["path"]
    if record.get("problem"):
        raise BadFile(record["problem"], f"{path}: its name is not valid UTF-8; rename the file to relabel it")
    check_regular(path)
    if record["size"] > max_bytes:
        raise BadFile(Reason.FILE_TOO_LARGE, f"{path}: {record['size']} bytes is over the {max_bytes}-byte limit "
                                        "(--max-file-bytes)")
    table, metadata = read_table(path, columns, use_threads, max_bytes)
    _check_unchanged(record)
    return table, metadata


def check_regular(path: str) -> None:
    """Only regular files are read (a local path's target, symlinks followed); stores hold nothing else."""
    if "://" in path:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: cannot be read: {error}") from error
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a directory" if stat.S_ISDIR(mode) else "special")
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a regular file ({kind}); only regular files are read")


def _check_unchanged(record: dict) -> None:
    found = [m for m in filesystem.match(record["path"]) if m.path == record["path"]]
    now = (int(found[0].size_in_bytes), float(found[0].last_updated_in_seconds)) if found else None
    if now != (record["size"], record["mtime"]):
        seen = "gone" if now is None else f"{now[0]} bytes, mtime {now[1]}"
        raise InputChanged(f"{record['path']} changed while the run read it (planned: {record['size']} bytes, "
                           f"mtime {record['mtime']}; now: {seen}); nothing is committed, rerun to relabel it as it "
                           "is now")


def read_table(path: str, columns=None, use_threads: bool = True,
               max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> tuple[pa.Table, dict]:
    """The file's rows as a table (only `columns` when given, those present) and its batch metadata.

    `use_threads`: Parquet columns are decoded on pyarrow's thread pool (off: on the calling thread).
    `max_bytes`: a .jsonl.gz is refused once it decompresses to more (file-too-large).

    metadata: {"step": int | None, "prompt_group_sizes": list[int] | None}
    """
    if file_format(path) == "pt":
        raw = _read_bytes(path)
        if not raw:
            raise BadFile(Reason.EMPTY_FILE, f"{path}: file is empty (0 bytes)")
        return _read_pt(path, raw, columns)
    if file_format(path) == "jsonl":
        return read_jsonl(path, _read_bytes(path), columns, max_bytes), {"step": None, "prompt_group_sizes": None}
    return _read_parquet(path, columns, use_threads), {"step": None, "prompt_group_sizes": None}


def _read_bytes(path: str) -> bytes:
    try:
        with filesystem.open_read(path) as handle:
            return handle.read()
    except Exception as error:  # noqa: BLE001 - any I/O failure makes the file unreadable
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: cannot be read: {error}") from error


def _read_parquet(path, columns, use_threads=True):
    """Streams through the FileSystems handle: the encoded file is never held in memory whole."""
    try:
        handle = filesystem.open_read(path)
    except Exception as error:  # noqa: BLE001 - any I/O failure makes the file unreadable
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: cannot be read: {error}") from error
    with handle:
        if handle.seek(0, io.SEEK_END) == 0:
            raise BadFile(Reason.EMPTY_FILE, f"{path}: file is empty (0 bytes)")
        handle.seek(0)
        try:
            parquet = pq.ParquetFile(handle)
            present = parquet.schema_arrow.names
            wanted = None if columns is None else [c for c in columns if c in present]
        except Exception as error:  # noqa: BLE001
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a readable Parquet file: {error}") from error
        twice = sorted({n for n in present if present.count(n) > 1})
        if twice:  # which of the two is meant cannot be decided, and the output could not be written
            raise BadFile(Reason.DUPLICATE_COLUMN, f"{path}: column name(s) {', '.join(map(repr, twice))} appear more "
                                              "than once")
        try:
            return parquet.read(columns=wanted, use_threads=use_threads)
        except Exception as error:  # noqa: BLE001
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a readable Parquet file: {error}") from error


def _read_pt(path, raw, columns):
    import torch  # heavy import, only for .pt inputs

    try:
        dump = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if _looks_like(raw):
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: {_looks_like(raw)}, not a .pt dump") from error
        if "weights_only" in str(error).lower() or "unsupported global" in str(error).lower():
            raise BadFile(Reason.UNSAFE_PICKLE,
                          f"{path}: refused: the dump needs arbitrary unpickling, which could run code "
                          f"({str(error).splitlines()[0]})") from error
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: corrupt or truncated .pt: {error}") from error
    except Exception as error:  # noqa: BLE001
        if _looks_like(raw):
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: {_looks_like(raw)}, not a .pt dump") from error
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: corrupt or truncated .pt: {error}") from error
    if not isinstance(dump, dict) or not isinstance(dump.get("samples"), list):
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a rollout dump (expected a dict with a 'samples' list)")
    samples = dump["samples"]
    if not all(isinstance(s, dict) for s in samples):
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: 'samples' must be a list of dicts (Sample.to_dict())")
    for position, sample in enumerate(samples):
        odd = next((key for key in sample if not isinstance(key, str)), None)
        if odd is not None:
            raise BadFile(Reason.ILL_TYPED_COLUMN, f"{path}: sample {position} has a non-string key {odd!r}")
    metadata = dump.get("metadata") or {}
    sizes = metadata.get("prompt_group_sizes") if isinstance(metadata, dict) else None
    if sizes is not None and not (isinstance(sizes, (list, tuple)) and all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in sizes)):
        raise BadFile(Reason.GROUP_SIZES_MISMATCH, f"{path}: metadata prompt_group_sizes is {sizes!r}; expected a list "
                                              "of non-negative integers")
    step = dump.get("rollout_id")
    try:
        table = samples_to_table(samples, columns, dump=dump)
    except BadFile as bad:
        raise BadFile(bad.reason, f"{path}: {bad.message}") from bad
    return table, {
        "step": step if isinstance(step, int) else None,
        "prompt_group_sizes": None if sizes is None else [int(s) for s in sizes],
    }


def _looks_like(raw: bytes) -> str | None:
    """What a file named .pt really is, when it is something we can name."""
    if raw[:4] == b"PAR1" and raw[-4:] == b"PAR1":
        return "a Parquet file (name it .parquet)"
    try:
        raw[:4096].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return "a text file"
