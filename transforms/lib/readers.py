"""Reading rollout files (Parquet, slime/miles .pt dumps) into Arrow tables.

Every byte goes through transforms/lib/filesystem.py, so gs://, s3://, hdfs:// and
mem:// paths work like local ones. No Beam pipeline code here.
"""
from __future__ import annotations

import io
import pickle

import pyarrow as pa
import pyarrow.parquet as pq

from transforms.lib import filesystem
from transforms.lib.errors import BadFile
from transforms.lib.samples import samples_to_table

PT_SUFFIXES = (".pt", ".pth")
PARQUET_SUFFIXES = (".parquet", ".pq")


def file_format(path: str) -> str:
    lower = path.lower()
    if lower.endswith(PT_SUFFIXES):
        return "pt"
    if lower.endswith(PARQUET_SUFFIXES):
        return "parquet"
    raise BadFile("unreadable-file", f"{path}: unknown file type (expected .pt or .parquet)")


def read_table(path: str, columns=None) -> tuple[pa.Table, dict]:
    """The file's rows as a table (only `columns` when given, those present) and its batch metadata.

    metadata: {"step": int | None, "prompt_group_sizes": list[int] | None}
    """
    if file_format(path) == "pt":
        raw = _read_bytes(path)
        if not raw:
            raise BadFile("empty-file", f"{path}: file is empty (0 bytes)")
        return _read_pt(path, raw, columns)
    return _read_parquet(path, columns), {"step": None, "prompt_group_sizes": None}


def _read_bytes(path: str) -> bytes:
    try:
        with filesystem.open_read(path) as handle:
            return handle.read()
    except Exception as error:  # noqa: BLE001 - any I/O failure makes the file unreadable
        raise BadFile("unreadable-file", f"{path}: cannot be read: {error}") from error


def _read_parquet(path, columns):
    """Streams through the FileSystems handle: the encoded file is never held in memory whole."""
    try:
        handle = filesystem.open_read(path)
    except Exception as error:  # noqa: BLE001 - any I/O failure makes the file unreadable
        raise BadFile("unreadable-file", f"{path}: cannot be read: {error}") from error
    with handle:
        if handle.seek(0, io.SEEK_END) == 0:
            raise BadFile("empty-file", f"{path}: file is empty (0 bytes)")
        handle.seek(0)
        try:
            parquet = pq.ParquetFile(handle)
            present = parquet.schema_arrow.names
            wanted = None if columns is None else [c for c in columns if c in present]
            return parquet.read(columns=wanted)
        except Exception as error:  # noqa: BLE001
            raise BadFile("unreadable-file", f"{path}: not a readable Parquet file: {error}") from error


def _read_pt(path, raw, columns):
    import torch  # heavy import, only for .pt inputs

    try:
        dump = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "weights_only" in str(error).lower() or "unsupported global" in str(error).lower():
            raise BadFile("unsafe-pickle",
                          f"{path}: refused: the dump needs arbitrary unpickling, which could run code "
                          f"({str(error).splitlines()[0]})") from error
        raise BadFile("unreadable-file", f"{path}: corrupt or truncated .pt: {error}") from error
    except Exception as error:  # noqa: BLE001
        raise BadFile("unreadable-file", f"{path}: corrupt or truncated .pt: {error}") from error
    if not isinstance(dump, dict) or not isinstance(dump.get("samples"), list):
        raise BadFile("unreadable-file", f"{path}: not a rollout dump (expected a dict with a 'samples' list)")
    samples = dump["samples"]
    if not all(isinstance(s, dict) for s in samples):
        raise BadFile("unreadable-file", f"{path}: 'samples' must be a list of dicts (Sample.to_dict())")
    metadata = dump.get("metadata") or {}
    sizes = metadata.get("prompt_group_sizes") if isinstance(metadata, dict) else None
    step = dump.get("rollout_id")
    try:
        table = samples_to_table(samples, columns, dump=dump)
    except BadFile as bad:
        raise BadFile(bad.reason, f"{path}: {bad.message}") from bad
    return table, {
        "step": step if isinstance(step, int) else None,
        "prompt_group_sizes": None if sizes is None else [int(s) for s in sizes],
    }
