"""Every Arrow schema the project reads or writes, defined once.

SCHEMA_VERSION changes whenever a column is added, removed or retyped.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class InputColumn:
    name: str
    type: pa.DataType
    required: bool
    default: str  # what an absent column (or a null value) means


# Input rollout rows. Only these columns are interpreted; any other column passes through untouched.
INPUT_COLUMNS = (
    InputColumn("reward", pa.float64(), True,
                "required: a number, or a struct/map holding the --reward-key field"),
    InputColumn("step", pa.int64(), False, "absent: each file is its own batch"),
    InputColumn("group_index", pa.int64(), False, "absent/null: no explicit prompt group"),
    InputColumn("index", pa.int64(), False, "absent/null: no sample index"),
    InputColumn("rollout_id", pa.int64(), False, "absent/null: the rollout key falls back to index"),
    InputColumn("response_length", pa.int64(), False, "absent/null: len(loss_mask), else 0"),
    InputColumn("loss_mask", pa.list_(pa.int32()), False, "absent/null: all ones of length response_length"),
    InputColumn("remove_sample", pa.bool_(), False, "absent/null: false"),
    InputColumn("status", pa.string(), False, "absent/null: not truncated"),
    InputColumn("not_trained", pa.string(), False,
                "absent/null: trained; text: why the framework never trained on the row (filtered, not-trained)"),
)
# What the advantage computation reads (the slim path); everything else is only read by the writer.
SLIM_INPUT_COLUMNS = ("reward", "step", "group_index", "index", "rollout_id",
                      "response_length", "loss_mask", "remove_sample", "not_trained")

# Columns the pipeline adds to every training row (loss_mask is replaced in place).
TRAINING_COLUMNS = pa.schema([
    pa.field("raw_reward", pa.float32(), nullable=False),
    pa.field("advantage", pa.float32(), nullable=False),
    pa.field("mainstream", pa.bool_(), nullable=False),
    pa.field("rollout_key", pa.int64()),
    pa.field("prompt_group", pa.int64(), nullable=False),
    pa.field("truncated", pa.bool_(), nullable=False),
    pa.field("loss_mask", pa.list_(pa.int32())),
    pa.field("rollout_mask_sum", pa.int64(), nullable=False),
])
# added to the training rows only under --row-weight rollout|tokens (docs/semantics.md, "Row weights")
LOSS_WEIGHT = pa.field("loss_weight", pa.float32(), nullable=False)

# The slim record of a row that crosses the shuffle (tens of bytes a row); its file travels beside it.
SLIM = pa.schema([
    pa.field("row", pa.int64(), nullable=False),
    pa.field("reward", pa.float64(), nullable=False),
    pa.field("trainable", pa.int64(), nullable=False),
    pa.field("group_index", pa.int64()),
    pa.field("rollout_key", pa.int64()),
    pa.field("problem", pa.int64(), nullable=False),
    pa.field("detail", pa.string()),
])
# Slim columns present only when the labeling needs them (version 2 of the contract): each
# --reward-keys field's value (gdpo). The columns an option reads from the input (--baseline-column,
# --version-column, --filter-metric, ...) have their fields in their registry (transforms/lib/labeling/slim_columns.py).
SLIM_REWARD_PARTS = pa.field("reward_parts", pa.list_(pa.float64()))
# A key stored as text (or as an integer beyond int64): its value as a string, coded to a dense int64
# by first appearance in the batch before the core (transforms/lib/labeling/label_batch.py dense_keys).
SLIM_GROUP_TEXT = pa.field("group_text", pa.string())
SLIM_ROLLOUT_TEXT = pa.field("rollout_text", pa.string())
# `relabel compare --a column:NAME`: the advantage the input stores (null where absent or not a number)
SLIM_STORED_ADVANTAGE = pa.field("stored_advantage", pa.float64())
# A row its framework never trained on (a preset's reader names why: a padding row, an errored trace): it leaves
# its batch before grouping, as a filtered row (label_batch.py). Present only when some row has one.
SLIM_NOT_TRAINED = pa.field("not_trained", pa.string())
# Under a turn-level estimator: the row's reward was null, read as a step reward of 0 (counted in the manifest)
SLIM_NULL_REWARD = pa.field("null_reward", pa.bool_())


def slim_schema(reward_parts: bool = False, group_text: bool = False, rollout_text: bool = False,
                stored_advantage: bool = False, read: tuple[pa.Field, ...] = (),
                not_trained: bool = False) -> pa.Schema:
    """SLIM, then the optional columns present: `read`, the fields of the columns the options read."""
    schema = SLIM
    if reward_parts:
        schema = schema.append(SLIM_REWARD_PARTS)
    if group_text:
        schema = schema.append(SLIM_GROUP_TEXT)
    if rollout_text:
        schema = schema.append(SLIM_ROLLOUT_TEXT)
    if stored_advantage:
        schema = schema.append(SLIM_STORED_ADVANTAGE)
    if not_trained:
        schema = schema.append(SLIM_NOT_TRAINED)
    for field in read:
        schema = schema.append(field)
    return schema

# Per-row result of the advantage computation, joined back to its source file.
RESULT = pa.schema([
    pa.field("row", pa.int64(), nullable=False),
    pa.field("raw_reward", pa.float32(), nullable=False),
    pa.field("advantage", pa.float32(), nullable=False),
    pa.field("mainstream", pa.bool_(), nullable=False),
    pa.field("rollout_key", pa.int64()),
    pa.field("prompt_group", pa.int64(), nullable=False),
    pa.field("rollout_mask_sum", pa.int64(), nullable=False),
    pa.field("uniform", pa.bool_(), nullable=False),
    pa.field("loss_weight", pa.float32()),  # null without --row-weight
])



def result_schema(is_weights: bool = False, corrected: bool = False) -> pa.Schema:
    """RESULT, with rollout correction's columns (docs/off-policy.md) when it is on: each row's final
    loss_mask and whether a rejection touched it, and its IS weights when it weighs."""
    schema = RESULT
    if corrected:
        schema = schema.append(pa.field("loss_mask", pa.list_(pa.int32()))).append(
            pa.field("rollout_rejected", pa.bool_(), nullable=False))
    if is_weights:
        schema = schema.append(pa.field("is_weights", pa.list_(pa.float32())))
    return schema


# _dead_letters.parquet and _filtered.parquet
DEAD_LETTERS = pa.schema([
    pa.field("source", pa.string(), nullable=False),
    pa.field("row", pa.int64()),
    pa.field("batch", pa.string()),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("message", pa.string(), nullable=False),
    pa.field("row_json", pa.string()),  # the row's columns as JSON, where the file was readable
])


# A rescored run (--reward-fn, --rm-url, --reward-model; docs/rescoring.md) keeps the reward the input stored
# beside the new one: the input's type, float64 (null) where the input had none.
RESCORED_COLUMNS = pa.schema([pa.field("original_reward", pa.float64())])

# A Delta table's partition column (--output-format delta, docs/backfills.md): the run's name, in the training
# rows' table and in both records tables.
RUN_PARTITION = pa.field("run", pa.string(), nullable=False)


def describe() -> str:
    """Human-readable listing for `relabel schema`."""
    lines = [f"schema version {SCHEMA_VERSION}", "", "input rollout rows (other columns pass through untouched):"]
    for c in INPUT_COLUMNS:
        lines.append(f"  {c.name:<16} {str(c.type):<14} {'required' if c.required else 'optional'}  {c.default}")
    for title, schema in (("training rows (every input column, plus):", TRAINING_COLUMNS),
                          ("rescored runs' training rows also (the stored reward; a column the input had keeps "
                           "its type):", RESCORED_COLUMNS),
                          ("_dead_letters.parquet / _filtered.parquet:", DEAD_LETTERS),
                          ("--output-format delta: TABLE, TABLE_dead_letters and TABLE_filtered also (the "
                           "partition column):", pa.schema([RUN_PARTITION]))):
        lines += ["", title]
        lines += [f"  {f.name:<16} {str(f.type)}{'' if f.nullable else ' not null'}" for f in schema]
        if schema is TRAINING_COLUMNS:
            lines.append(f"  {LOSS_WEIGHT.name:<16} {LOSS_WEIGHT.type} not null (only under --row-weight)")
    return "\n".join(lines)
