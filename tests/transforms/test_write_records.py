"""WriteRecords: dead letters (or filtered rows) from anywhere -> one sorted Parquet file and a RecordsWritten."""
import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.testing.util import assert_that, equal_to

import schemas
from tests.transforms.stage_inputs import run_settings
from transforms.lib.records import RecordsWritten
from transforms.write_records import WriteRecords


def records(*rows):
    """(source, row, reason) -> a dead-letter table."""
    source, row, reason = zip(*rows)
    n = len(rows)
    return pa.table({"source": list(source), "row": pa.array(row, pa.int64()), "batch": pa.nulls(n, pa.string()),
                     "reason": list(reason), "message": [f"{s} {r}" for s, r, _ in rows],
                     "row_json": pa.nulls(n, pa.string())}, schema=schemas.DEAD_LETTERS)


def test_records_are_sorted_into_one_file_and_summarized(test_pipeline, tmp_path):
    (tmp_path / "out").mkdir()
    tables = [records(("b.parquet", 1, "non-finite-reward"), ("a.parquet", 5, "duplicate-row")),
              records(("c.pt", None, "unreadable-file")),
              records(("a.parquet", 2, "non-finite-reward"), ("b.parquet", 0, "non-finite-reward"))]
    with test_pipeline as p:
        written = p | beam.Create(tables) | WriteRecords(run_settings(tmp_path), "dead_letters.parquet", "dead")
        assert_that(written, equal_to([RecordsWritten(
            "dead", records=5, rows=4, files=1,
            by_reason={"non-finite-reward": 3, "duplicate-row": 1, "unreadable-file (file)": 1},
            by_source={"a.parquet": 2, "b.parquet": 2}, output="dead_letters.parquet")]))
    table = pq.read_table(tmp_path / "out" / "dead_letters.parquet")
    assert list(zip(*(table.column(c).to_pylist() for c in ("source", "row", "reason")))) == [
        ("a.parquet", 2, "non-finite-reward"), ("a.parquet", 5, "duplicate-row"),
        ("b.parquet", 0, "non-finite-reward"), ("b.parquet", 1, "non-finite-reward"),
        ("c.pt", None, "unreadable-file")]
    assert table.schema.equals(schemas.DEAD_LETTERS, check_metadata=False)
    assert table.schema.metadata and b"rollout_relabel" in table.schema.metadata  # the run's lineage


def test_no_records_no_file_and_no_summary(test_pipeline, tmp_path):
    (tmp_path / "out").mkdir()
    with test_pipeline as p:
        empty = p | beam.Create([schemas.DEAD_LETTERS.empty_table()])
        written = empty | WriteRecords(run_settings(tmp_path), "filtered.parquet", "filtered")
        # a table with no rows still gives the summary of none; no table at all gives nothing
        assert_that(written, equal_to([RecordsWritten("filtered", 0, 0, 0, {}, {}, None)]))
        nothing = p | "Nothing" >> beam.Create([]) | "WriteNone" >> WriteRecords(
            run_settings(tmp_path), "dead_letters.parquet", "dead")
        assert_that(nothing, equal_to([]), label="NoSummary")
    assert os.listdir(tmp_path / "out") == []
