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

import schemas
from transforms import file_output, memory, rows
from transforms.core.config import CoreConfig
from transforms.formats import BadFile, read_rollouts
from transforms.group_advantages import COUNTERS, check_fail_fast, count_batch, resolve_device
from transforms.metrics import counter
from transforms.join_and_write import DEAD, FILTERED, STATS, emit_outcome
from transforms.read_rollouts import FILES, dead_file_outputs


class RelabelFileGroupFn(beam.DoFn):
    """A group of input files (one file, or the few files whose batches they share) in one pass."""

    def __init__(self, config: CoreConfig, reward_key, drop_uniform_groups, device, fail_fast, output_dir, lineage):
        self._config = config
        self._reward_key = reward_key
        self._drop_uniform_groups = drop_uniform_groups
        self._requested_device = device
        self._fail_fast = fail_fast
        self._output_dir = output_dir
        self._lineage = lineage
        self._device = None

    def setup(self):
        self._device = resolve_device(self._requested_device)

    def process(self, group):
        readable = []  # (record, lineage, completeness, table)
        batches: dict[str, list] = {}
        sizes: dict[str, list | None] = {}
        for record in group:
            source = record["path"]
            lineage = file_output.file_lineage(self._lineage, record)
            complete = file_output.is_complete(self._output_dir, record["output"], lineage)
            try:
                # a complete output needs only the slim columns (to rebuild dead letters and counters)
                table, metadata = read_rollouts(source, columns=schemas.SLIM_INPUT_COLUMNS if complete[0] else None)
                parts = rows.extract_slim(table, source, self._reward_key)
            except BadFile as bad:  # unreadable, or its batches cannot be decided
                yield from dead_file_outputs(source, bad.reason, bad.message, self._fail_fast)
                continue
            memory.release_free_memory(table.nbytes)  # Parquet decoding's scratch buffers
            counter("rows_in").inc(table.num_rows)
            record = dict(record, rows_in=table.num_rows, reason=None)
            yield pvalue.TaggedOutput(FILES, (source, record))
            readable.append((record, lineage, complete, table))
            for batch_key, slim in parts:
                batches.setdefault(batch_key, []).append((source, slim))
                sizes[batch_key] = metadata["prompt_group_sizes"]

        results, dead, filtered = {}, {}, {}
        for batch_key in sorted(batches):
            batch = rows.relabel_batch(batch_key, batches[batch_key], sizes[batch_key], self._config,
                                       drop_uniform_groups=self._drop_uniform_groups, device=self._device)
            check_fail_fast(batch, batch_key, self._fail_fast)
            count_batch(batch.counters)
            for source, table in batch.results.items():
                results.setdefault(source, []).append(table)
            for source, table in rows.split_by_source(batch.dead).items():
                dead.setdefault(source, []).append(table)
            for source, table in rows.split_by_source(batch.filtered).items():
                filtered.setdefault(source, []).append(table)
            yield pvalue.TaggedOutput(COUNTERS, dict(batch.counters, batch=batch_key))

        while readable:  # popped, so each file's rows are freed once written
            record, lineage, complete, table = readable.pop(0)
            source = record["path"]
            full_table = (lambda source=source: read_rollouts(source)[0]) if complete[0] else (lambda t=table: t)
            outcome = file_output.finish_file(
                record, full_table, file_output.concat(results.get(source, []), schemas.RESULT),
                file_output.concat(dead.get(source, []), schemas.DEAD_LETTERS),
                file_output.concat(filtered.get(source, []), schemas.DEAD_LETTERS),
                self._output_dir, lineage, complete)
            written_bytes = table.nbytes
            del table, full_table
            memory.release_free_memory(written_bytes)
            yield from emit_outcome(outcome)


class RelabelFileGroups(beam.PTransform):
    """PCollection[list of input records] -> stats (main) / files / dead / filtered / counters."""

    def __init__(self, config: CoreConfig, reward_key=None, drop_uniform_groups=False, device="auto",
                 fail_fast=False, output_dir="", lineage=None):
        super().__init__()
        self._fn = RelabelFileGroupFn(config, reward_key, drop_uniform_groups, device, fail_fast, output_dir,
                                      lineage or {})

    def expand(self, records):
        return records | "RelabelEachGroup" >> beam.ParDo(self._fn).with_outputs(
            FILES, DEAD, FILTERED, COUNTERS, main=STATS)
