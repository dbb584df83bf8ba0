"""Which inputs hold whole batches (relabelled in one pass) and which share batches with others.

Decided from Parquet footers only (schema and the `step` column's row-group
statistics), read in parallel; a file whose footer cannot be read is left to
the one-pass path, which dead-letters it with the reason.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipeline.inputs import InputFile
from transforms.formats import file_format


def split_by_batch_sharing(files: list[InputFile], threads: int = 16) -> tuple[list[InputFile], list[InputFile]]:
    """(files holding whole batches, files whose `step` ranges overlap another file's)."""
    with ThreadPoolExecutor(max_workers=threads) as pool:
        ranges = list(pool.map(_step_range, files))
    stepped = sorted(((r, f) for r, f in zip(ranges, files, strict=True) if r is not None), key=lambda rf: rf[0])
    shared: set[str] = set()
    component: list[InputFile] = []
    reach = None
    for (low, high), f in stepped + [((float("inf"), float("inf")), None)]:
        if reach is not None and low > reach:
            if len(component) > 1:
                shared.update(c.path for c in component)
            component, reach = [], None
        if f is not None:
            component.append(f)
            reach = high if reach is None else max(reach, high)
    return [f for f in files if f.path not in shared], [f for f in files if f.path in shared]


def _step_range(f: InputFile):
    """(min, max) of the file's `step` values; None when it has no `step` (or cannot be read)."""
    try:
        if file_format(f.path) != "parquet":
            return None
        with FileSystems.open(f.path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            parquet = pq.ParquetFile(handle)
            if "step" not in parquet.schema_arrow.names:
                return None
            if not pa.types.is_integer(parquet.schema_arrow.field("step").type):
                return None  # ill-typed: the one-pass path dead-letters the file
            index = parquet.schema_arrow.names.index("step")
            stats = [parquet.metadata.row_group(i).column(index).statistics
                     for i in range(parquet.metadata.num_row_groups)]
            if stats and all(s is not None and s.has_min_max for s in stats):
                return min(s.min for s in stats), max(s.max for s in stats)
            steps = parquet.read(columns=["step"]).column("step").drop_null()
            if len(steps) == 0:
                return None
            values = steps.to_pylist()
            return min(values), max(values)
    except Exception:  # noqa: BLE001 - unreadable: the one-pass path reports it
        return None
