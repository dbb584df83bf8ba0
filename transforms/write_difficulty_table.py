"""WriteDifficultyTable: every bucket's merged rows and every group's counts -> one staged Parquet table.

The rows are gathered in one place (one row a prompt: small next to the rollouts) and sorted by key,
so the file's bytes do not depend on the runner. The table is written under a staging name; the
command commits it (a rename into the folder, or one Delta commit) once the pipeline has finished.
"""
from __future__ import annotations

import json

import apache_beam as beam

from rollout_relabel.transforms.lib.difficulty import table as difficulty_table
from rollout_relabel.transforms.lib.difficulty.difficulty_settings import DifficultySettings
from rollout_relabel.transforms.lib.difficulty.units import COUNTS
from rollout_relabel.transforms.lib.output.output_files import write_bytes_atomically, write_parquet_atomically
from rollout_relabel.transforms.tally_difficulty import COUNTS as COUNTS_TAG


def counts_name(table_name: str) -> str:
    """The file beside the staged table holding the counts of the pass that made it."""
    return table_name.rsplit(".", 1)[0] + ".counts.json"


class WriteTableFn(beam.DoFn):
    def __init__(self, settings: DifficultySettings, directory: str, name: str, record: dict):
        self._settings, self._directory, self._name, self._record = settings, directory, name, record

    def process(self, _, tallies, group_counts):
        counts = dict.fromkeys(COUNTS, 0)
        for value in group_counts:
            for name in COUNTS:
                counts[name] += value[name]
        table = difficulty_table.from_rows([rows.table for _, rows in tallies], self._settings.by, self._settings.ks)
        # the counts of this pass beside the table, not in it: a table built run by run is byte for byte
        # the table built at once
        write_bytes_atomically(json.dumps(counts, sort_keys=True).encode(), self._directory,
                               counts_name(self._name))
        write_parquet_atomically(table, self._directory, self._name, lineage=self._record,
                                 distinct=difficulty_table.DISTINCT)
        yield counts


class WriteDifficultyTable(beam.PTransform):
    """{"tallies": (bucket, MergedRows), COUNTS: dict} -> the staged table directory/name (and its counts,
    counts_name); yields the counts."""

    def __init__(self, settings: DifficultySettings, directory: str, name: str, record: dict):
        super().__init__()
        self._fn = WriteTableFn(settings, directory, name, record)

    def expand(self, outputs):
        # written once, when every bucket's rows and every group's counts are in: one element, with both as
        # side inputs (as Beam's own file sinks finalize). It is written when there are no rows too: an empty
        # table. A bucket's rows are one element each, a few next to the rollouts.
        return (outputs["tallies"].pipeline
                | "Once" >> beam.Create([None])
                | "WriteTable" >> beam.ParDo(self._fn, beam.pvalue.AsList(outputs["tallies"]),
                                             beam.pvalue.AsList(outputs[COUNTS_TAG])))
