"""WriteRecords: dead letters or filtered rows from every batch into one sorted Parquet file."""
from __future__ import annotations

import apache_beam as beam
import pyarrow as pa

import schemas
from transforms import sinks
from transforms.combiners import CollectFn


class ConcatTablesFn(CollectFn):
    def extract_output(self, tables):
        if not tables:
            return schemas.DEAD_LETTERS.empty_table()
        table = pa.concat_tables(tables)
        # runners deliver in any order; sort so the file is byte-identical run to run
        return table.sort_by([("source", "ascending"), ("row", "ascending"), ("reason", "ascending")])


class WriteRecordsFn(beam.DoFn):
    def __init__(self, output_dir: str, name: str, kind: str, lineage: dict):
        self._output_dir, self._name, self._kind, self._lineage = output_dir, name, kind, lineage

    def process(self, table):
        if table.num_rows:
            sinks.write_parquet_atomically(table, self._output_dir, self._name, lineage=self._lineage)
        by_reason: dict[str, int] = {}
        for reason, row in zip(table.column("reason").to_pylist(), table.column("row").to_pylist()):
            key = reason if row is not None else f"{reason} (file)"
            by_reason[key] = by_reason.get(key, 0) + 1
        yield {"kind": self._kind, "records": table.num_rows,
               "rows": int(table.num_rows - table.column("row").null_count),
               "files": int(table.column("row").null_count), "by_reason": by_reason,
               "by_source": _rows_by_source(table), "output": self._name if table.num_rows else None}


def _rows_by_source(table):
    counts: dict[str, int] = {}
    for source, row in zip(table.column("source").to_pylist(), table.column("row").to_pylist()):
        if row is not None:
            counts[source] = counts.get(source, 0) + 1
    return counts


class WriteRecords(beam.PTransform):
    def __init__(self, output_dir: str, name: str, kind: str, lineage: dict):
        super().__init__()
        self._fn = WriteRecordsFn(output_dir, name, kind, lineage)

    def expand(self, tables):
        return (tables
                # no records, no element: nothing to write, and the manifest reads "none" (no default
                # injection: that is a side input and two more stages to build and run)
                | "ConcatTables" >> beam.CombineGlobally(ConcatTablesFn()).without_defaults()
                | "WriteParquet" >> beam.ParDo(self._fn))
