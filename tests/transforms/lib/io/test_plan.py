"""The plan: which inputs hold whole batches (one pass), which share a batch (shuffle), and their sizes from footers."""
import os

import pyarrow as pa
import pyarrow.parquet as pq

from rollout_relabel.pipeline.generate import RunSpec, write_parquet_run
from rollout_relabel.transforms.lib.io.inputs import expand_inputs
from rollout_relabel.transforms.lib.io.plan import group_by_batch_sharing, read_footers
from tests.conftest import FIXTURES


def test_overlapping_step_ranges_share_batches(tmp_path):
    def write(name, steps):
        pq.write_table(pa.table({"reward": [0.0] * len(steps), "step": steps}), tmp_path / name)
    write("a.parquet", [0, 0, 1])
    write("b.parquet", [1, 2])        # shares step 1 with a
    write("c.parquet", [5, 6])        # alone
    write("d.parquet", [2, 2])        # shares step 2 with b (a chain: a-b-d)
    pq.write_table(pa.table({"reward": [0.0]}), tmp_path / "e.parquet")  # no step: its own batch
    (tmp_path / "f.parquet").write_bytes(b"junk")  # unreadable: the one-pass path reports it
    files = expand_inputs([str(tmp_path)], str(tmp_path / "out"))
    groups, shuffled = group_by_batch_sharing(files)
    name = os.path.basename
    assert [[name(f.path) for f in g] for g in groups] == [
        ["a.parquet", "b.parquet", "d.parquet"], ["c.parquet"], ["e.parquet"], ["f.parquet"]]
    assert shuffled == []
    groups, shuffled = group_by_batch_sharing(files, max_group_bytes=1)  # too big for one worker
    assert sorted(name(f.path) for f in shuffled) == ["a.parquet", "b.parquet", "d.parquet"]
    assert [[name(f.path) for f in g] for g in groups] == [["c.parquet"], ["e.parquet"], ["f.parquet"]]


def test_dumps_are_whole_batches():
    files = expand_inputs([os.path.join(FIXTURES, "slime_rollout_data")], "/nonexistent")
    groups, shuffled = group_by_batch_sharing(files)
    assert [len(g) for g in groups] == [1, 1] and shuffled == []


def test_footers_estimate_the_arrow_sizes_not_the_encoded_ones(tmp_path):
    # 0/1 masks, dictionary- and run-length-encoded: a few kB in the pages, 400 kB in memory
    masks = pa.table({"loss_mask": pa.array([[1, 0] * 500] * 100, pa.list_(pa.int32())), "step": [0] * 100})
    pq.write_table(masks, tmp_path / "a.parquet", compression="zstd")
    pq.write_table(pa.table({"reward": [0.5] * 10, "step": [1] * 10}), tmp_path / "b.parquet")
    (tmp_path / "c.pt").write_bytes(b"x" * 1234)
    footers = read_footers(expand_inputs([str(tmp_path)], str(tmp_path / "out")))
    a, b, c = (footers[str(tmp_path / name)] for name in ("a.parquet", "b.parquet", "c.pt"))
    assert pq.read_metadata(tmp_path / "a.parquet").row_group(0).total_byte_size < masks.nbytes / 20
    assert 0.95 * masks.nbytes <= a.decoded_bytes <= 1.05 * masks.nbytes
    assert b.decoded_bytes == 10 * 8 + 10 * 8  # reward and step: 8 bytes a value
    assert (a.steps, b.steps) == ((0, 0), (1, 1))
    assert c.decoded_bytes == 1234 and c.steps is None  # a dump: its file size, its own batch


def test_footers_read_alike_from_local_files_and_from_a_store(tmp_path):
    from rollout_relabel.transforms.lib.io import filesystem
    from tests import memfs

    write_parquet_run(RunSpec(steps=3, prompts_per_step=2, files_per_step=2, seed=4), tmp_path / "in")
    local = expand_inputs([str(tmp_path / "in")], str(tmp_path / "out"))
    memfs.clear()
    try:
        for f in local:
            memfs.put("mem://b/" + os.path.relpath(f.path, tmp_path), open(f.path, "rb").read())
        remote = expand_inputs(["mem://b/in"], "mem://b/out")
        assert filesystem.is_local(local[0].path) and not filesystem.is_local(remote[0].path)
        by_name = {os.path.basename(p): footer for p, footer in read_footers(remote).items()}  # in parallel
        assert {os.path.basename(p): footer for p, footer in read_footers(local).items()} == by_name
        assert sorted({footer.steps for footer in by_name.values()}) == [(0, 0), (1, 1), (2, 2)]
    finally:
        memfs.clear()


def test_a_dotted_step_is_read_as_slim_extraction_reads_it(tmp_path):
    """--column step=meta.step: a step spread over two files is one batch (one group of the plan), read
    from a struct in Parquet and from JSON text in JSONL alike."""
    pq.write_table(pa.table({"reward": [0.0, 1.0], "meta": [{"step": 3}, {"step": 3}]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"reward": [0.0], "meta": [{"step": 3}]}), tmp_path / "b.parquet")
    (tmp_path / "c.jsonl").write_text('{"reward": 1.0, "meta": "{\\"step\\": 3}"}\n')
    pq.write_table(pa.table({"reward": [0.0], "meta": [{"step": 9}]}), tmp_path / "d.parquet")
    files = expand_inputs([str(tmp_path)], str(tmp_path / "out"))
    footers = read_footers(files, step="meta.step")
    assert {os.path.basename(p): f.steps for p, f in footers.items()} == {
        "a.parquet": (3, 3), "b.parquet": (3, 3), "c.jsonl": (3, 3), "d.parquet": (9, 9)}
    groups, _ = group_by_batch_sharing(files, step="meta.step")
    assert [[os.path.basename(f.path) for f in g] for g in groups] == [
        ["a.parquet", "b.parquet", "c.jsonl"], ["d.parquet"]]


def test_a_file_with_two_step_columns_is_a_group_of_its_own(tmp_path):
    """Which `step` is meant cannot be decided: the one-pass path dead-letters the file (duplicate-column);
    the plan must not fail the whole run on it."""
    steps = pa.array([1, 1])
    pq.write_table(pa.table([steps, steps, pa.array([0.0, 1.0])], names=["step", "step", "reward"]),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"step": [1], "reward": [0.0]}), tmp_path / "b.parquet")
    files = expand_inputs([str(tmp_path)], str(tmp_path / "out"))
    assert {os.path.basename(p): f.steps for p, f in read_footers(files).items()} == {
        "a.parquet": None, "b.parquet": (1, 1)}
