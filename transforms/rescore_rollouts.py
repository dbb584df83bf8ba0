"""RescoreRollouts: each input's rows scored by the user's verifier before anything is grouped.

read -> (rescore) -> slim -> group -> core -> join -> write. This stage reads
each input file, calls the verifier for the rows whose reward the output does
not hold yet (many calls in flight, or worker processes for a CPU-bound
function), keeps every answer under the output's `_rewards/` folder, and
passes the file record on with the digest of its rows' rewards. The stages
after it read the new rewards in place of the stored ones (file_group.read_planned):
the core never learns where a reward came from.
"""
from __future__ import annotations

import apache_beam as beam

from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.labeling.file_group import read_planned
from rollout_relabel.transforms.lib.labeling.settings import RunSettings
from rollout_relabel.transforms.lib.rescoring.calls import Caller
from rollout_relabel.transforms.lib.rescoring.rescore import rescore_file
from rollout_relabel.transforms.lib.rescoring.rows import slime_options
from rollout_relabel.transforms.metrics import counter


class RescoreFn(beam.DoFn):
    """A group of input records (or one record) -> the same, each with `rewards`: its rows' reward digest."""

    def __init__(self, settings: RunSettings):
        self._settings = settings
        self._caller = None

    def setup(self):
        self._caller = Caller(self._settings.rescoring, slime_options(self._settings.labeling))

    def teardown(self):
        if self._caller is not None:
            self._caller.close()

    def process(self, element):
        if isinstance(element, dict):
            yield self._rescored(element)
        else:
            yield [self._rescored(record) for record in element]

    def _rescored(self, record: dict) -> dict:
        settings = self._settings
        try:
            table, _ = read_planned(record, settings, rescored=False)
        except BadFile:  # the next stage reads it again and dead-letters the whole file, as without rescoring
            return record
        done = rescore_file(table, record["output"], settings.output, settings.rescoring, settings.labeling,
                            self._caller)
        counter("reward_calls").inc(done.calls)
        counter("rewards_reused").inc(done.reused)
        counter("rewards_failed").inc(done.failed)
        return dict(record, rewards=done.digest)


class RescoreRollouts(beam.PTransform):
    """PCollection[list of input records | input record] -> the same, rescored."""

    def __init__(self, settings: RunSettings):
        super().__init__()
        self._fn = RescoreFn(settings)

    def expand(self, records):
        return records | "RescoreEachInput" >> beam.ParDo(self._fn)
