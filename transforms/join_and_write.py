"""JoinAndWrite: each input file's results joined back to its full rows, one Parquet file out per input.

Used for batches that span several files (the shuffle path). The heavy
columns are read here, once per file, and never shuffled. A file whose
output is already complete (same options fingerprint, same input size and
mtime) is not rewritten: that is what makes an interrupted backfill
resumable. Dead and filtered rows get their full columns attached here.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam import pvalue

import schemas
from transforms import file_output
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
        lineage = file_output.file_lineage(self._lineage, record)
        complete = file_output.is_complete(self._output_dir, record["output"], lineage)
        outcome = file_output.finish_file(
            record, lambda: read_rollouts(source)[0],
            file_output.concat(joined["result"], schemas.RESULT),
            file_output.concat(joined["dead"], schemas.DEAD_LETTERS),
            file_output.concat(joined["filtered"], schemas.DEAD_LETTERS),
            self._output_dir, lineage, complete)
        yield from emit_outcome(outcome)


def emit_outcome(outcome: file_output.FileOutcome):
    """A finished file's outputs: its dead and filtered records (tagged) and its stats (main)."""
    counter("files_skipped" if outcome.stats["resumed"] else "files_out").inc()
    counter("rows_out").inc(outcome.stats["rows_out"])
    if outcome.dead.num_rows:
        yield pvalue.TaggedOutput(DEAD, outcome.dead)
    if outcome.filtered.num_rows:
        yield pvalue.TaggedOutput(FILTERED, outcome.filtered)
    yield outcome.stats


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
