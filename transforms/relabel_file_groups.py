"""RelabelFileGroups: groups of files that hold whole batches between them, relabelled in one pass.

A .pt dump is one batch; a Parquet file without `step`, or whose steps no
other input holds, is a group of its own; files sharing steps form one
group. Nothing of a group needs to meet rows outside it, so one DoFn reads
its files once (every column), runs the numeric core on each batch and
writes each file's training rows: no shuffle, memory bounded by one group.
Groups too big for one worker take the shuffle path (ReadRollouts ->
GatherBatches -> GroupAdvantages -> JoinAndWrite) instead; both paths share
every function that does the work.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam import pvalue

from rollout_relabel import schemas
from rollout_relabel.transforms.dofns import (
    CoreDoFn,
    count_batch,
    dead_file_outputs,
    outcome_outputs,
    read_planned,
    stop_on_dead_rows,
)
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.labeling.label_batch import label_batch
from rollout_relabel.transforms.lib.labeling.settings import RunSettings
from rollout_relabel.transforms.lib.labeling.slim import extract_slim, slim_input_columns
from rollout_relabel.transforms.lib.output import part_files
from rollout_relabel.transforms.lib.output.dead_letters import split_by_source
from rollout_relabel.transforms.lib.output.stage_outputs import COUNTERS, DEAD, FILES, FILTERED, STATS, FileRead
from rollout_relabel.transforms.lib.worker import memory
from rollout_relabel.transforms.metrics import counter


class RelabelFileGroupFn(CoreDoFn):
    """A group of input files (one file, or the few files whose batches they share) in one pass."""

    def __init__(self, settings: RunSettings):
        super().__init__(settings.device)
        self._settings = settings
        self._lineage = settings.lineage()

    def process(self, group):
        settings = self._settings
        reward = settings.labeling
        readable = []  # (record, lineage, completeness, table)
        siblings = part_files.batch_inputs(group)
        batches: dict[str, list] = {}
        sizes: dict[str, list | None] = {}
        for record in group:
            source = record["path"]
            lineage = part_files.file_lineage(self._lineage, record, siblings)
            complete = part_files.is_complete(settings.output, record["output"], lineage)
            try:
                # a complete output needs only the slim columns (to rebuild dead letters and counters)
                table, metadata = read_planned(record, settings,
                                               columns=slim_input_columns(reward) if complete[0] else None)
                parts = extract_slim(table, source, reward)
            except BadFile as bad:  # unreadable, or its batches cannot be decided
                yield from dead_file_outputs(source, bad.reason, bad.message, settings.fail_fast, settings.output)
                continue
            memory.release_free_memory(table.nbytes)  # Parquet decoding's scratch buffers
            counter("rows_in").inc(table.num_rows)
            yield pvalue.TaggedOutput(FILES, (source, FileRead(source, table.num_rows, input=record)))
            readable.append((dict(record, rows_in=table.num_rows), lineage, complete, table))
            for batch_key, slim in parts:
                batches.setdefault(batch_key, []).append((source, slim))
                sizes[batch_key] = metadata["prompt_group_sizes"]

        results, dead, filtered = {}, {}, {}
        for batch_key in sorted(batches):
            batch = label_batch(batch_key, batches[batch_key], sizes[batch_key], settings.labeling, self.device)
            stop_on_dead_rows(batch, batch_key, settings.fail_fast, settings.output)
            count_batch(batch.counters)
            for source, table in batch.results.items():
                results.setdefault(source, []).append(table)
            for source, table in split_by_source(batch.dead).items():
                dead.setdefault(source, []).append(table)
            for source, table in split_by_source(batch.filtered).items():
                filtered.setdefault(source, []).append(table)
            yield pvalue.TaggedOutput(COUNTERS, batch.counters)

        while readable:  # popped, so each file's rows are freed once written
            record, lineage, complete, table = readable.pop(0)
            source = record["path"]
            full_table = (lambda r=record: read_planned(r, settings)[0]) if complete[0] else (lambda t=table: t)
            outcome = part_files.finish_file(
                record, full_table, part_files.concat(results.get(source, []), schemas.RESULT),
                part_files.concat(dead.get(source, []), schemas.DEAD_LETTERS),
                part_files.concat(filtered.get(source, []), schemas.DEAD_LETTERS),
                settings.output, lineage, complete, settings.labeling.columns)
            written_bytes = table.nbytes
            del table, full_table
            memory.release_free_memory(written_bytes)
            yield from outcome_outputs(outcome)


class RelabelFileGroups(beam.PTransform):
    """PCollection[list of input records] -> stats (main) / files / dead / filtered / counters."""

    def __init__(self, settings: RunSettings):
        super().__init__()
        self._fn = RelabelFileGroupFn(settings)

    def expand(self, records):
        return records | "RelabelEachGroup" >> beam.ParDo(self._fn).with_outputs(
            FILES, DEAD, FILTERED, COUNTERS, main=STATS)
