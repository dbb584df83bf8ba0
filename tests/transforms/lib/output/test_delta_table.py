"""transforms/lib/output/delta_table.py: commits made with deltalake, on a local disk and on a real
S3-compatible server (moto's server mode, started here on 127.0.0.1), read back with deltalake."""
import json
import os
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from rollout_relabel.transforms.lib.errors import CommitConflict, UsageError
from rollout_relabel.transforms.lib.io import filesystem
from rollout_relabel.transforms.lib.output import delta_table
from rollout_relabel.transforms.lib.output.output_files import write_parquet_atomically
from tests.s3server import moto_s3


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as root:
        yield root


def write_part(table: str, run: str, token: str, name: str, values: list[int]) -> str:
    """A part file inside the table, as a run's staging folder holds it; returns its path in the table."""
    folder = delta_table.staging_folder(table, run, token)
    filesystem.mkdirs(folder)
    write_parquet_atomically(pa.table({"x": pa.array(values, pa.int64())}), folder, name, lineage={"a": 1})
    return f"{delta_table.partition_folder(run)}/{token}/{name}"


def commit_run(table, run, token, values, storage=None, snapshot=None):
    snapshot = snapshot or delta_table.open_snapshot(table, run, storage)
    path = write_part(table, run, token, "part-a.parquet", values)
    actions, schema = delta_table.add_actions(table, run, [path])
    return delta_table.commit(snapshot, actions, schema, {"fingerprint": token, "token": token, "options": {}})


def by_run(table, storage=None, version=None):
    data = pa.table(DeltaTable(table, version=version, storage_options=storage).to_pyarrow_table())
    found = {}
    for x, run in zip(data.column("x").to_pylist(), data.column("run").to_pylist()):
        found.setdefault(run, []).append(x)
    return {run: sorted(xs) for run, xs in found.items()}


@pytest.fixture(params=["local", "s3"])
def table(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "table"), None
    root = request.getfixturevalue("s3")
    return f"{root}/{os.path.basename(str(tmp_path))}/table", delta_table.storage_options(root, {})


def test_each_commit_replaces_its_run_alone_and_carries_our_record(table):
    uri, storage = table
    assert commit_run(uri, "a", "c-1", [1, 2], storage) == 0
    assert commit_run(uri, "b", "c-2", [3], storage) == 1
    assert commit_run(uri, "a", "c-3", [4, 5, 6], storage) == 2
    assert by_run(uri, storage) == {"a": [4, 5, 6], "b": [3]}
    assert by_run(uri, storage, version=1) == {"a": [1, 2], "b": [3]}  # time travel
    assert [(h["version"], h["run"], h["token"]) for h in delta_table.history(uri, storage)] == [
        (2, "a", "c-3"), (1, "b", "c-2"), (0, "a", "c-1")]
    snapshot = delta_table.open_snapshot(uri, "a", storage)
    assert snapshot.files == ("run=a/c-3/part-a.parquet",)
    assert snapshot.last_commit()["token"] == "c-3"


def test_concurrent_commits_of_other_runs_both_land_of_one_run_one_loses(table):
    uri, storage = table
    commit_run(uri, "base", "c-0", [0], storage)
    # both read version 0, then commit at the same moment
    snapshots = {run: delta_table.open_snapshot(uri, run, storage) for run in ("a", "b")}
    paths = {run: write_part(uri, run, f"c-{run}", "part-a.parquet", [ord(run)]) for run in ("a", "b")}
    errors, start = [], threading.Barrier(2)

    def land(run):
        actions, schema = delta_table.add_actions(uri, run, [paths[run]])
        start.wait()
        try:
            delta_table.commit(snapshots[run], actions, schema, {"token": f"c-{run}", "fingerprint": run})
        except Exception as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=land, args=(run,)) for run in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert by_run(uri, storage) == {"base": [0], "a": [97], "b": [98]}

    # two commits of one run, both read the same version: one lands, the other is a CommitConflict
    first, second = (delta_table.open_snapshot(uri, "a", storage) for _ in range(2))
    commit_run(uri, "a", "c-win", [1], storage, snapshot=first)
    with pytest.raises(CommitConflict, match="another backfill of run a committed first"):
        commit_run(uri, "a", "c-lose", [2], storage, snapshot=second)
    assert by_run(uri, storage)["a"] == [1]


def test_two_first_commits_of_one_new_run_conflict(tmp_path):
    uri = str(tmp_path / "table")
    commit_run(uri, "base", "c-0", [0])
    first, second = (delta_table.open_snapshot(uri, "new", None) for _ in range(2))
    commit_run(uri, "new", "c-1", [1], snapshot=first)
    with pytest.raises(CommitConflict):  # the partition was empty: the run's application id catches it
        commit_run(uri, "new", "c-2", [2], snapshot=second)
    assert by_run(uri)["new"] == [1]


def test_the_commit_token_differs_once_the_partition_changes(tmp_path):
    uri = str(tmp_path / "table")
    empty = delta_table.open_snapshot(uri, "a", None)
    token = delta_table.commit_token("f", "inputs", empty)
    assert token == delta_table.commit_token("f", "inputs", delta_table.open_snapshot(uri, "a", None))  # a rerun
    commit_run(uri, "a", token, [1])
    after = delta_table.open_snapshot(uri, "a", None)
    assert delta_table.commit_token("f", "inputs", after) != token
    assert delta_table.commit_token("g", "inputs", empty) != token
    assert delta_table.commit_token("f", "other", empty) != token


def test_part_files_of_no_rows_are_not_added_and_new_columns_widen_the_schema(tmp_path):
    uri = str(tmp_path / "table")
    commit_run(uri, "a", "c-1", [1])
    folder = delta_table.staging_folder(uri, "b", "c-2")
    filesystem.mkdirs(folder)
    pq.write_table(pa.table({"x": pa.array([], pa.int64())}), os.path.join(folder, "part-empty.parquet"))
    pq.write_table(pa.table({"x": [7], "y": ["new"]}), os.path.join(folder, "part-b.parquet"))
    actions, schema = delta_table.add_actions(uri, "b", ["run=b/c-2/part-empty.parquet", "run=b/c-2/part-b.parquet"])
    assert [a.path for a in actions] == ["run=b/c-2/part-b.parquet"]
    assert json.loads(actions[0].stats) == {"numRecords": 1}
    delta_table.commit(delta_table.open_snapshot(uri, "b", None), actions, schema, {"token": "c-2"})
    data = pa.table(DeltaTable(uri).to_pyarrow_table()).sort_by("x")
    assert data.column("y").to_pylist() == [None, "new"]


def test_names_and_options():
    assert delta_table.check_run_name("run-7.b_2") == "run-7.b_2"
    for bad in ("", "a/b", "../x", "a b", "_hidden"):
        with pytest.raises(UsageError):
            delta_table.check_run_name(bad)
    assert delta_table.storage_options("s3://b/t", {}) == {"conditional_put": "etag"}
    assert delta_table.storage_options("s3://b/t", {"AWS_S3_LOCKING_PROVIDER": "dynamodb"}) == {
        "AWS_S3_LOCKING_PROVIDER": "dynamodb"}
    assert delta_table.storage_options("/local/t", {}) is None
    assert delta_table.records_table("s3://b/t/", "dead") == "s3://b/t_dead_letters"
