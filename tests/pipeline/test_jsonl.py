"""JSONL input (docs/inputs.md): pyarrow's reader, malformed lines dead-lettered alone with their line number."""
import gzip
import json

import pyarrow.parquet as pq

from tests.conftest import run_cli


def _lines(rows):
    return "\n".join(json.dumps(r) for r in rows).encode() + b"\n"


def test_jsonl_with_a_malformed_line_and_gzip(tmp_path):
    rows = [{"step": 1, "uid": "a", "reward": 1.0}, {"step": 1, "uid": "a", "reward": 0.0},
            {"step": 1, "uid": "b", "reward": 0.5}, {"step": 1, "uid": "b", "reward": 0.25}]
    raw = _lines(rows[:2]) + b'{"step": 1, "uid": "b", "rew\n\n' + _lines(rows[2:])
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "1.jsonl").write_bytes(raw)
    (tmp_path / "in" / "2.jsonl.gz").write_bytes(gzip.compress(_lines([dict(r, step=2) for r in rows])))
    run_cli("run", "--input", tmp_path / "in", "--output", tmp_path / "out", "--column", "group_index=uid",
            check_codes=(3,))
    dead = pq.read_table(tmp_path / "out" / "dead_letters.parquet").to_pylist()
    assert [(d["row"], d["reason"]) for d in dead] == [(2, "malformed-line")]
    assert "line 3 " in dead[0]["message"]
    one = pq.read_table(tmp_path / "out" / "part-1.parquet")
    two = pq.read_table(tmp_path / "out" / "part-2.parquet")
    assert one.column("advantage").to_pylist() == two.column("advantage").to_pylist()
    assert one.column("uid").to_pylist() == ["a", "a", "b", "b"]  # the input's own columns kept
