"""Which inputs hold whole batches (relabelled in one pass) and which share batches with others.

Decided from Parquet footers only (schema and the `step` column's row-group
statistics), read once and in parallel; a file whose footer cannot be read is
left to the one-pass path, which dead-letters it with the reason. The same
footers estimate each group's decoded size (the local thread count needs it).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from transforms.lib import filesystem
from transforms.lib.errors import BadFile
from transforms.lib.inputs import InputFile
from transforms.lib.readers import check_regular, file_format

# A group of files sharing batches larger than this goes through the shuffle path instead of one worker.
MAX_GROUP_BYTES = 1 << 30

# Bytes per value once decoded, by Parquet physical type. Not the footer's uncompressed sizes: those
# are of encoded pages, and a dictionary- or run-length-encoded loss_mask is a bit per token there.
VALUE_BYTES = {"BOOLEAN": 0.125, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}


@dataclass(frozen=True)
class Footer:
    """What a file's footer tells the plan."""
    steps: tuple[int, int] | None  # (min, max) of `step`; None without one (or unreadable)
    decoded_bytes: int             # the file's size once decoded into Arrow (estimated)


def read_footers(files: list[InputFile], threads: int = 16) -> dict[str, Footer]:
    """Every file's footer, read once and in parallel: path -> Footer."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return dict(zip([f.path for f in files], pool.map(read_footer, files), strict=True))


def group_by_batch_sharing(files: list[InputFile], max_group_bytes: int = MAX_GROUP_BYTES,
                           footers: dict[str, Footer] | None = None) -> tuple[list[list[InputFile]], list[InputFile]]:
    """(groups relabelled in one pass each, files for the shuffle path).

    Files whose `step` ranges overlap (transitively) share batches and form one
    group; every other file is a group of its own. A group over max_group_bytes
    of input goes to the shuffle path, which never holds a whole batch's heavy
    columns in one place.
    """
    footers = footers if footers is not None else read_footers(files)
    ranges = [footers[f.path].steps for f in files]
    groups = [[f] for f, r in zip(files, ranges, strict=True) if r is None]
    stepped = [(f, r) for f, r in zip(files, ranges, strict=True) if r is not None]
    groups += [[f for f, _ in component] for component in overlapping_components(stepped)]
    one_pass = [sorted(g, key=lambda f: f.path) for g in groups if sum(f.size for f in g) <= max_group_bytes
                or len(g) == 1]
    shuffled = [f for g in groups if len(g) > 1 and sum(f.size for f in g) > max_group_bytes for f in g]
    return sorted(one_pass, key=lambda g: g[0].path), sorted(shuffled, key=lambda f: f.path)


def step_range(f: InputFile):
    """(min, max) of the file's `step` values; None when it has no `step` (or cannot be read)."""
    return read_footer(f).steps


def read_footer(f: InputFile) -> Footer:
    if file_format(f.path) != "parquet" or f.problem:
        return Footer(None, f.size)  # a .pt dump holds its tensors as they are
    try:
        check_regular(f.path)  # never open a FIFO or a device: the one-pass path dead-letters it
    except BadFile:
        return Footer(None, f.size)
    try:
        with filesystem.open_read(f.path) as handle:
            parquet = pq.ParquetFile(handle)
            return Footer(_steps(parquet), _decoded_bytes(parquet.metadata))
    except (OSError, ValueError):  # not Parquet, or damaged (Arrow's errors are both): the one-pass path reports it
        return Footer(None, f.size)


def _steps(parquet: pq.ParquetFile):
    if "step" not in parquet.schema_arrow.names:
        return None
    if not pa.types.is_integer(parquet.schema_arrow.field("step").type):
        return None  # ill-typed: the one-pass path dead-letters the file
    index = parquet.schema_arrow.names.index("step")
    stats = [parquet.metadata.row_group(i).column(index).statistics for i in range(parquet.metadata.num_row_groups)]
    if stats and all(s is not None and s.has_min_max for s in stats):
        return min(s.min for s in stats), max(s.max for s in stats)
    steps = parquet.read(columns=["step"]).column("step").drop_null()
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


def overlapping_components(items):
    """Groups of (item, (low, high)) whose step ranges overlap transitively, lowest range first."""
    components, current, reach = [], [], None
    for item in sorted(items, key=lambda item: item[1]):
        low, high = item[1]
        if reach is not None and low > reach:
            components.append(current)
            current, reach = [], None
        current.append(item)
        reach = high if reach is None else max(reach, high)
    if current:
        components.append(current)
    return components
