"""JoinAndWrite: each input file's results joined back to its full rows, one Parquet file out per input.

The heavy columns are read here, once per file, and never shuffled. A file
whose output is already complete (same options fingerprint, same input size
and mtime) is not rewritten: that is what makes an interrupted backfill
resumable. Dead and filtered rows get their full columns attached here.
"""
from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue

import schemas
from transforms import rows, sinks
from transforms.formats import read_rollouts
from transforms.metrics import counter

DEAD = "dead"
FILTERED = "filtered"
STATS = "stats"


class WriteTrainingRowsFn(beam.DoFn):
    def __init__(self, output_dir: str, lineage: dict):
        self._output_dir = output_dir
        self._lineage = lineage

    def process(self, element):
        source, joined = element
        files = [f for f in joined["file"] if f["output"] is not None]  # unreadable: dead-lettered whole
        if files:
            yield from self._write(source, files[0], joined)

    def _write(self, source, record, joined):
        lineage = dict(self._lineage, source=source, input_size=record["size"], input_mtime=record["mtime"])
        dead = _concat(joined["dead"], schemas.DEAD_LETTERS)
        filtered = _concat(joined["filtered"], schemas.DEAD_LETTERS)
        existing = sinks.read_lineage(self._output_dir, record["output"])
        complete = existing is not None and {k: existing.get(k) for k in lineage} == lineage
        table = None
        if not complete or dead.num_rows or filtered.num_rows:
            table, _ = read_rollouts(source)  # the heavy path: every column, read once
        if complete:
            rows_out = existing["_rows"]
            counter("files_skipped").inc()
        else:
            training = rows.training_rows(table, _concat(joined["result"], schemas.RESULT))
            sinks.write_parquet_atomically(training, self._output_dir, record["output"], lineage=lineage)
            rows_out = training.num_rows
            counter("files_out").inc()
        counter("rows_out").inc(rows_out)
        if dead.num_rows:
            yield pvalue.TaggedOutput(DEAD, rows.with_row_json(dead, table))
        if filtered.num_rows:
            yield pvalue.TaggedOutput(FILTERED, rows.with_row_json(filtered, table))
        yield {"kind": "file", "source": source, "output": record["output"], "rows_in": record["rows_in"],
               "rows_out": rows_out, "resumed": complete}


def _concat(tables, schema):
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else schema.empty_table()


class JoinAndWrite(beam.PTransform):
    """(files, results, dead, filtered), each keyed by source -> tagged stats / dead / filtered."""

    def __init__(self, output_dir: str, lineage: dict):
        super().__init__()
        self._fn = WriteTrainingRowsFn(output_dir, lineage)

    def expand(self, inputs):
        files, results, dead, filtered = inputs
        return ({"file": files, "result": results, "dead": dead, "filtered": filtered}
                | "JoinResultsToFiles" >> beam.CoGroupByKey()
                | "WriteTrainingRows" >> beam.ParDo(self._fn).with_outputs(DEAD, FILTERED, main=STATS))
