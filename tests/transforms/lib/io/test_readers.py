"""Reading .pt dumps and Parquet files into Arrow."""
import io
import os
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io.dump_samples import samples_to_table
from rollout_relabel.transforms.lib.io.readers import read_table
from tests.conftest import FIXTURES


@pytest.mark.parametrize("folder,rows,sizes", [
    ("slime_rollout_data", 81, None),
    ("miles_rollout_data", 74, [18, 14, 10, 12, 8, 12]),
    ("miles_reward_dict", 49, None),
])
def test_fixture_dumps_read_with_every_field(folder, rows, sizes):
    path = os.path.join(FIXTURES, folder, "0.pt")
    table, metadata = read_table(path)
    samples = torch.load(path, weights_only=True)["samples"]
    assert table.num_rows == rows
    assert table.column_names == list(samples[0].keys())  # nothing dropped, order kept
    assert metadata == {"step": 0, "prompt_group_sizes": sizes}
    assert table.column("tokens").to_pylist() == [s["tokens"] for s in samples]


def test_reward_dict_becomes_a_struct_and_tensors_become_lists():
    table, _ = read_table(os.path.join(FIXTURES, "miles_reward_dict", "0.pt"))
    assert pa.types.is_struct(table.schema.field("reward").type)
    samples = torch.load(os.path.join(FIXTURES, "miles_reward_dict", "0.pt"), weights_only=True)["samples"]
    first = next(i for i, s in enumerate(samples) if s["rollout_routed_experts"] is not None)
    assert table.column("rollout_routed_experts")[first].as_py() == samples[first]["rollout_routed_experts"].tolist()


def test_column_projection():
    table, _ = read_table(os.path.join(FIXTURES, "slime_rollout_data", "0.pt"), columns=("reward", "index", "x"))
    assert table.column_names == ["index", "reward"]


def test_untypable_values_are_kept_as_json_text():
    table = samples_to_table([{"a": {}, "b": 1, "c": [1, "x"]}, {"a": {}, "b": 2, "c": None}])
    assert table.column("a").to_pylist() == ["{}", "{}"]
    assert table.column("c").to_pylist() == ['[1, "x"]', None]
    assert table.column("b").to_pylist() == [1, 2]


class Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_payload_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    buffer = io.BytesIO()
    torch.save({"rollout_id": 0, "samples": [{"reward": 1.0, "payload": Exploit(str(marker))}]}, buffer)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(BadFile) as caught:
        read_table(str(path))
    assert caught.value.reason == "unsafe-pickle"
    assert not marker.exists()


def test_plain_pickle_is_refused_too(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps(Exploit(str(marker))))
    with pytest.raises(BadFile) as caught:
        read_table(str(path))
    assert caught.value.reason in ("unsafe-pickle", "unreadable-file")
    assert not marker.exists()


@pytest.mark.parametrize("content,reason", [(b"", "empty-file"), (b"PAR1garbage", "unreadable-file")])
def test_bad_parquet(tmp_path, content, reason):
    path = tmp_path / "x.parquet"
    path.write_bytes(content)
    with pytest.raises(BadFile) as caught:
        read_table(str(path))
    assert caught.value.reason == reason


def test_truncated_pt(tmp_path):
    data = open(os.path.join(FIXTURES, "slime_rollout_data", "0.pt"), "rb").read()
    path = tmp_path / "cut.pt"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadFile) as caught:
        read_table(str(path))
    assert caught.value.reason == "unreadable-file"


def test_parquet_reads_through_filesystems(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"reward": [1.0, 2.0], "tokens": [[1], [2, 3]]}), path)
    table, metadata = read_table(str(path), columns=("reward",))
    assert table.column_names == ["reward"] and metadata["prompt_group_sizes"] is None


def test_parquet_text_columns_are_read_dictionary_encoded_on_request_and_others_as_stored(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "a", None], "input": [1, 2, 3, 4],
                             "messages": [[{"role": "user"}]] * 4}), path, row_group_size=3)
    table, _ = read_table(str(path), dictionary=("prompt", "input", "messages", "absent"))
    assert table.schema.field("prompt").type == pa.dictionary(pa.int32(), pa.string())
    assert table.column("prompt").to_pylist() == ["a", "b", "a", None]  # two row groups, each its dictionary
    assert table.schema.field("input").type == pa.int64()  # not text: as stored, never refused
    assert table.column("messages").to_pylist() == [[{"role": "user"}]] * 4
    assert read_table(str(path))[0].schema.field("prompt").type == pa.string()
