"""ROLL's step files (rollout_dump_data.step_N.jsonl): one line of column lists, typed from their values; a
file that is not such lines is refused naming the file, the line or the column."""
import json

import pyarrow as pa
import pytest

from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io.formats import roll_format
from rollout_relabel.transforms.lib.io.formats.format import ReadOptions


def write(tmp_path, *lines, step=3):
    path = tmp_path / f"rollout_dump_data.step_{step}.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def test_lines_are_concatenated_and_typed_from_their_values(tmp_path):
    path = write(tmp_path,
                 {"id": ["a", "a", "b"], "scores": [1, 0.5, None], "meta": [{"x": 1}, {"y": "t"}, None],
                  "toks": [[1, 2], [], None]},
                 {"id": ["b", "c", "c"], "scores": [0, 1, 2], "meta": [None, {"x": 2}, {}], "toks": [[3], [4], []]})
    table, metadata = roll_format.read(path, None, ReadOptions())
    assert table.schema.field("scores").type == pa.float64()
    assert table.schema.field("meta").type == pa.struct([("x", pa.int64()), ("y", pa.string())])
    assert table.schema.field("toks").type == pa.list_(pa.int64())
    assert table.column("scores").to_pylist() == [1.0, 0.5, None, 0.0, 1.0, 2.0]
    # no sampling_params: a group is a run of consecutive rows sharing an id
    assert table.column("group_index").to_pylist() == [0, 0, 1, 1, 2, 2]
    assert table.column("trajectory_id").to_pylist() == list(range(6))
    assert metadata == {"step": 3, "prompt_group_sizes": None}


def test_blank_lines_and_crlf_endings_are_read_and_counted(tmp_path):
    path = tmp_path / "rollout_dump_data.step_0.jsonl"
    path.write_bytes(b'\n{"id": ["a"], "scores": [1.0]}\r\n   \n{"id": ["a"], "scores": [0.0]}\r\n{"id": [')
    with pytest.raises(BadFile, match=r"line 5 is not JSON"):  # blank lines count as lines
        roll_format.read(str(path), None, ReadOptions())
    path.write_bytes(b'\n{"id": ["a"], "scores": [1.0]}\r\n   \n{"id": ["a"], "scores": [0.0]}\r\n\n')
    table, _ = roll_format.read(str(path), None, ReadOptions())
    assert table.column("scores").to_pylist() == [1.0, 0.0]


def test_a_line_that_is_not_json_names_its_line(tmp_path):
    path = write(tmp_path, {"id": ["a"], "scores": [1.0]}, '{"id": ["b"], "scores": [')
    with pytest.raises(BadFile, match=r"step_3\.jsonl: line 2 is not JSON"):
        roll_format.read(path, None, ReadOptions())


@pytest.mark.parametrize("line, expected", [
    ({"id": ["a", "b"], "scores": [1.0]}, "line 1: its columns differ in length"),
    ({"id": "a", "scores": [1.0]}, "line 1 is not an object of column lists"),
    ({"id": ["a", "b"], "scores": [1.0, "one"]}, "column `scores` cannot be typed"),
    ({"id": ["a"], "scores": [1.0], "token": [2 ** 70]}, "column `token` cannot be typed"),
])
def test_a_file_that_is_not_column_lists_is_refused(tmp_path, line, expected):
    with pytest.raises(BadFile, match=expected):
        roll_format.read(write(tmp_path, line), None, ReadOptions())
