"""TallyDifficulty: file groups of each run -> tally batches -> one merged row per prompt key (and run or step).

Each element is a pack of Works (each one run's groups of files, a group sharing no batch with the run's
other files; or the rows of the table being added to); a DoFn turns each work into its tally batch with
tally_pack (an Arrow table, a row per key: transforms/lib/difficulty/tally_batch.py) and sends it on cut
by hash bucket of the key (tally_batch.BUCKETS buckets, the same for every group and run), not an
element per prompt. CombinePerKey gathers
the batches of one bucket from every group and run, and DifficultyCombineFn merges them once they are all
in, with one Arrow group-by, so the runner's per-element cost is paid per bucket: a run of all-different
prompts costs no more elements than one of a few. Merging is exact and order-free, so the result does not
depend on the runner's split. The counts of each work (files, rows, dead rows, units) leave on the COUNTS
output.
"""
from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue

from rollout_relabel.transforms.dofns import CoreDoFn
from rollout_relabel.transforms.lib.difficulty import tally_batch
from rollout_relabel.transforms.lib.difficulty.difficulty_settings import DifficultySettings
from rollout_relabel.transforms.lib.difficulty.units import Work, tally_pack
from rollout_relabel.transforms.metrics import counter

COUNTS = "counts"
ROW_BYTES = 120  # about what one key's row of a tally batch takes (a sha256 key, a run name, a prompt)


def bucket_of(key: tuple) -> int:
    """A key's bucket: a hash of its prompt key (the same in every process, unlike hash() of text)."""
    return tally_batch.bucket_of_key(key[0])


class MergedRows:
    """One bucket's merged rows (tally_batch.ROW columns, each key once): an Arrow table, iterable as
    (key, row) pairs of plain values (table.row_of's)."""

    __slots__ = ("table", "by")

    def __init__(self, table: pa.Table, by: str | None):
        self.table, self.by = table, by

    def __iter__(self):
        return tally_batch.rows(self.table, self.by)

    def __reduce__(self):
        return MergedRows, (self.table, self.by)


class DifficultyCombineFn(beam.CombineFn):
    """Tally batches of one bucket -> MergedRows, each key once.

    The accumulator is the list of batches as they came (Arrow tables); they are merged once, in
    extract_output. A batch may also come as [(key, Tally state)] pairs (tally_batch.from_states)."""

    def __init__(self, by: str | None = None):
        super().__init__()
        self._by = by

    def create_accumulator(self):
        return []

    def add_input(self, accumulator, batch):
        accumulator.append(batch if isinstance(batch, pa.Table) else tally_batch.from_states(batch, self._by))
        return accumulator

    def merge_accumulators(self, accumulators):
        return [batch for accumulator in accumulators for batch in accumulator]

    def extract_output(self, accumulator):
        return MergedRows(tally_batch.merge(accumulator, self._by), self._by)

    def get_accumulator_coder(self):
        return BatchesCoder()


class BatchesCoder(beam.coders.Coder):
    """DifficultyCombineFn's accumulator (Arrow tables of one schema) as one Arrow IPC stream. Its size is
    estimated from its row count: a runner measures accumulators often, and encoding one (or summing its
    buffers) to measure it would cost more than the merge."""

    def encode(self, batches: list) -> bytes:
        if not batches:
            return b""
        table = tally_batch.concat(batches)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.combine_chunks())
        return sink.getvalue().to_pybytes()

    def decode(self, encoded: bytes) -> list:
        return [pa.ipc.open_stream(encoded).read_all()] if encoded else []

    def estimate_size(self, batches: list) -> int:
        return ROW_BYTES * sum(batch.num_rows for batch in batches)

    def is_deterministic(self) -> bool:
        return False  # the order batches came in: a value, never a key


class TallyWorkFn(CoreDoFn):
    def __init__(self, settings: DifficultySettings):
        super().__init__(settings.device)
        self._settings = settings

    def process(self, pack: tuple[Work, ...]):
        for item in tally_pack(pack, self._settings, self.device):
            if isinstance(item, dict):
                counter("difficulty_units").inc(item["units"])
                yield pvalue.TaggedOutput(COUNTS, item)
            else:
                yield from tally_batch.split(item)


class TallyDifficulty(beam.PTransform):
    """PCollection[tuple[Work, ...]] (packs of works: pipeline/difficulty.py's elements) -> (bucket,
    MergedRows) per bucket, each key once (main), and counts dicts (COUNTS), one a work."""

    def __init__(self, settings: DifficultySettings):
        super().__init__()
        self._settings = settings

    def expand(self, works):
        results = works | "TallyEachGroup" >> beam.ParDo(TallyWorkFn(self._settings)).with_outputs(
            COUNTS, main="tallies")
        combined = results.tallies | "CombinePerBucket" >> beam.CombinePerKey(
            DifficultyCombineFn(self._settings.by))
        return {"tallies": combined, COUNTS: results[COUNTS]}
