"""Rows a framework wrote but never trained on (docs/inputs.md, `not_trained`): filtered as not-trained, before
grouping, on every path (the CLI's one-pass and shuffle paths, the Python API); nothing is lost."""
import json
import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq

from rollout_relabel import relabel
from tests.conftest import run_cli

# two files of one step; a padding row and an errored trace (its reward null) among the rollouts
ROWS = [
    {"step": 0, "group_index": 0, "rollout_id": 1, "reward": 1.0, "not_trained": None},
    {"step": 0, "group_index": 0, "rollout_id": 2, "reward": 0.0, "not_trained": None},
    {"step": 0, "group_index": 0, "rollout_id": 3, "reward": None, "not_trained": "trace errored"},
    {"step": 0, "group_index": 1, "rollout_id": 4, "reward": 0.25, "not_trained": None},
    {"step": 0, "group_index": 1, "rollout_id": 5, "reward": 0.75, "not_trained": None},
    {"step": 0, "group_index": 1, "rollout_id": 6, "reward": 0.75, "not_trained": "padding row"},
]


def write(folder, rows=ROWS):
    os.makedirs(folder, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows[:3]), os.path.join(folder, "a.parquet"))
    pq.write_table(pa.Table.from_pylist(rows[3:]), os.path.join(folder, "b.parquet"))


def training(out):
    return sorted(pq.read_table(out / "part-a.parquet").to_pylist() + pq.read_table(out / "part-b.parquet").to_pylist(),
                  key=lambda r: r["rollout_id"])


def outputs(out):
    rows = training(out)
    filtered = pq.read_table(out / "_filtered.parquet").to_pylist()
    manifest = json.loads((out / "_manifest.json").read_text())
    return rows, filtered, manifest


def test_cli_filters_not_trained_rows_and_labels_the_rest_without_them(tmp_path):
    write(tmp_path / "in")
    write(tmp_path / "trained", [r for r in ROWS if r["not_trained"] is None])
    run_cli("run", "--input", tmp_path / "in", "--output", tmp_path / "out", "--no-std-normalization")
    run_cli("run", "--input", tmp_path / "trained", "--output", tmp_path / "alone", "--no-std-normalization")
    rows, filtered, manifest = outputs(tmp_path / "out")
    alone = training(tmp_path / "alone")
    assert [r["rollout_id"] for r in rows] == [1, 2, 4, 5]
    assert [r["advantage"] for r in rows] == [0.5, -0.5, -0.25, 0.25]
    assert [r["advantage"] for r in rows] == [r["advantage"] for r in alone]
    assert [(f["source"].rsplit("/", 1)[-1], f["row"], f["reason"]) for f in filtered] == [
        ("a.parquet", 2, "not-trained"), ("b.parquet", 2, "not-trained")]
    assert json.loads(filtered[0]["row_json"])["rollout_id"] == 3  # the whole input row is kept
    assert "trace errored" in filtered[0]["message"] and "padding row" in filtered[1]["message"]
    assert manifest["filtered"]["by_reason"] == {"not-trained": 2}
    counts = manifest["counts"]
    assert (counts["rows_in"], counts["rows_out"], counts["rows_dead"], counts["rows_filtered"]) == (6, 4, 0, 2)


def test_the_shuffle_path_filters_as_the_one_pass_path(tmp_path, monkeypatch):
    import rollout_relabel.pipeline.graph as graph
    from rollout_relabel.transforms.lib.io.inputs import expand_inputs
    from rollout_relabel.transforms.lib.settings import RunSettings

    write(tmp_path / "in")
    seen = {}
    for name, split in (("one_pass", lambda files, **_: ([files], [])), ("shuffle", lambda files, **_: ([], files))):
        monkeypatch.setattr(graph, "group_by_batch_sharing", split)
        out = tmp_path / name
        out.mkdir()
        settings = RunSettings(inputs=(str(tmp_path / "in"),), output=str(out), device="cpu")
        with beam.Pipeline(runner="FnApiRunner") as p:
            graph.build(p, settings, expand_inputs(settings.inputs, settings.output))
        rows, filtered, manifest = outputs(out)
        seen[name] = ([(r["rollout_id"], r["advantage"]) for r in rows],
                      [(f["row"], f["reason"], f["message"]) for f in filtered], manifest["counts"]["rows_filtered"])
    assert seen["shuffle"] == seen["one_pass"]
    assert seen["one_pass"][2] == 2


def test_python_api_filters_not_trained_rows():
    out = relabel(pa.Table.from_pylist(ROWS), std_normalization=False)
    assert out.training_rows.column("rollout_id").to_pylist() == [1, 2, 4, 5]
    assert out.rows_filtered == 2 and out.filtered.column("reason").to_pylist() == ["not-trained"] * 2


def test_a_batch_whose_other_file_trained_every_row(tmp_path):
    """One file of the batch has no not-trained row (its slim rows carry no such column), the other has one."""
    rows = ROWS[:2] + [dict(ROWS[2], reward=0.5, not_trained=None)] + ROWS[3:]
    write(tmp_path / "in", rows)
    run_cli("run", "--input", tmp_path / "in", "--output", tmp_path / "out", "--no-std-normalization")
    kept, filtered, manifest = outputs(tmp_path / "out")
    assert [(r["rollout_id"], r["advantage"]) for r in kept] == [(1, 0.5), (2, -0.5), (3, 0.0), (4, -0.25), (5, 0.25)]
    assert [(f["source"].rsplit("/", 1)[-1], f["row"]) for f in filtered] == [("b.parquet", 2)]
    assert manifest["counts"]["rows_filtered"] == 1


def test_compare_filters_not_trained_rows_on_a_stored_side_too(tmp_path):
    # the framework stored its advantage on the rows it trained (r - group mean); none on the others
    stored = {1: 0.5, 2: -0.5, 4: -0.25, 5: 0.25}
    write(tmp_path / "in", [{**r, "adv": stored.get(r["rollout_id"])} for r in ROWS])
    report = tmp_path / "report"
    run_cli("compare", "--input", tmp_path / "in", "--report", report, "--a", "column:adv",
            "--b", "group-index,std_normalization=false")
    t = json.loads((report / "report.json").read_text())["totals"]
    assert (t["rows"], t["compared"], t["dead_a"], t["dead_b"], t["filtered_a"], t["filtered_b"]) == (6, 4, 0, 0, 2, 2)
    assert t["filtered_a_by_reason"] == t["filtered_b_by_reason"] == {"not-trained": 2}
    assert t["dead_a_by_reason"] == {} and t["agree_fraction"] == 1.0
