"""Dead-letter and filtered-row records (schemas.DEAD_LETTERS): built, split by source, rows attached."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from rollout_relabel import schemas
from rollout_relabel.transforms.lib.output.stage_outputs import ExcludedWritten


def records(batch_key, sources, rows, reasons, messages) -> pa.Table:
    return pa.table({
        "source": pa.array(list(sources), pa.string()),
        "row": pa.array(np.asarray(rows, dtype=np.int64)),
        "batch": pa.array([batch_key] * len(reasons), pa.string()),
        "reason": pa.array(reasons, pa.string()),
        "message": pa.array(messages, pa.string()),
        "row_json": pa.nulls(len(reasons), pa.string()),
    }, schema=schemas.DEAD_LETTERS)


def split_by_source(records: pa.Table) -> dict[str, pa.Table]:
    sources = records.column("source").to_numpy(zero_copy_only=False)
    return {str(s): records.filter(pa.array(sources == s)) for s in np.unique(sources)}


def file_dead_letter(source: str, reason: str, message: str) -> pa.Table:
    return pa.table({"source": [source], "row": pa.array([None], pa.int64()), "batch": pa.array([None], pa.string()),
                     "reason": [reason], "message": [message], "row_json": pa.nulls(1, pa.string())},
                    schema=schemas.DEAD_LETTERS)


def with_row_json(records: pa.Table, table: pa.Table) -> pa.Table:
    """Attach each record's input row (every column, as JSON) so that nothing is lost."""
    positions = records.column("row").to_numpy(zero_copy_only=False).astype(np.int64)
    payload = [json.dumps(row, default=str, ensure_ascii=False) for row in table.take(positions).to_pylist()]
    return records.set_column(records.schema.get_field_index("row_json"), "row_json", pa.array(payload, pa.string()))


def sorted_excluded(tables: list[pa.Table]) -> pa.Table:
    """Record tables from anywhere, as one table in a fixed order: the file is byte-identical run to run."""
    if not tables:
        return schemas.DEAD_LETTERS.empty_table()
    table = pa.concat_tables(tables)
    return table.sort_by([("source", "ascending"), ("row", "ascending"), ("reason", "ascending")])


def summarize(table: pa.Table, kind: str, name: str) -> ExcludedWritten:
    """The manifest's account of a records file: rows by reason and by source (whole files apart)."""
    reasons, rows, sources = (table.column(c).to_pylist() for c in ("reason", "row", "source"))
    by_reason: dict[str, int] = {}
    by_source: dict[str, int] = {}
    for reason, row, source in zip(reasons, rows, sources):
        key = reason if row is not None else f"{reason} (file)"
        by_reason[key] = by_reason.get(key, 0) + 1
        if row is not None:
            by_source[source] = by_source.get(source, 0) + 1
    whole_files = int(table.column("row").null_count)
    return ExcludedWritten(kind, table.num_rows, table.num_rows - whole_files, whole_files, by_reason, by_source,
                          name if table.num_rows else None)
