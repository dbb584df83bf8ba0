"""One batch of rollouts, three ways of storing it, the same advantages bit for bit: our Parquet (integer
keys), JSONL with text keys ("g7", "r12") and Parquet whose columns are renamed, read through --column."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

import rollout_relabel
from rollout_relabel.transforms.lib.io.readers import read_table

REWARDS = st.one_of(st.sampled_from([0.0, 1.0, 0.5]), st.floats(-100, 100, allow_nan=False, width=32))


@st.composite
def batches(draw):
    """(rows, options): 1-5 groups, each 1-4 rollouts of 1-3 rows (fan-out), one reward per rollout."""
    rows, rollout = [], 0
    groups = draw(st.lists(st.integers(0, 999), min_size=1, max_size=5, unique=True))
    for group in groups:
        for _ in range(draw(st.integers(1, 4))):
            reward = draw(REWARDS)
            for _ in range(draw(st.integers(1, 3))):
                rows.append({"step": 3, "group_index": group, "rollout_id": rollout, "reward": reward,
                             "response_length": draw(st.integers(1, 5))})
            rollout += draw(st.integers(1, 30))
    draw(st.randoms()).shuffle(rows)  # rows of a group need not be consecutive
    options = {"semantics": draw(st.sampled_from(["rollout-mainstream", "group-index"])),
               "std_normalization": draw(st.booleans()),
               "estimator": draw(st.sampled_from(["grpo", "rloo"]))}
    return rows, options


def advantages(table, **options) -> np.ndarray:
    out = rollout_relabel.relabel(table, device="cpu", **options)
    assert out.dead_letters.num_rows == 0
    return np.asarray(out.training_rows.column("advantage"))


@settings(max_examples=15, deadline=None)
@given(batches())
def test_parquet_jsonl_text_keys_and_renamed_columns_give_the_same_advantages(tmp_path_factory, batch):
    rows, options = batch
    folder = tmp_path_factory.mktemp("batch")
    ours = folder / "ours.parquet"
    pq.write_table(pa.Table.from_pylist(rows), ours)
    text = folder / "text.jsonl"
    text.write_text("".join(json.dumps(dict(r, group_index=f"g{r['group_index']}",
                                            rollout_id=f"r{r['rollout_id']}")) + "\n" for r in rows))
    renamed = folder / "renamed.parquet"
    pq.write_table(pa.Table.from_pylist([{"step": r["step"], "uid": r["group_index"], "rollout_id": r["rollout_id"],
                                          "score": r["reward"], "response_length": r["response_length"]}
                                         for r in rows]), renamed)

    table, _ = read_table(str(ours))
    want = advantages(table, **options)
    text_table, _ = read_table(str(text))
    assert text_table.schema.field("group_index").type == pa.string()
    got_text = advantages(text_table, **options)
    renamed_table, _ = read_table(str(renamed))
    got_renamed = advantages(renamed_table, columns=("reward=score", "group_index=uid"), **options)
    assert len(want) == len(rows)
    np.testing.assert_array_equal(got_text.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(got_renamed.view(np.uint32), want.view(np.uint32))
