"""GatherBatches: the slim parts of one batch (one or many files) brought together."""
from __future__ import annotations

import apache_beam as beam

from rollout_relabel.transforms.combiners import CollectFn


class GatherBatchFn(CollectFn):
    """Collects (source, slim table, prompt_group_sizes) parts; order is fixed later by (source, row)."""

    def extract_output(self, parts):
        parts = sorted(parts, key=lambda part: part[0])  # runners deliver in any order
        sizes = next((s for _, _, s in parts if s is not None), None)
        return [(source, table) for source, table, _ in parts], sizes


class GatherBatches(beam.PTransform):
    """PCollection[(batch key, part)] -> PCollection[(batch key, ([(source, slim)], prompt_group_sizes))]."""

    def expand(self, keyed_parts):
        return keyed_parts | "CombinePerBatch" >> beam.CombinePerKey(GatherBatchFn())
