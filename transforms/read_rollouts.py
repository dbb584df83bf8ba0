"""ReadRollouts: input files -> slim per-batch tables keyed by batch, plus file records (the shuffle path)."""
from __future__ import annotations

import apache_beam as beam
from apache_beam import pvalue

from rollout_relabel.transforms.dofns import dead_file_outputs, read_planned
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.labeling.settings import RunSettings
from rollout_relabel.transforms.lib.labeling.slim import extract_slim, slim_input_columns
from rollout_relabel.transforms.lib.output.stage_outputs import DEAD, FILES, SLIM, FileRead
from rollout_relabel.transforms.metrics import counter


class ReadSlimTablesFn(beam.DoFn):
    """input record {path, output, size, mtime} -> (batch key, (source, slim table, prompt_group_sizes))."""

    def __init__(self, settings: RunSettings):
        self._settings = settings

    def process(self, record):
        # the outputs come from a helper: Beam's type inference would read a union of tagged and keyed
        # outputs from this body and refuse the keyed main output to GatherBatches
        yield from self._outputs(record)

    def _outputs(self, record):
        source = record["path"]
        try:
            reward = self._settings.labeling
            table, metadata = read_planned(record, self._settings, columns=slim_input_columns(reward))
            parts = extract_slim(table, source, reward)
        except BadFile as bad:  # unreadable, or its batches cannot be decided (e.g. null `step`)
            yield from dead_file_outputs(source, bad.reason, bad.message, self._settings.fail_fast,
                                         self._settings.output)
            return
        counter("rows_in").inc(table.num_rows)
        yield pvalue.TaggedOutput(FILES, (source, FileRead(source, table.num_rows, input=record)))
        for batch_key, slim in parts:
            yield batch_key, (source, slim, metadata["prompt_group_sizes"])


class ReadRollouts(beam.PTransform):
    """PCollection[input record] -> tagged outputs slim (main) / files / dead."""

    def __init__(self, settings: RunSettings):
        super().__init__()
        self._fn = ReadSlimTablesFn(settings)

    def expand(self, sources):
        return sources | "ReadSlimTables" >> beam.ParDo(self._fn).with_outputs(FILES, DEAD, main=SLIM)
