"""What the stages' DoFns share: the core's device set-up, fail-fast stops and a file's tagged outputs.

Not a stage: the stages (one per module beside this one) import it.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam import pvalue

from rollout_relabel.transforms.lib.errors import FailFast, InputChanged
from rollout_relabel.transforms.lib.io.readers import read_input
from rollout_relabel.transforms.lib.labeling.label_batch import BatchResult
from rollout_relabel.transforms.lib.labeling.settings import RunSettings
from rollout_relabel.transforms.lib.output.dead_letters import file_dead_letter
from rollout_relabel.transforms.lib.output.output_dir import stop_run
from rollout_relabel.transforms.lib.output.part_files import FileOutcome
from rollout_relabel.transforms.lib.output.records import DEAD, FILES, FILTERED, BatchCounts, FileRead
from rollout_relabel.transforms.lib.rescoring import rows, store
from rollout_relabel.transforms.lib.worker.device import resolve_device
from rollout_relabel.transforms.metrics import counter


class CoreDoFn(beam.DoFn):
    """A DoFn that runs the numeric core: its device is chosen once per worker, in setup()."""

    def __init__(self, requested_device: str):
        self._requested_device = requested_device
        self.device = None

    def setup(self):
        self.device = resolve_device(self._requested_device)


def read_planned(record: dict, settings: RunSettings, columns=None, rescored: bool = True):
    """An input's rows, as the plan listed it (readers.read_input); a changed input stops the run.

    With rescoring, the rows carry the rewards the rescore stage recorded for them (rescored=False: as stored).
    """
    try:
        table, metadata = read_input(record, columns, settings.max_file_bytes, use_threads=settings.parallel_decode)
    except InputChanged as changed:
        raise stop_run(settings.output, changed) from None
    if settings.rescoring is not None and rescored:
        table = with_new_rewards(table, record, settings)
    return table, metadata


def with_new_rewards(table, record: dict, settings: RunSettings):
    """The rewards the rescore stage recorded for this input, in place of the stored ones."""
    answers = store.read_rows(settings.output, record["output"])
    if answers is None or answers.num_rows != table.num_rows:
        raise RuntimeError(f"{record['path']}: the rescore stage recorded no rewards for its {table.num_rows} rows")
    return rows.apply(table, answers.column("value").to_pylist(), answers.column("error").to_pylist(),
                      rows.reward_column(settings.labeling))


def stop_on_dead_rows(result: BatchResult, batch_key: str, fail_fast: bool, output: str) -> None:
    """--fail-fast: the batch's first dead row stops the run (committed as a stop record in output)."""
    if fail_fast and result.dead.num_rows:
        first = result.dead.slice(0, 1).to_pylist()[0]
        raise stop_run(output, FailFast(
            f"{first['reason']}: {first['source']} row {first['row']} ({batch_key}): {first['message']}"))


def count_batch(counts: BatchCounts) -> None:
    for name in ("groups", "rollouts", "uniform_groups", "rows_dead", "rows_filtered"):
        counter(name).inc(getattr(counts, name))


def dead_file_outputs(source: str, reason: str, message: str, fail_fast: bool, output: str):
    """A whole file is unusable: one dead letter with a null row, and its file record."""
    if fail_fast:
        raise stop_run(output, FailFast(f"{reason}: {message}"))
    counter("files_dead").inc()
    yield pvalue.TaggedOutput(DEAD, file_dead_letter(source, reason, message))
    yield pvalue.TaggedOutput(FILES, (source, FileRead(source, 0, reason)))


def outcome_outputs(outcome: FileOutcome):
    """A finished file's outputs: its dead and filtered records (tagged) and its stats (main)."""
    counter("files_skipped" if outcome.stats.resumed else "files_out").inc()
    counter("rows_out").inc(outcome.stats.rows_out)
    if outcome.dead.num_rows:
        yield pvalue.TaggedOutput(DEAD, outcome.dead)
    if outcome.filtered.num_rows:
        yield pvalue.TaggedOutput(FILTERED, outcome.filtered)
    yield outcome.stats
