"""GroupAdvantages: one batch's slim rows through the numeric core (mainstream, group stats, advantages)."""
from __future__ import annotations

import glob

import apache_beam as beam
from apache_beam import pvalue

from transforms import rows
from transforms.core.config import CoreConfig
from transforms.formats import FailFast
from transforms.metrics import counter

RESULTS = "results"
DEAD = "dead"
FILTERED = "filtered"
COUNTERS = "counters"


def resolve_device(requested: str) -> str:
    """The core's device for this worker (called in DoFn.setup): "cpu" (numpy) or a torch device.

    "auto" imports torch only where an NVIDIA device node exists: a CPU worker never pays for torch.
    """
    if requested == "auto":
        return "cuda" if _has_nvidia_device() and _torch_sees_cuda() else "cpu"
    if requested.startswith("cuda") and not _torch_sees_cuda():
        raise RuntimeError("--device cuda was requested but this worker has no CUDA device")
    return requested


def _has_nvidia_device() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def _torch_sees_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def check_fail_fast(result, batch_key, fail_fast):
    if fail_fast and result.dead.num_rows:
        first = result.dead.slice(0, 1).to_pylist()[0]
        raise FailFast(f"{first['reason']}: {first['source']} row {first['row']} ({batch_key}): {first['message']}")


def count_batch(counts):
    for name in ("groups", "rollouts", "uniform_groups", "rows_dead", "rows_filtered"):
        counter(name).inc(counts[name])


class GroupAdvantagesFn(beam.DoFn):
    def __init__(self, config: CoreConfig, drop_uniform_groups: bool, device: str, fail_fast: bool = False):
        self._config = config
        self._fail_fast = fail_fast
        self._drop_uniform_groups = drop_uniform_groups
        self._requested_device = device
        self._device = None

    def setup(self):
        self._device = resolve_device(self._requested_device)

    def process(self, element):
        batch_key, (parts, sizes) = element
        result = rows.relabel_batch(batch_key, parts, sizes, self._config,
                                    drop_uniform_groups=self._drop_uniform_groups, device=self._device)
        check_fail_fast(result, batch_key, self._fail_fast)
        count_batch(result.counters)
        counts = result.counters
        for source, table in result.results.items():
            yield source, table
        for source, records in rows.split_by_source(result.dead).items():
            yield pvalue.TaggedOutput(DEAD, (source, records))
        for source, records in rows.split_by_source(result.filtered).items():
            yield pvalue.TaggedOutput(FILTERED, (source, records))
        yield pvalue.TaggedOutput(COUNTERS, dict(counts, batch=batch_key))


class GroupAdvantages(beam.PTransform):
    """PCollection[(batch, ([slim], sizes))] -> results / dead / filtered, each (source, table); counters."""

    def __init__(self, config: CoreConfig, drop_uniform_groups: bool = False, device: str = "auto",
                 fail_fast: bool = False):
        super().__init__()
        self._fn = GroupAdvantagesFn(config, drop_uniform_groups, device, fail_fast)

    def expand(self, batches):
        return batches | "RunNumericCore" >> beam.ParDo(self._fn).with_outputs(
            DEAD, FILTERED, COUNTERS, main=RESULTS)
