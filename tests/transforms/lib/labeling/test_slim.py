"""extract_slim: an input table -> per-batch slim tables (validation, trainable tokens, rollout keys)."""

import pyarrow as pa
import pytest

from rollout_relabel.transforms.core.reasons import REASONS
from rollout_relabel.transforms.lib.labeling.slim import extract_slim


def slim_of(table, reward_key=None, source="f.parquet"):
    [(key, slim)] = extract_slim(table, source, reward_key)
    return key, slim.to_pydict()


def reasons_of(slim: dict) -> list[str]:
    """The slim table's per-row problem codes, as the reason names dead letters carry ("" for none)."""
    return [REASONS[code] for code in slim["problem"]]


def test_trainable_tokens_from_mask_length_and_remove_sample():
    table = pa.table({
        "reward": [1.0, 2.0, 3.0, 4.0],
        "response_length": [3, 4, 2, 5],
        "loss_mask": [[1, 0, 1], None, [1, 1], [1, 1, 1, 1, 1]],
        "remove_sample": [False, False, None, True],
    })
    key, slim = slim_of(table)
    assert key == "file=f.parquet"
    assert slim["trainable"] == [2, 4, 2, 0]
    assert reasons_of(slim) == ["", "", "", ""]


def test_rollout_key_falls_back_to_index():
    table = pa.table({"reward": [0.0, 0.0, 0.0], "rollout_id": [7, None, None], "index": [1, 2, None]})
    assert slim_of(table)[1]["rollout_key"] == [7, 2, None]


@pytest.mark.parametrize("columns,reward_key,reasons,details", [
    ({"reward": [1.0, float("nan")]}, None, ["", "non-finite-reward"], [None, "reward is nan"]),
    ({"reward": [1.0, float("inf")]}, None, ["", "non-finite-reward"], [None, "reward is inf"]),
    ({"reward": [1.0, None]}, None, ["", "non-numeric-reward"], [None, "reward is null"]),
    ({"reward": pa.array(["1", "x"])}, None, ["non-numeric-reward"] * 2, ["reward has type string"] * 2),
    ({"reward": [{"acc": 1.0}, {"acc": None}]}, "acc", ["", "missing-reward-key"], [None, "reward['acc'] is null"]),
    ({"reward": [1.0, 2.0]}, "acc", ["missing-reward-key"] * 2,
     ["--reward-key 'acc' given but reward has type double"] * 2),
    ({"reward": [1.0, 2.0], "response_length": [1, -1]}, None, ["", "negative-length"],
     [None, "response_length is -1"]),
    ({"reward": [1.0, 2.0], "response_length": [1, 3], "loss_mask": [[1], [1, 1]]}, None, ["", "mask-length"],
     [None, "len(loss_mask) is 2 but response_length is 3"]),
    ({"x": [1, 2]}, None, ["missing-column"] * 2, ["the file has no `reward` column"] * 2),
])
def test_row_problems(columns, reward_key, reasons, details):
    _, slim = slim_of(pa.table(columns), reward_key)
    assert reasons_of(slim) == reasons
    assert slim["detail"] == details


def test_reward_key_from_struct_and_map():
    struct = pa.table({"reward": [{"acc": 1.0, "f": 0.0}, {"acc": 0.5, "f": 1.0}]})
    assert slim_of(struct, "acc")[1]["reward"] == [1.0, 0.5]
    mapped = pa.table({"reward": pa.array([[("acc", 2.0)], [("acc", 3.0)]], pa.map_(pa.string(), pa.float64()))})
    assert slim_of(mapped, "acc")[1]["reward"] == [2.0, 3.0]


def test_step_column_splits_batches():
    table = pa.table({"reward": [1.0, 2.0, 3.0], "step": [5, 4, 5]})
    parts = extract_slim(table, "f.parquet", None)
    assert [(k, p.column("row").to_pylist()) for k, p in parts] == [("step=4", [1]), ("step=5", [0, 2])]
