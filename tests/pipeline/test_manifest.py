"""The manifest's accounting: rows in = out + dead + filtered, or nothing is committed."""
import pytest

from pipeline.manifest import AccountingError, TooManyDeadRows, build_manifest, exit_code

INPUTS = [{"path": "a.parquet", "size": 10, "mtime": 1.0}, {"path": "b.pt", "size": 5, "mtime": 2.0}]


def stats(rows_out=7, dead_rows=2):
    return [
        {"kind": "read", "source": "a.parquet", "rows_in": 6, "reason": None},
        {"kind": "read", "source": "b.pt", "rows_in": 4, "reason": None},
        {"kind": "file", "source": "a.parquet", "output": "part-a.parquet", "rows_out": rows_out - 3},
        {"kind": "file", "source": "b.pt", "output": "part-b.parquet", "rows_out": 3},
        {"kind": "batch", "groups": 3, "rollouts": 9, "uniform_groups": 1, "group_sizes": [0, 0, 1, 2]},
        {"kind": "dead", "rows": dead_rows, "files": 0, "by_reason": {"non-finite-reward": dead_rows},
         "by_source": {"a.parquet": dead_rows}, "output": "dead_letters.parquet"},
        {"kind": "filtered", "rows": 1, "files": 0, "by_reason": {"uniform-group": 1},
         "by_source": {"b.pt": 1}, "output": "filtered.parquet"},
    ]


def test_counts_add_up():
    manifest = build_manifest({"semantics": "x"}, "f", INPUTS, stats())
    assert manifest["counts"] == {"files": 2, "files_unreadable": 0, "rows_in": 10, "rows_out": 7, "rows_dead": 2,
                                  "rows_filtered": 1, "batches": 1, "groups": 3, "rollouts": 9, "uniform_groups": 1}
    assert manifest["group_size_histogram"] == {"2": 1, "3": 2}
    assert [i["rows_dead"] for i in manifest["inputs"]] == [2, 0]
    assert exit_code(manifest) == 3


def test_a_lost_row_fails_loudly():
    with pytest.raises(AccountingError, match="rows in \\(10\\) != rows out \\(6\\)"):
        build_manifest({}, "f", INPUTS, stats(rows_out=6))


def test_max_dead_fraction():
    build_manifest({}, "f", INPUTS, stats(), max_dead_fraction=0.2)
    with pytest.raises(TooManyDeadRows):
        build_manifest({}, "f", INPUTS, stats(), max_dead_fraction=0.1)
