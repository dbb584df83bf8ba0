"""WriteManifest: every stage's stats -> _manifest.json, written last; lost rows are never committed."""
import json
import os

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that

from tests.matchers import manifest_counts
from tests.transforms.stage_inputs import run_settings
from transforms.lib.records import BatchCounts, FileRead, FileWritten, RecordsWritten
from transforms.write_manifest import WriteManifest

INPUTS = [{"path": "a.parquet", "output": "part-a.parquet", "size": 10, "mtime": 1.0},
          {"path": "b.pt", "output": "part-b.parquet", "size": 5, "mtime": 2.0}]


def stats(rows_out_a=3):
    # a: 6 rows in, 2 dead (non-finite-reward), 1 filtered, rows_out_a out; b: 4 in, 4 out
    return [
        FileRead("a.parquet", 6), FileRead("b.pt", 4),
        FileWritten("a.parquet", "part-a.parquet", 6, rows_out_a, resumed=False),
        FileWritten("b.pt", "part-b.parquet", 4, 4, resumed=True),
        BatchCounts("step=0", rows=10, rows_dead=2, rows_filtered=1, groups=3, rollouts=9, uniform_groups=1,
                    group_sizes=[0, 0, 1, 2]),
        RecordsWritten("dead", 2, 2, 0, {"non-finite-reward": 2}, {"a.parquet": 2}, "dead_letters.parquet"),
        RecordsWritten("filtered", 1, 1, 0, {"uniform-group": 1}, {"a.parquet": 1}, "filtered.parquet"),
    ]


def test_manifest_is_written_with_its_counts(test_pipeline, tmp_path):
    (tmp_path / "out").mkdir()
    settings = run_settings(tmp_path)
    with test_pipeline as p:
        manifest = p | beam.Create(stats()) | WriteManifest(settings, INPUTS)
        assert_that(manifest, manifest_counts(files=2, rows_in=10, rows_out=7, rows_dead=2, rows_filtered=1,
                                              batches=1, groups=3, rollouts=9, uniform_groups=1))
    written = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert written["counts"] == {"files": 2, "files_unreadable": 0, "rows_in": 10, "rows_out": 7, "rows_dead": 2,
                                 "rows_filtered": 1, "batches": 1, "groups": 3, "rollouts": 9, "uniform_groups": 1}
    assert written["dead_letters"] == {"file": "dead_letters.parquet", "by_reason": {"non-finite-reward": 2}}
    assert written["filtered"] == {"file": "filtered.parquet", "by_reason": {"uniform-group": 1}}
    assert written["group_size_histogram"] == {"2": 1, "3": 2}
    assert [(i["path"], i["output"], i["rows_in"], i["rows_out"], i["rows_dead"], i["rows_filtered"])
            for i in written["inputs"]] == [("a.parquet", "part-a.parquet", 6, 3, 2, 1),
                                            ("b.pt", "part-b.parquet", 4, 4, 0, 0)]
    assert written["fingerprint"] == settings.fingerprint() and len(written["fingerprint"]) == 16
    assert written["run"]["semantics"] == "rollout-mainstream" and written["run"]["project"] == "rollout-relabel"
    assert not (tmp_path / "out" / "_stop.json").exists()


def test_lost_rows_are_refused_with_a_stop_record(test_pipeline, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(Exception, match=r"rows in \(10\) != rows out \(6\)"):
        with test_pipeline as p:
            _ = p | beam.Create(stats(rows_out_a=2)) | WriteManifest(run_settings(tmp_path), INPUTS)
    assert sorted(os.listdir(tmp_path / "out")) == ["_stop.json"]  # no manifest
    stop = json.loads((tmp_path / "out" / "_stop.json").read_text())
    assert stop == {"kind": "AccountingError",
                    "message": "rows in (10) != rows out (6) + dead (2) + filtered (1); refusing to commit the "
                               "manifest"}


def test_too_many_dead_rows_are_refused_with_a_stop_record(test_pipeline, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(Exception, match="above --max-dead-fraction 0.1"):
        with test_pipeline as p:
            _ = p | beam.Create(stats()) | WriteManifest(run_settings(tmp_path, max_dead_fraction=0.1), INPUTS)
    assert sorted(os.listdir(tmp_path / "out")) == ["_stop.json"]
    stop = json.loads((tmp_path / "out" / "_stop.json").read_text())
    assert stop["kind"] == "TooManyDeadRows"
    assert stop["message"].startswith("2 of 10 rows are dead (20.0%)")
