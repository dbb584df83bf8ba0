"""RelabelGroups: complete prompt groups (from AssembleGroups) -> training rows with advantages.

Each group goes through the same adapters and numeric core as files do
(rows.extract_slim -> rows.relabel_batch -> rows.training_rows), one group
as one batch: only semantics that group rows by `group_index` are allowed,
since the positional rules need a whole batch in order.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam import pvalue

from transforms import rows
from transforms.assemble_groups import DEAD, STREAM_SOURCE
from transforms.core.config import CoreConfig
from transforms.group_advantages import resolve_device

TRAINING = "training"
GROUP_SEMANTICS = ("rollout-mainstream", "rollout-shared", "group-index")


def relabel_group(key, group_rows: list[dict], config: CoreConfig, reward_key, device: str):
    """(training-row table, dead-letter table) of one complete group."""
    import pyarrow as pa

    batch, group = key
    table = pa.Table.from_pylist(group_rows)
    source = f"{STREAM_SOURCE}:step={batch}:group={group}"
    (_, slim), = rows.extract_slim(table, source, reward_key)
    result = rows.relabel_batch(f"step={batch}", [(source, slim)], None, config, device=device)
    dead = rows.with_row_json(result.dead, table) if result.dead.num_rows else result.dead
    return rows.training_rows(table, result.results[source]), dead


class RelabelGroupFn(beam.DoFn):
    def __init__(self, config: CoreConfig, reward_key, device):
        self._config, self._reward_key, self._requested_device = config, reward_key, device
        self._device = None

    def setup(self):
        self._device = resolve_device(self._requested_device)

    def process(self, element):
        key, group_rows = element
        training, dead = relabel_group(key, group_rows, self._config, self._reward_key, self._device)
        if training.num_rows:
            yield training
        if dead.num_rows:
            yield pvalue.TaggedOutput(DEAD, dead)


class RelabelGroups(beam.PTransform):
    """PCollection[((batch, group), [row dicts])] -> training (main: one table per group) / dead (tables)."""

    def __init__(self, config: CoreConfig, reward_key=None, device="auto"):
        super().__init__()
        if config.semantics not in GROUP_SEMANTICS:
            raise ValueError(f"{config.semantics} groups rows by position in a whole batch; a row stream "
                             f"needs one of {', '.join(GROUP_SEMANTICS)}")
        self._fn = RelabelGroupFn(config, reward_key, device)

    def expand(self, groups):
        return groups | "RelabelEachGroup" >> beam.ParDo(self._fn).with_outputs(DEAD, main=TRAINING)
