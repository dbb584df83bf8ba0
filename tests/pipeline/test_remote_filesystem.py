"""The whole pipeline over `mem://` (an object store with no directories): no local-only path handling."""
import io
import json

import pyarrow.parquet as pq
import pytest

from rollout_relabel.pipeline.generate import RunSpec, write_parquet_run, write_pt_run
from tests import memfs
from tests.conftest import run_cli

SOURCE_KEYS = ("source", "input_mtime", "batch_inputs")


def _without_source(table):
    lineage = json.loads(table.schema.metadata[b"rollout_relabel"])
    return {k: v for k, v in lineage.items() if k not in SOURCE_KEYS}


@pytest.fixture
def mem_inputs(tmp_path):
    local = tmp_path / "in"
    write_parquet_run(RunSpec(steps=2, prompts_per_step=4, files_per_step=2, seed=5), local / "parquet")
    write_pt_run(RunSpec(steps=2, prompts_per_step=3, seed=6), local / "dumps", flavor="miles")
    memfs.clear()
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        memfs.put("mem://bucket/in/" + path.relative_to(local).as_posix(), path.read_bytes())
    yield local
    memfs.clear()


def test_run_reads_and_writes_only_through_filesystems(mem_inputs, tmp_path):
    run_cli("run", "--input", mem_inputs, "--output", tmp_path / "local")
    run_cli("run", "--input", "mem://bucket/in", "--output", "mem://bucket/out")

    written = memfs.keys("mem://bucket/out/")
    local_names = sorted(p.name for p in (tmp_path / "local").iterdir())
    assert [k.rsplit("/", 1)[1] for k in written] == local_names
    assert not [k for k in written if "/.tmp-" in k]
    for name in local_names:
        if name == "_manifest.json":
            continue
        remote = pq.read_table(io.BytesIO(memfs.get("mem://bucket/out/" + name)))
        local = pq.read_table(tmp_path / "local" / name)
        # equal rows; the lineage differs only where it names the source (path, mtime, the batch's inputs)
        if "source" in remote.column_names:  # dead letters name their input file
            assert [s.replace("mem://bucket/in/", "") for s in remote["source"].to_pylist()] == [
                s.replace(str(mem_inputs) + "/", "") for s in local["source"].to_pylist()]
            remote, local = remote.drop_columns(["source"]), local.drop_columns(["source"])
        assert remote.equals(local), name
        assert _without_source(remote) == _without_source(local)
    manifest = json.loads(memfs.get("mem://bucket/out/_manifest.json"))
    assert manifest["counts"]["rows_in"] == manifest["counts"]["rows_out"] > 0
    assert all(i["path"].startswith("mem://bucket/in/") for i in manifest["inputs"])


def test_rerun_over_complete_remote_output_is_a_no_op(mem_inputs):
    run_cli("run", "--input", "mem://bucket/in/", "--output", "mem://bucket/out")
    before = {k: memfs.get(k) for k in memfs.keys("mem://bucket/out/")}
    again = run_cli("run", "--input", "mem://bucket/in/", "--output", "mem://bucket/out")
    assert "already complete" in again.stdout
    assert {k: memfs.get(k) for k in memfs.keys("mem://bucket/out/")} == before


def test_interrupted_remote_output_resumes(mem_inputs):
    run_cli("run", "--input", "mem://bucket/in", "--output", "mem://bucket/out")
    complete = {k: memfs.get(k) for k in memfs.keys("mem://bucket/out/")}
    parts = [k for k in complete if "/part-" in k]
    memfs.MemoryFileSystem(None).delete(["mem://bucket/out/_manifest.json", parts[0]])
    memfs.put("mem://bucket/out/.tmp-half-written", b"PAR1")
    run_cli("run", "--input", "mem://bucket/in", "--output", "mem://bucket/out")
    assert {k: memfs.get(k) for k in memfs.keys("mem://bucket/out/")} == complete
