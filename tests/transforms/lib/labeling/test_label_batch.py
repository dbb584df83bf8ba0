"""label_batch: one batch's slim parts through the numeric core -> results, dead letters, filtered rows, counters."""

import pyarrow as pa
import pytest

from rollout_relabel.transforms.core.config import CoreConfig
from rollout_relabel.transforms.lib.labeling.label_batch import label_batch
from rollout_relabel.transforms.lib.labeling.slim import extract_slim
from rollout_relabel.transforms.lib.settings import Labeling


def test_relabel_batch_orders_rows_by_source_then_position_across_files():
    a = pa.table({"reward": [1.0, 0.0], "group_index": [0, 0], "rollout_id": [1, 2], "step": [0, 0]})
    b = pa.table({"reward": [0.0, 5.0], "group_index": [0, 1], "rollout_id": [3, 4], "step": [0, 0]})
    [(_, slim_b)] = extract_slim(b, "b.parquet", None)
    [(_, slim_a)] = extract_slim(a, "a.parquet", None)
    result = label_batch("step=0", [("b.parquet", slim_b), ("a.parquet", slim_a)], None,
                         Labeling(CoreConfig(std_normalization=False)))
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


def test_the_same_file_twice_in_one_batch_is_duplicate_rows():
    table = pa.table({"reward": [1.0, 0.0], "rollout_id": [1, 2], "step": [0, 0]})
    [(key, slim)] = extract_slim(table, "f.parquet", None)
    result = label_batch(key, [("f.parquet", slim), ("f.parquet", slim)], None, Labeling(CoreConfig()))
    assert set(result.dead.column("reason").to_pylist()) == {"duplicate-row"}
    assert result.dead.num_rows == 4 and result.counters.rows_dead == 4
    # each of the file's two rows, once per copy; the group dies with them and nothing is written
    assert sorted(zip(result.dead.column("source").to_pylist(), result.dead.column("row").to_pylist())) == [
        ("f.parquet", 0), ("f.parquet", 0), ("f.parquet", 1), ("f.parquet", 1)]
    assert "row 1 of f.parquet appears twice" in " ".join(result.dead.column("message").to_pylist())
    assert result.results["f.parquet"].num_rows == 0


def test_not_trained_rows_leave_the_batch_before_grouping():
    # rows 1 and 4: the framework never trained on them (row 4's reward is null: no problem of its group)
    table = pa.table({"reward": [1.0, 9.0, 0.0, 0.5, None], "group_index": [0, 0, 0, 1, 1],
                      "rollout_id": [1, 2, 3, 4, 5],
                      "not_trained": [None, "trace errored", None, None, "padding row"]})
    [(key, slim)] = extract_slim(table, "f.parquet", None)
    result = label_batch(key, [("f.parquet", slim)], None, Labeling(CoreConfig(std_normalization=False)))
    kept = table.filter(pa.array([True, False, True, True, False])).drop_columns(["not_trained"])
    [(_, slim_kept)] = extract_slim(kept, "f.parquet", None)
    alone = label_batch(key, [("f.parquet", slim_kept)], None, Labeling(CoreConfig(std_normalization=False)))
    written = result.results["f.parquet"]
    assert written.column("row").to_pylist() == [0, 2, 3]
    assert written.column("advantage").to_pylist() == alone.results["f.parquet"].column("advantage").to_pylist()
    assert written.column("advantage").to_pylist() == [0.5, -0.5, 0.0]
    assert result.dead.num_rows == 0
    filtered = result.filtered.to_pydict()
    assert filtered["row"] == [1, 4] and filtered["reason"] == ["not-trained"] * 2
    assert "(trace errored)" in filtered["message"][0] and "(padding row)" in filtered["message"][1]
    counters = result.counters
    assert (counters.rows, counters.rows_filtered, counters.rows_dead, counters.groups) == (5, 2, 0, 2)


def test_a_batch_of_only_not_trained_rows_writes_nothing():
    table = pa.table({"reward": [1.0, 0.0], "group_index": [0, 0], "not_trained": ["padding row"] * 2})
    [(key, slim)] = extract_slim(table, "f.parquet", None)
    result = label_batch(key, [("f.parquet", slim)], None, Labeling(CoreConfig()))
    assert result.results["f.parquet"].num_rows == 0
    assert result.filtered.column("row").to_pylist() == [0, 1]
    assert (result.counters.rows, result.counters.rows_filtered, result.counters.groups) == (2, 2, 0)


def test_not_trained_rows_come_before_the_options_filters():
    # group 0 is uniform once its not-trained row is gone: both kinds of filtered rows, in row order
    table = pa.table({"reward": [1.0, 1.0, 0.0, 0.0, 1.0], "group_index": [0, 0, 0, 1, 1],
                      "rollout_id": [1, 2, 3, 4, 5], "not_trained": [None, None, "frozen", None, None]})
    [(key, slim)] = extract_slim(table, "f.parquet", None)
    result = label_batch(key, [("f.parquet", slim)], None, Labeling(CoreConfig(), drop_uniform_groups=True))
    filtered = result.filtered.to_pydict()
    assert list(zip(filtered["row"], filtered["reason"])) == [(0, "uniform-group"), (1, "uniform-group"),
                                                                (2, "not-trained")]
    assert result.results["f.parquet"].column("row").to_pylist() == [3, 4]


def test_a_not_trained_column_that_is_not_text_is_ill_typed():
    table = pa.table({"reward": [1.0, 0.0], "group_index": [0, 0], "not_trained": [1, 0]})
    [(key, slim)] = extract_slim(table, "f.parquet", None)
    result = label_batch(key, [("f.parquet", slim)], None, Labeling(CoreConfig()))
    assert set(result.dead.column("reason").to_pylist()) == {"ill-typed-column"}
    assert "not_trained" in result.dead.column("message")[0].as_py()
