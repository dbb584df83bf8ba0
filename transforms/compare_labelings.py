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

from rollout_relabel.transforms.dofns import CoreDoFn
from rollout_relabel.transforms.lib.compare.batches import compare_batch
from rollout_relabel.transforms.lib.io.readers import read_table
from rollout_relabel.transforms.lib.labeling.file_group import Buckets, Unreadable, read_slim
from rollout_relabel.transforms.lib.labeling.settings import CompareSettings
from rollout_relabel.transforms.lib.labeling.slim import slim_input_columns
from rollout_relabel.transforms.lib.output import output_files
from rollout_relabel.transforms.lib.output.stage_outputs import BATCHES, FILES, GROUPS, POINTS
from rollout_relabel.transforms.metrics import counter


def progress_name(group: list[dict]) -> str:
    return hashlib.sha256("\0".join(r["path"] for r in group).encode()).hexdigest()[:20] + ".json"


class CompareFileGroupFn(CoreDoFn):
    def __init__(self, settings: CompareSettings, progress_dir: str | None):
        super().__init__(settings.device)
        self._settings = settings
        self._progress_dir = progress_dir

    def process(self, group):
        settings = self._settings
        reward, stored = settings.read_labeling(), settings.stored_column()
        columns = slim_input_columns(reward, stored)
        names = {r["path"]: r["name"] for r in group}
        buckets = Buckets()
        rows_read = 0
        for item in read_slim(group, lambda entry: read_table(entry["path"], columns=columns), reward,
                              stored):
            if isinstance(item, Unreadable):  # counted in the report under both labelings
                yield pvalue.TaggedOutput(FILES, {"name": item.entry["name"], "rows": 0, "reason": item.reason,
                                                  "message": item.message})
                continue
            rows_read += item.table.num_rows
            counter("rows_in").inc(item.table.num_rows)
            yield pvalue.TaggedOutput(FILES, {"name": item.entry["name"], "rows": item.table.num_rows,
                                              "reason": None, "message": None})
            buckets.add(item)
        for batch_key, parts, sizes in buckets.in_order():
            result = compare_batch(batch_key, parts, sizes, settings.a, settings.b, names, self.device)
            yield result.counts
            for listed in result.groups:
                yield pvalue.TaggedOutput(GROUPS, listed)
            for point in result.points:
                yield pvalue.TaggedOutput(POINTS, point)
        if self._progress_dir:
            output_files.write_bytes_atomically(json.dumps({"files": len(group), "rows": rows_read}).encode(),
                                                self._progress_dir, progress_name(group))


class CompareLabelings(beam.PTransform):
    """PCollection[list of input entries {path, name, ...}] -> batches (main) / groups / points / files."""

    def __init__(self, settings: CompareSettings, progress_dir: str | None = None):
        super().__init__()
        self._fn = CompareFileGroupFn(settings, progress_dir)

    def expand(self, groups):
        return groups | "CompareEachGroup" >> beam.ParDo(self._fn).with_outputs(GROUPS, POINTS, FILES, main=BATCHES)
