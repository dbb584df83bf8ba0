"""One definition of the row rules: samples read from their attributes (sample_core.py, what the hooks use)
give what slim.py extracts from the same samples' columns, on random samples good and bad."""
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest

from rollout_relabel.transforms.core.reasons import REASONS
from rollout_relabel.transforms.lib.hooks.sample_core import arrow_type, rows_from_samples
from rollout_relabel.transforms.lib.io.dump_samples import samples_to_table
from rollout_relabel.transforms.lib.labeling.label_batch import core_input_from_slim
from rollout_relabel.transforms.lib.labeling.slim import extract_slim

GOOD = {
    "reward": lambda r, i: r.choice([0.0, 0.5, 1.0, 2]),
    "group_index": lambda r, i: i // 4,
    "index": lambda r, i: i,
    "rollout_id": lambda r, i: r.choice([None, 100 + i // 2]),
    "response_length": lambda r, i: 3,
    "loss_mask": lambda r, i: r.choice([None, [1, 0, 1], [1, 1, 1]]),
    "remove_sample": lambda r, i: r.random() < 0.1,
}
# each makes some rows (or a whole column) bad in the way real dumps do; not bools among numbers, which
# Arrow types by the order they come in (sample_core.py's docstring)
BAD = {
    "reward": [None, float("nan"), float("inf"), -float("inf"), "high", {"acc": 1.0}],
    # keys: the trainers' Sample holds integers; a text or fractional key is a key to relabel run (any type)
    # but refused by the hooks (test_a_key_of_another_type_below)
    "group_index": [None, 2.0],
    "index": [None, 7.0],
    "rollout_id": [None, 3.0],
    "response_length": [None, -2, 5, 1 << 25],
    "loss_mask": [[1, None, 1], [1.0, 0.0, 1.0], []],
    "remove_sample": [None, 1],
}


def random_batch(seed: int, n: int = 12):
    rng = random.Random(seed)
    samples = [{name: make(rng, i) for name, make in GOOD.items()} for i in range(n)]
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        field = rng.choice(list(BAD))
        samples[rng.randrange(n)][field] = rng.choice(BAD[field])
    if rng.random() < 0.2:  # dict rewards, sometimes lacking the key
        for s in samples:
            s["reward"] = {"acc": s["reward"], "fmt": 1.0} if rng.random() < 0.9 else {"fmt": 0.0}
    if rng.random() < 0.1:  # a field the framework's Sample does not have
        absent = rng.choice(list(GOOD))
        for s in samples:
            s.pop(absent)
    return samples


def as_objects(samples):
    return [SimpleNamespace(**s) for s in samples]


@pytest.mark.parametrize("seed", range(300))
def test_attributes_and_columns_give_the_same_rows(seed):
    samples = random_batch(seed)
    reward_key = "acc" if any(isinstance(s.get("reward"), dict) for s in samples) and seed % 3 else None
    ((_, slim),) = extract_slim(samples_to_table(samples), "<samples>", reward_key)
    problem = slim.column("problem").to_numpy()
    expected = core_input_from_slim(slim, np.zeros(len(samples), dtype=np.int64), [None], problem)
    rows = rows_from_samples(as_objects(samples), reward_key)
    got = rows.core
    assert got.row_problem.tolist() == expected.row_problem.tolist(), samples
    details = slim.column("detail").to_pylist()
    assert [rows.details.get(i) for i in range(len(samples))] == details
    live = problem == 0
    for name in ("trainable", "group_index", "has_group_index", "rollout_key", "has_rollout_key"):
        assert getattr(got, name)[live].tolist() == getattr(expected, name)[live].tolist(), name
    assert got.reward[live].tolist() == expected.reward[live].tolist()
    assert not got.reward[~live].any()


@pytest.mark.parametrize("values", [
    [1, 2], [1, 2.5], [None, None], [True, False], [True, 1], [1, True], ["a", None], [{"a": 1}, {"b": 2.0}],
    [{"a": 1}, {"a": "x"}], [{}], [{"a": {}}], [[1, 2], [3]], [[1, "a"]], [[1.0], None], [b"x"], [1, "a"],
    [{"acc": 1.0, "f": [1, 2]}], [[{"role": "user", "content": "hi"}]],
])
def test_the_inferred_type_is_arrows(values):
    from rollout_relabel.transforms.lib.io.dump_samples import _to_arrow
    array, as_json = _to_arrow(values)
    assert arrow_type(values) == ("string" if as_json else str(array.type)), values


def test_bool_masks_are_refused_both_ways():
    samples = [{"reward": 1.0, "loss_mask": [True, False], "response_length": 2}]
    ((_, slim),) = extract_slim(samples_to_table(samples), "<samples>", None)
    rows = rows_from_samples(as_objects(samples))
    assert rows.details == {0: slim.column("detail")[0].as_py()} and "list<item: bool>" in rows.details[0]


def test_a_nan_reward_text_is_the_same():
    rows = rows_from_samples(as_objects([{"reward": math.nan, "group_index": 0}]))
    assert rows.details == {0: "reward is nan"}


@pytest.mark.parametrize("name, value", [("group_index", "a"), ("group_index", 2.5), ("rollout_id", 3.5)])
def test_a_key_of_another_type_is_a_key_to_the_pipeline_and_ill_typed_to_the_hooks(name, value):
    samples = random_batch(7)
    for s in samples:
        s.pop("remove_sample", None)
    samples[3][name] = value
    [(_, slim)] = extract_slim(samples_to_table(samples), "<samples>", None)
    assert slim.column("problem").to_pylist() == [0] * len(samples)
    rows = rows_from_samples(as_objects(samples))
    assert {REASONS[c] for c in rows.core.row_problem.tolist()} == {"ill-typed-column"}  # integer keys only
    assert f"column `{name}` has type" in rows.details[0]


def test_a_rows_first_problem_wins_and_its_detail_stays():
    from rollout_relabel.transforms.core.reasons import CODE
    from rollout_relabel.transforms.lib.hooks.sample_core import _Problems

    flag = _Problems(3)
    flag([0, 2], "negative-length", lambda i: f"row {i} negative")
    flag([1, 2], "mask-length", lambda i: f"row {i} mask")
    assert flag.problem.tolist() == [CODE["negative-length"], CODE["mask-length"], CODE["negative-length"]]
    assert flag.details == {0: "row 0 negative", 1: "row 1 mask", 2: "row 2 negative"}
