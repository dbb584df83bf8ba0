"""Arrow adapters: slim extraction (validation, trainable tokens), batch relabel, training rows."""

import pyarrow as pa
import pytest

from transforms.core.config import CoreConfig
from transforms.lib.columns import list_sums
from transforms.lib.label_batch import label_batch
from transforms.lib.settings import Labeling
from transforms.lib.slim import extract_slim
from transforms.lib.training_rows import _final_loss_mask, training_rows


def slim_of(table, reward_key=None, source="f.parquet"):
    [(key, slim)] = extract_slim(table, source, reward_key)
    return key, slim.to_pydict()


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
    assert slim["problem"] == [0, 0, 0, 0]


def test_rollout_key_falls_back_to_index():
    table = pa.table({"reward": [0.0, 0.0, 0.0], "rollout_id": [7, None, None], "index": [1, 2, None]})
    assert slim_of(table)[1]["rollout_key"] == [7, 2, None]


@pytest.mark.parametrize("columns,reward_key,reason", [
    ({"reward": [1.0, float("nan")]}, None, "non-finite-reward"),
    ({"reward": [1.0, float("inf")]}, None, "non-finite-reward"),
    ({"reward": [1.0, None]}, None, "non-numeric-reward"),
    ({"reward": pa.array(["1", "x"])}, None, "non-numeric-reward"),
    ({"reward": [{"acc": 1.0}, {"acc": None}]}, "acc", "missing-reward-key"),
    ({"reward": [1.0, 2.0]}, "acc", "missing-reward-key"),
    ({"reward": [1.0, 2.0], "response_length": [1, -1]}, None, "negative-length"),
    ({"reward": [1.0, 2.0], "response_length": [1, 3], "loss_mask": [[1], [1, 1]]}, None, "mask-length"),
    ({"x": [1, 2]}, None, "missing-column"),
])
def test_row_problems(columns, reward_key, reason):
    from transforms.core.reasons import CODE
    _, slim = slim_of(pa.table(columns), reward_key)
    assert CODE[reason] in slim["problem"]
    bad = [i for i, p in enumerate(slim["problem"]) if p]
    assert all(slim["detail"][i] for i in bad)


def test_reward_key_from_struct_and_map():
    struct = pa.table({"reward": [{"acc": 1.0, "f": 0.0}, {"acc": 0.5, "f": 1.0}]})
    assert slim_of(struct, "acc")[1]["reward"] == [1.0, 0.5]
    mapped = pa.table({"reward": pa.array([[("acc", 2.0)], [("acc", 3.0)]], pa.map_(pa.string(), pa.float64()))})
    assert slim_of(mapped, "acc")[1]["reward"] == [2.0, 3.0]


def test_step_column_splits_batches():
    table = pa.table({"reward": [1.0, 2.0, 3.0], "step": [5, 4, 5]})
    parts = extract_slim(table, "f.parquet", None)
    assert [(k, p.column("row").to_pylist()) for k, p in parts] == [("step=4", [1]), ("step=5", [0, 2])]


def test_relabel_batch_orders_rows_by_source_then_position_across_files():
    a = pa.table({"reward": [1.0, 0.0], "group_index": [0, 0], "rollout_id": [1, 2], "step": [0, 0]})
    b = pa.table({"reward": [0.0, 5.0], "group_index": [0, 1], "rollout_id": [3, 4], "step": [0, 0]})
    [(_, slim_b)] = extract_slim(b, "b.parquet", None)
    [(_, slim_a)] = extract_slim(a, "a.parquet", None)
    result = label_batch("step=0", [("b.parquet", slim_b), ("a.parquet", slim_a)], None, Labeling(CoreConfig(std_normalization=False)))
    assert result.results["a.parquet"].column("advantage").to_pylist() == pytest.approx([2 / 3, -1 / 3])
    assert result.results["b.parquet"].column("advantage").to_pylist() == pytest.approx([-1 / 3, 0.0])
    assert result.results["b.parquet"].column("prompt_group").to_pylist() == [0, 1]
    assert result.counters.groups == 2 and result.counters.rollouts == 4


def test_relabel_batch_dead_letters_name_row_and_reason():
    table = pa.table({"reward": [1.0, float("nan"), 0.0, 1.0], "group_index": [0, 0, 1, 1], "rollout_id": [1, 2, 3, 4]})
    [(key, slim)] = extract_slim(table, "f.parquet", None)
    result = label_batch(key, [("f.parquet", slim)], None, Labeling(CoreConfig()))
    dead = result.dead.to_pydict()
    assert dead["row"] == [0, 1] and dead["reason"] == ["non-finite-reward"] * 2
    assert "nan" in dead["message"][1] and "row 1 of f.parquet" in dead["message"][0]
    assert result.results["f.parquet"].column("row").to_pylist() == [2, 3]


def test_drop_uniform_groups_moves_rows_to_filtered():
    table = pa.table({"reward": [0.0, 0.0, 0.0, 1.0], "group_index": [0, 0, 1, 1], "rollout_id": [1, 2, 3, 4]})
    [(key, slim)] = extract_slim(table, "f.parquet", None)
    result = label_batch(key, [("f.parquet", slim)], None, Labeling(CoreConfig(), drop_uniform_groups=True))
    assert result.filtered.column("row").to_pylist() == [0, 1]
    assert set(result.filtered.column("reason").to_pylist()) == {"uniform-group"}
    assert result.results["f.parquet"].column("row").to_pylist() == [2, 3]


def test_training_rows_keep_columns_in_place_and_replace_loss_mask():
    table = pa.table({"tokens": [[1, 2], [3]], "loss_mask": [None, [0]], "response_length": [2, 1],
                      "remove_sample": [True, False], "status": ["truncated", None], "reward": [1.0, 0.0],
                      "advantage": [9.0, 9.0]})
    [(key, slim)] = extract_slim(table, "f.parquet", None)
    result = label_batch(key, [("f.parquet", slim)], None, Labeling(CoreConfig(std_normalization=False)))
    out = training_rows(table, result.results["f.parquet"])
    assert out.column_names == ["tokens", "loss_mask", "response_length", "remove_sample", "status", "reward",
                                "advantage", "raw_reward", "mainstream", "rollout_key", "prompt_group", "truncated",
                                "rollout_mask_sum"]
    assert out.column("loss_mask").to_pylist() == [[0, 0], [0]]
    assert out.column("loss_mask").type == pa.list_(pa.int32())
    assert out.column("advantage").to_pylist() == [0.5, -0.5]  # an earlier relabel's column is replaced
    assert out.column("truncated").to_pylist() == [True, False]
    assert out.column("tokens").to_pylist() == [[1, 2], [3]]


def test_final_loss_mask_zeroes_removed_rows_of_a_sliced_table():
    # every row has a mask (the fast path); the slice makes the list offsets start past 0
    table = pa.table({"loss_mask": [[1, 1], [1, 0, 1], [1], [0, 1]],
                      "remove_sample": [False, True, False, True]}).slice(1)
    assert _final_loss_mask(table).to_pylist() == [[0, 0, 0], [1], [0, 0]]
    assert table.column("loss_mask").to_pylist() == [[1, 0, 1], [1], [0, 1]]  # the input is not modified


def test_final_loss_mask_fills_null_masks_with_ones_of_the_response_length():
    # sliced past the first row; a null mask, a negative and a null length, one removed row
    table = pa.table({"loss_mask": pa.array([[1], None, [0, 1], None, None, [1, 1]], pa.list_(pa.int32())),
                      "response_length": [1, 3, 2, -4, None, 2],
                      "remove_sample": [False, False, False, False, False, True]}).slice(1)
    assert _final_loss_mask(table).to_pylist() == [[1, 1, 1], [0, 1], [], [], [0, 0]]


def test_final_loss_mask_without_the_column_is_all_ones():
    table = pa.table({"response_length": [2, 0, 1], "remove_sample": [False, False, True]})
    mask = _final_loss_mask(table)
    assert mask.to_pylist() == [[1, 1], [], [0]]
    assert mask.type == pa.list_(pa.int32())


def test_list_sums_of_a_sliced_array_with_empty_and_null_lists():
    lists = pa.array([[5, 5], [1, 2, 3], [], None, [4], [7, 7, 7]], pa.list_(pa.int32())).slice(1, 4)
    assert list_sums(lists).tolist() == [6, 0, 0, 4]
    assert list_sums(pa.array([[2**31 - 1, 2**31 - 1]], pa.list_(pa.int32()))).tolist() == [2**32 - 2]  # int64 sums


def test_the_same_file_twice_in_one_batch_is_duplicate_rows():
    from transforms.core.reasons import CODE
    table = pa.table({"reward": [1.0, 0.0], "rollout_id": [1, 2], "step": [0, 0]})
    [(key, slim)] = extract_slim(table, "f.parquet", None)
    result = label_batch(key, [("f.parquet", slim), ("f.parquet", slim)], None, Labeling(CoreConfig()))
    assert set(result.dead.column("reason").to_pylist()) == {"duplicate-row"}
    assert result.dead.num_rows == 4 and result.counters.rows_dead == 4
    assert CODE["duplicate-row"]
