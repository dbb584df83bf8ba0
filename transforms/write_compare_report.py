"""WriteCompareReport: every group's small results -> one report (report.json, report.md, plots).

The accumulator stays bounded whatever the run's size: one record per batch and per file, and
at most LISTED_GROUPS groups and SAMPLE_POINTS points (the smallest sample keys, so the sample
does not depend on how the runner split the work).
"""
from __future__ import annotations

import heapq

import apache_beam as beam

from rollout_relabel.transforms.lib.compare import batches as compare_batches
from rollout_relabel.transforms.lib.compare import report as compare_report
from rollout_relabel.transforms.lib.output.stage_outputs import BATCHES, FILES, GROUPS, POINTS


class SummarizeFn(beam.CombineFn):
    """(kind, item) -> the report dict."""

    def __init__(self, a: dict, b: dict):
        self._a, self._b = a, b

    def create_accumulator(self):
        return {BATCHES: [], FILES: [], GROUPS: [], POINTS: []}

    def add_input(self, accumulator, element):
        kind, item = element
        accumulator[kind].append(item)
        if kind in (GROUPS, POINTS) and len(accumulator[kind]) > 2 * self._bound(kind):
            accumulator[kind] = self._trim(kind, accumulator[kind])
        return accumulator

    def merge_accumulators(self, accumulators):
        merged = self.create_accumulator()
        for accumulator in accumulators:
            for kind, items in accumulator.items():
                merged[kind].extend(items)
        for kind in (GROUPS, POINTS):
            merged[kind] = self._trim(kind, merged[kind])
        return merged

    def extract_output(self, accumulator):
        return compare_batches.summarize(accumulator[BATCHES], accumulator[FILES], accumulator[GROUPS],
                                    accumulator[POINTS], self._a, self._b)

    @staticmethod
    def _bound(kind):
        return compare_batches.LISTED_GROUPS if kind == GROUPS else compare_batches.SAMPLE_POINTS

    def _trim(self, kind, items):
        key = compare_batches.group_rank if kind == GROUPS else None
        return heapq.nsmallest(self._bound(kind), items, key=key)


class WriteReportFn(beam.DoFn):
    def __init__(self, directory: str):
        self._directory = directory

    def process(self, report):
        compare_report.write(report, self._directory)
        yield report["totals"]


class WriteCompareReport(beam.PTransform):
    """{kind: PCollection} of CompareLabelings' outputs -> the report's files in `directory`; yields the totals."""

    def __init__(self, directory: str, a: dict, b: dict):
        super().__init__()
        self._directory, self._a, self._b = directory, a, b

    def expand(self, outputs):
        tagged = [outputs[kind] | f"Tag{kind.capitalize()}" >> beam.Map(lambda item, k=kind: (k, item))
                  for kind in (BATCHES, FILES, GROUPS, POINTS)]
        return (tagged
                | "FlattenResults" >> beam.Flatten()
                | "Summarize" >> beam.CombineGlobally(SummarizeFn(self._a, self._b))
                | "WriteReport" >> beam.ParDo(WriteReportFn(self._directory)))
