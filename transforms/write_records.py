"""WriteRecords: dead letters or filtered rows from every batch into one sorted Parquet file."""
from __future__ import annotations

import apache_beam as beam

from transforms.combiners import ConcatTablesFn
from transforms.lib import output_files
from transforms.lib.dead_letters import summarize
from transforms.lib.settings import RunSettings


class WriteRecordsFn(beam.DoFn):
    def __init__(self, output_dir: str, name: str, kind: str, lineage: dict):
        self._output_dir, self._name, self._kind, self._lineage = output_dir, name, kind, lineage

    def process(self, table):
        if table.num_rows:
            output_files.write_parquet_atomically(table, self._output_dir, self._name, lineage=self._lineage)
        yield summarize(table, self._kind, self._name)


class WriteRecords(beam.PTransform):
    """PCollection[record tables] -> the file DIR/name (when any record) -> one RecordsWritten."""

    def __init__(self, settings: RunSettings, name: str, kind: str):
        super().__init__()
        self._fn = WriteRecordsFn(settings.output, name, kind, settings.lineage())

    def expand(self, tables):
        return (tables
                # no records, no element: nothing to write, and the manifest reads "none" (no default
                # injection: that is a side input and two more stages to build and run)
                | "ConcatTables" >> beam.CombineGlobally(ConcatTablesFn()).without_defaults()
                | "WriteParquet" >> beam.ParDo(self._fn))
