"""WriteDifficultyTable on TestPipeline: every bucket's merged rows and every work's counts -> one staged
table, sorted by key, with its counts beside it."""
import hashlib
import json

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.testing.util import assert_that, equal_to

from rollout_relabel.transforms.lib.difficulty import tally_batch
from rollout_relabel.transforms.lib.difficulty.difficulty_settings import DifficultySettings
from rollout_relabel.transforms.lib.difficulty.table import from_rows
from rollout_relabel.transforms.lib.difficulty.units import COUNTS as COUNT_NAMES
from rollout_relabel.transforms.lib.output.output_files import LINEAGE_KEY
from rollout_relabel.transforms.tally_difficulty import COUNTS, MergedRows
from rollout_relabel.transforms.write_difficulty_table import WriteDifficultyTable, counts_name


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def merged(pairs):
    """(bucket, MergedRows) of (prompt, row) pairs; row = (units, passes, parts, runs, first, last, prompt)."""
    rows = tally_batch.rows_table([((sha(p),), row) for p, row in pairs], None)
    return tally_batch.bucket_of_key(sha(pairs[0][0])), MergedRows(rows, None)


def counts(files, units):
    return {**dict.fromkeys(COUNT_NAMES, 0), "files": files, "rows_in": 2 * units, "units": units}


def test_write_difficulty_table_writes_every_bucket_in_key_order_and_sums_the_counts(tmp_path, test_pipeline):
    settings = DifficultySettings(("x",), str(tmp_path), ks=(2,))
    buckets = [merged([("a", (4, 3, (3.0,), 2, 1, 5, "a")), ("c", (2, 0, (), 1, 7, 7, "c"))]),
               merged([("b", (1, 1, (0.5,), 1, 3, 3, "b"))])]
    record = {"kind": "difficulty", "runs": {"r1": {}, "r2": {}}}
    outputs = {"tallies": test_pipeline | "Tallies" >> beam.Create(buckets),
               COUNTS: test_pipeline | "Counts" >> beam.Create([counts(2, 5), counts(1, 2)])}
    written = outputs | WriteDifficultyTable(settings, str(tmp_path), "_staged.parquet", record)
    assert_that(written, equal_to([counts(3, 7)]))
    test_pipeline.run().wait_until_finish()

    table = pq.read_table(tmp_path / "_staged.parquet")
    expected = from_rows([rows.table for _, rows in buckets], None, (2,))
    assert table.replace_schema_metadata(None).equals(expected)
    assert table.column("prompt_key").to_pylist() == sorted(sha(p) for p in "abc")
    assert table.column("pass_at_k_2").to_pylist()[table.column("prompt").to_pylist().index("a")] == 1.0
    assert json.loads(table.schema.metadata[LINEAGE_KEY]) == record
    assert json.loads((tmp_path / counts_name("_staged.parquet")).read_text()) == counts(3, 7)


def test_without_any_units_the_table_is_written_empty(tmp_path, test_pipeline):
    settings = DifficultySettings(("x",), str(tmp_path))
    outputs = {"tallies": test_pipeline | "Tallies" >> beam.Create([]),
               COUNTS: test_pipeline | "Counts" >> beam.Create([counts(1, 0)])}
    written = outputs | WriteDifficultyTable(settings, str(tmp_path), "_staged.parquet", {"kind": "difficulty"})
    assert_that(written, equal_to([counts(1, 0)]))
    test_pipeline.run().wait_until_finish()
    table = pq.read_table(tmp_path / "_staged.parquet")
    assert table.num_rows == 0 and table.schema.names == from_rows([], None, ()).schema.names
