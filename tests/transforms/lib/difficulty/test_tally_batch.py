"""Tally batches merged column by column against the Tally merge, key by key; the table built from them."""
import math
import random

import pyarrow as pa
import pytest

from rollout_relabel.transforms.lib.difficulty import tally_batch
from rollout_relabel.transforms.lib.difficulty.table import build, from_rows
from rollout_relabel.transforms.lib.difficulty.tally import Tally, grow, pass_at_k


def reference(batches, by):
    """Every (key, state) of the batches merged through Tally, one key at a time: the merged rows."""
    merged = {}
    for batch in batches:
        for key, state in tally_batch.states(batch, by):
            merged.setdefault(key, Tally()).merge(Tally(*state))
    return {key: tally_batch.final_row(t.state_args()) for key, t in merged.items()}


def random_batches(rng, by, rewards):
    """Batches of a few runs over a small pool of keys (so keys repeat across batches), each reward sum an
    expansion as the stage makes it."""
    batches = []
    for b in range(rng.randint(1, 6)):
        run = f"run-{rng.randint(0, 3)}"
        pairs = {}
        for _ in range(rng.randint(0, 12)):
            step = rng.choice([None, 1, 2, 7])
            key = (f"p{rng.randint(0, 9)}",) + ((run,) if by == "run" else (step,) if by == "step" else ())
            units = rng.randint(1, 5)
            parts = []
            for _ in range(units):
                grow(parts, rewards(rng))
            prompt = rng.choice([None, f"text {rng.randint(0, 3)}"])
            pairs[key] = (units, rng.randint(0, units), tuple(parts), (run,) if b else (), 0 if b else 2,
                          step, step, prompt)
        batches.append(tally_batch.from_states(list(pairs.items()), by))
    return batches


REWARDS = {
    "binary": lambda rng: float(rng.randint(0, 1)),
    "halves": lambda rng: rng.randint(-4, 4) / 2,
    "any": lambda rng: rng.uniform(-1, 1) * 10 ** rng.randint(-12, 12),
    "mixed": lambda rng: rng.choice([1.0, 0.0, 0.1, 2.0 ** 40, -(2.0 ** 40), 1e-30]),
}


@pytest.mark.parametrize("by", [None, "run", "step"])
@pytest.mark.parametrize("rewards", sorted(REWARDS))
def test_merge_equals_the_tally_merge_key_by_key_in_any_order(by, rewards):
    rng = random.Random(f"{by}-{rewards}")
    for _ in range(40):
        batches = random_batches(rng, by, REWARDS[rewards])
        expected = reference(batches, by)
        for _ in range(3):
            rng.shuffle(batches)
            rows = list(tally_batch.rows(tally_batch.merge(batches, by), by))
            assert len(rows) == len(expected) and dict(rows) == expected


def test_a_sum_that_float64_would_round_takes_the_exact_path():
    # every reward is a multiple of 2**-20, but the magnitudes pass 2**33: a float64 sum would lose the 1.0
    states = [((("a",), (1, 1, (2.0 ** 60,), ("r",), 0, 1, 1, "a"))),
              ((("a",), (1, 1, (1.0,), ("r",), 0, 2, 2, "a"))),
              ((("a",), (1, 0, (-(2.0 ** 60),), ("s",), 0, 3, 3, "a")))]
    batches = [tally_batch.from_states([pair], None) for pair in states]
    assert list(tally_batch.rows(tally_batch.merge(batches, None), None)) == [(("a",), (3, 2, (1.0,), 2, 1, 3, "a"))]


def test_a_state_of_several_runs_counts_each_run_once():
    batch = tally_batch.from_states([(("a",), (2, 1, (1.5,), ("r1", "r2"), 1, 4, 6, "x")),
                                     (("a",), (1, 1, (1.0,), ("r2", "r3"), 0, 3, None, None))], None)
    assert list(tally_batch.rows(tally_batch.merge([batch], None), None)) == [
        (("a",), (3, 2, (2.5,), 4, 3, 6, "x"))]


def test_prompt_keys_of_two_types_are_refused():
    text = tally_batch.from_states([(("a",), (1, 1, (1.0,), ("r",), 0, 1, 1, "a"))], None)
    number = tally_batch.from_states([((7,), (1, 1, (1.0,), ("r",), 0, 1, 1, "a"))], None)
    assert number.schema.field(tally_batch.KEY).type == pa.int64()
    with pytest.raises(ValueError, match="prompt keys of different types"):
        tally_batch.merge([text, number], None)


def test_split_sends_every_row_to_its_keys_bucket_once():
    keys = [f"k{i}" for i in range(200)]
    batch = tally_batch.from_states([((k,), (1, 0, (), ("r",), 0, None, None, None)) for k in keys], None)
    seen = []
    for bucket, rows in tally_batch.split(batch):
        names = rows.column(tally_batch.KEY).to_pylist()
        assert {tally_batch.bucket_of_key(k) for k in names} == {bucket}
        seen += names
    assert sorted(seen) == sorted(keys)
    assert len({tally_batch.bucket_of_key(k) for k in keys}) == tally_batch.BUCKETS


def test_the_table_is_sorted_by_key_a_null_step_first_and_computes_each_column_row_by_row():
    rng = random.Random(5)
    pairs = []
    for prompt in ("b", "a", "é", "c"):
        for step in (None, 3, 1):
            n = rng.randint(1, 12)
            c = rng.randint(0, n)
            pairs.append(((prompt, step), (n, c, (c * 0.5,) if c else (), 1, step, step, prompt)))
    table = from_rows([tally_batch.rows_table(pairs[:5], "step"), tally_batch.rows_table(pairs[5:], "step")],
                      "step", (1, 4, 20))
    expected = sorted(pairs, key=lambda p: (p[0][0], p[0][1] is not None, p[0][1]))
    assert [(r["prompt_key"], r["step"]) for r in table.to_pylist()] == [key for key, _ in expected]
    for row, (_, (n, c, parts, *_)) in zip(table.to_pylist(), expected):
        assert row["pass_rate"] == c / n and row["mean_reward"] == (parts[0] if parts else 0.0) / n
        for k in (1, 4, 20):
            assert row[f"pass_at_k_{k}"] == pass_at_k(n, c, k)
        assert math.isclose(row["pass_at_k_1"], c / n)
    assert table.equals(build([((p, s), v) for (p, s), v in pairs], "step", (1, 4, 20)))


def test_an_empty_table_has_every_column():
    table = build([], "run", (2,))
    assert table.num_rows == 0
    assert table.schema.names == ["prompt_key", "run", "rollouts", "passes", "pass_rate", "mean_reward",
                                  "pass_at_k_2", "runs", "first_step", "last_step", "prompt", "reward_sum_parts"]
    assert table.schema.field("prompt_key").type == pa.string()
