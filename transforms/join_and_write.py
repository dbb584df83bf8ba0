"""JoinAndWrite: each input file's results joined back to its full rows, one Parquet file out per input."""
from __future__ import annotations

import apache_beam as beam
import pyarrow as pa

import schemas
from transforms import rows, sinks
from transforms.formats import read_rollouts
from transforms.metrics import counter


class WriteTrainingRowsFn(beam.DoFn):
    def __init__(self, output_dir: str, lineage: dict):
        self._output_dir = output_dir
        self._lineage = lineage

    def process(self, element):
        source, joined = element
        files = [f for f in joined["file"] if f["output"] is not None]  # unreadable: dead-lettered whole
        yield from self._write(source, files[0], joined["result"]) if files else ()

    def _write(self, source, record, results):
        results = [t for t in results if t.num_rows]
        result = pa.concat_tables(results) if results else schemas.RESULT.empty_table()
        table, _ = read_rollouts(source)  # the heavy path: every column, read once
        training = rows.training_rows(table, result)
        size = sinks.write_parquet_atomically(training, self._output_dir, record["output"],
                                              lineage=dict(self._lineage, source=source))
        counter("rows_out").inc(training.num_rows)
        counter("files_out").inc()
        yield {"kind": "file", "source": source, "output": record["output"], "rows_in": record["rows_in"],
               "rows_out": training.num_rows, "bytes_out": size}


class JoinAndWrite(beam.PTransform):
    """({file: (source, record)}, {result: (source, table)}) -> per-file write stats."""

    def __init__(self, output_dir: str, lineage: dict):
        super().__init__()
        self._fn = WriteTrainingRowsFn(output_dir, lineage)

    def expand(self, inputs):
        files, results = inputs
        return ({"file": files, "result": results}
                | "JoinResultsToFiles" >> beam.CoGroupByKey()
                | "WriteTrainingRows" >> beam.ParDo(self._fn))
