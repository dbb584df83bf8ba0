"""CompareLabelings: groups of input files, each read once, every batch labelled under A and under B.

Only the slim columns are read (rewards, keys, masks), so one worker holds a group's slim rows,
tens of bytes a row. Each group yields its batches' counts, its differing groups and its sample
points, all small; no row-level data leaves the worker. A group's files are counted in a tiny
file under the progress folder once done, which the driver polls to show progress.
"""
from __future__ import annotations

import hashlib
import json

import apache_beam as beam
from apache_beam import pvalue

import schemas
from transforms import rows, sinks
from transforms.comparison import Side, compare_batch
from transforms.core.reasons import BadFile
from transforms.formats import read_rollouts
from transforms.group_advantages import resolve_device
from transforms.metrics import counter

BATCHES, GROUPS, POINTS, FILES = "batches", "groups", "points", "files"


def progress_name(group: list[dict]) -> str:
    return hashlib.sha256("\0".join(r["path"] for r in group).encode()).hexdigest()[:20] + ".json"


class CompareFileGroupFn(beam.DoFn):
    def __init__(self, a: Side, b: Side, reward_key, device, progress_dir):
        self._a, self._b = a, b
        self._reward_key = reward_key
        self._requested_device = device
        self._progress_dir = progress_dir
        self._device = None

    def setup(self):
        self._device = resolve_device(self._requested_device)

    def process(self, group):
        names = {r["path"]: r["name"] for r in group}
        batches: dict[str, list] = {}
        sizes: dict[str, list | None] = {}
        rows_read = 0
        for record in group:
            source = record["path"]
            try:
                table, metadata = read_rollouts(source, columns=schemas.SLIM_INPUT_COLUMNS)
                parts = rows.extract_slim(table, source, self._reward_key)
            except BadFile as bad:  # counted in the report under both labelings
                yield pvalue.TaggedOutput(FILES, {"name": record["name"], "rows": 0, "reason": bad.reason,
                                                  "message": bad.message})
                continue
            rows_read += table.num_rows
            counter("rows_in").inc(table.num_rows)
            yield pvalue.TaggedOutput(FILES, {"name": record["name"], "rows": table.num_rows, "reason": None,
                                              "message": None})
            for batch_key, slim in parts:
                batches.setdefault(batch_key, []).append((source, slim))
                sizes[batch_key] = metadata["prompt_group_sizes"]
        for batch_key in sorted(batches):
            result = compare_batch(batch_key, batches[batch_key], sizes[batch_key], self._a, self._b, names,
                                   self._device)
            yield result.record
            for listed in result.groups:
                yield pvalue.TaggedOutput(GROUPS, listed)
            for point in result.points:
                yield pvalue.TaggedOutput(POINTS, point)
        if self._progress_dir:
            sinks.write_bytes_atomically(json.dumps({"files": len(group), "rows": rows_read}).encode(),
                                         self._progress_dir, progress_name(group))


class CompareLabelings(beam.PTransform):
    """PCollection[list of input records {path, name, ...}] -> batches (main) / groups / points / files."""

    def __init__(self, a: Side, b: Side, reward_key=None, device="auto", progress_dir=None):
        super().__init__()
        self._fn = CompareFileGroupFn(a, b, reward_key, device, progress_dir)

    def expand(self, groups):
        return groups | "CompareEachGroup" >> beam.ParDo(self._fn).with_outputs(GROUPS, POINTS, FILES, main=BATCHES)
