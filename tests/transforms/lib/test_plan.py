"""Which inputs hold whole batches (one pass) and which share a batch with another file (shuffle)."""
import os

import pyarrow as pa
import pyarrow.parquet as pq

from transforms.lib.inputs import expand_inputs
from transforms.lib.plan import group_by_batch_sharing
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
