"""ReadRollouts: input files -> slim per-batch tables keyed by batch, plus file records."""
from __future__ import annotations

import apache_beam as beam
from apache_beam import pvalue

import schemas
from transforms import rows
from transforms.formats import BadFile, FailFast, read_rollouts
from transforms.metrics import counter

SLIM = "slim"
FILES = "files"
DEAD = "dead"


def dead_file_outputs(source, reason, message, fail_fast):
    """A whole file is unusable: one dead letter with a null row, and its file record."""
    if fail_fast:
        raise FailFast(f"{reason}: {message}")
    counter("files_dead").inc()
    yield pvalue.TaggedOutput(DEAD, rows.file_dead_letter(source, reason, message))
    yield pvalue.TaggedOutput(FILES, (source, {"output": None, "rows_in": 0, "reason": reason}))


class ReadSlimTablesFn(beam.DoFn):
    """input record {path, output, size, mtime} -> (batch key, (source, slim table, prompt_group_sizes))."""

    def __init__(self, reward_key: str | None, fail_fast: bool = False):
        self._reward_key = reward_key
        self._fail_fast = fail_fast

    def process(self, element):
        source = element["path"]
        try:
            table, metadata = read_rollouts(source, columns=schemas.SLIM_INPUT_COLUMNS)
            parts = rows.extract_slim(table, source, self._reward_key)
        except BadFile as bad:  # unreadable, or its batches cannot be decided (e.g. null `step`)
            yield from self._dead_file(source, bad.reason, bad.message)
        else:
            yield from self._slim_parts(element, table, metadata, parts)

    def _dead_file(self, source, reason, message):
        yield from dead_file_outputs(source, reason, message, self._fail_fast)

    def _slim_parts(self, record, table, metadata, parts):
        source = record["path"]
        counter("rows_in").inc(table.num_rows)
        yield pvalue.TaggedOutput(FILES, (source, dict(record, rows_in=table.num_rows, reason=None)))
        for batch_key, slim in parts:
            yield batch_key, (source, slim, metadata["prompt_group_sizes"])


class ReadRollouts(beam.PTransform):
    """PCollection[input record] -> tagged outputs slim / files / dead."""

    def __init__(self, reward_key: str | None, fail_fast: bool = False):
        super().__init__()
        self._fn = ReadSlimTablesFn(reward_key, fail_fast)

    def expand(self, sources):
        return sources | "ReadSlimTables" >> beam.ParDo(self._fn).with_outputs(
            FILES, DEAD, main=SLIM)
