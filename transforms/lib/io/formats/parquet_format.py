"""Parquet rollout files (`.parquet`, `.pq`): read streaming, planned from the footer alone.

The footer gives the `step` column's range (row-group statistics) and the decoded size, so a file is
planned without reading its rows.
"""
from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io import filesystem
from rollout_relabel.transforms.lib.io.columns import is_text
from rollout_relabel.transforms.lib.io.formats.format import Footer, Format, ReadOptions, steps_in, tail

SUFFIX = ".parquet"  # also what relabel writes: the output part files are named with it
# Bytes per value once decoded, by Parquet physical type. Not the footer's uncompressed sizes: those
# are of encoded pages, and a dictionary- or run-length-encoded loss_mask is a bit per token there.
VALUE_BYTES = {"BOOLEAN": 0.125, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


def read(path: str, columns, options: ReadOptions):
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
            # pyarrow refuses a name that is not a text column of the file
            encoded = [c for c in options.dictionary if c in present and present.count(c) == 1
                       and is_text(parquet.schema_arrow.field(c).type)]
            if encoded:
                parquet = pq.ParquetFile(handle, metadata=parquet.metadata, read_dictionary=encoded)
        except Exception as error:  # noqa: BLE001
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a readable Parquet file: {error}") from error
        twice = sorted({n for n in present if present.count(n) > 1})
        if twice:  # which of the two is meant cannot be decided, and the output could not be written
            raise BadFile(Reason.DUPLICATE_COLUMN, f"{path}: column name(s) {', '.join(map(repr, twice))} appear more "
                                              "than once")
        try:
            table = parquet.read(columns=wanted, use_threads=options.use_threads)
        except Exception as error:  # noqa: BLE001
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a readable Parquet file: {error}") from error
    return table, {"step": None, "prompt_group_sizes": None}


def plan(path: str, size: int, step: str, max_bytes: int) -> Footer:
    try:
        with filesystem.open_read(path) as handle:
            parquet = pq.ParquetFile(handle)
            return Footer(_steps(parquet, step), _decoded_bytes(parquet.metadata))
    except (OSError, ValueError):  # not Parquet, or damaged (Arrow's errors are both): the one-pass path reports it
        return Footer(None, size)


def _steps(parquet: pq.ParquetFile, step: str = "step"):
    names = parquet.schema_arrow.names
    if step not in names:
        top = step.split(".", 1)[0]
        if "." not in step or names.count(top) != 1:
            return None  # absent, or a duplicate column: the one-pass path dead-letters that file
        return steps_in(parquet.read(columns=[top]), step)  # a dotted path: only its column is read
    if names.count(step) > 1:
        return None
    if not pa.types.is_integer(parquet.schema_arrow.field(step).type):
        return None  # ill-typed: the one-pass path dead-letters the file
    index = names.index(step)
    stats = [parquet.metadata.row_group(i).column(index).statistics for i in range(parquet.metadata.num_row_groups)]
    if stats and all(s is not None and s.has_min_max for s in stats):
        return min(s.min for s in stats), max(s.max for s in stats)
    steps = parquet.read(columns=[step]).column(step).drop_null()
    if len(steps) == 0:
        return None
    values = steps.to_pylist()
    return min(values), max(values)


def _decoded_bytes(metadata) -> int:
    total = 0
    for i in range(metadata.num_row_groups):
        row_group = metadata.row_group(i)
        for j in range(row_group.num_columns):
            chunk = row_group.column(j)
            width = VALUE_BYTES.get(chunk.physical_type)  # strings: their encoded size, a lower bound
            total += chunk.num_values * width if width else chunk.total_uncompressed_size
    return int(total)


MAGICS = (b"PAR1", b"PARE")  # plain, and footer-encrypted, Parquet


def ends_whole(handle, size: int) -> bool:
    """The footer is written last: the magic at both ends, and the footer length before the last one fits."""
    if size < 12:
        return False
    head = handle.read(4)
    end = tail(handle, size, 8)
    return head in MAGICS and end[4:] == head and 12 + int.from_bytes(end[:4], "little") <= size


FORMAT = Format("parquet", suffixes=(SUFFIX, ".pq"), read=read, plan=plan, ends_whole=ends_whole)
