"""CombineFns shared by stages: collect every input into one list, then shape it in extract_output."""
from __future__ import annotations

import apache_beam as beam


class CollectFn(beam.CombineFn):
    """Accumulates inputs in a list; subclasses turn the list into the output."""

    def create_accumulator(self):
        return []

    def add_input(self, items, item):
        items.append(item)
        return items

    def merge_accumulators(self, accumulators):
        return [item for items in accumulators for item in items]

    def extract_output(self, items):
        return items
