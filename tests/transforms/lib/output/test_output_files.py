"""Committed output files: a complete file appears under its final name in one rename."""
import os

from rollout_relabel.transforms.lib.output.output_files import commit_file, write_bytes_atomically


def test_a_staged_file_is_committed_by_a_rename_over_the_last_commit(tmp_path):
    write_bytes_atomically(b"first table", str(tmp_path), "part-00000.parquet")
    staged = tmp_path / "_staged-1.parquet"
    staged.write_bytes(b"second table")
    inode = os.stat(staged).st_ino
    commit_file(str(staged), str(tmp_path), "part-00000.parquet")
    final = tmp_path / "part-00000.parquet"
    assert final.read_bytes() == b"second table"
    assert os.stat(final).st_ino == inode  # renamed, never copied through the process
    assert sorted(os.listdir(tmp_path)) == ["part-00000.parquet"]  # no staged, temporary or set-aside file left
