"""A file's table -> per-batch slim tables: keys, reward value, trainable tokens and row problems.

Row problems are found here, vectorized; a bad row stays in its batch (its
position matters for positional grouping) and kills its prompt group later.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import schemas
from transforms.lib.columns import (
    bool_column,
    fill,
    first_null,
    flag,
    int_column,
    list_sums,
    optional_int,
    usable_columns,
)
from transforms.lib.errors import BadFile
from transforms.lib.sample_core import (
    MAX_RESPONSE_TOKENS,
    mask_length_text,
    negative_length_text,
    null_mask_text,
    reward_type_text,
    too_large_text,
)


def batch_key_of(source: str, step) -> str:
    """Batch key: the Parquet `step` value, else the file itself (a .pt dump is one batch)."""
    return f"step={step}" if step is not None else f"file={source}"


def extract_slim(table: pa.Table, source: str, reward_key: str | None) -> list[tuple[str, pa.Table]]:
    """Split a file's rows by batch and reduce them to the slim columns the core needs.

    Row problems are found here, vectorized; a bad row stays in its batch (its
    position matters for positional grouping) and kills its prompt group later.
    """
    n = table.num_rows
    problem = np.zeros(n, dtype=np.int64)
    details: dict[int, str] = {}
    table = usable_columns(table, source, problem, details)

    reward = _reward_values(table, reward_key, problem, details)
    response_length = int_column(table, "response_length")
    mask = table.column("loss_mask").combine_chunks() if "loss_mask" in table.column_names else None
    has_mask = np.zeros(n, dtype=bool) if mask is None else np.asarray(mask.is_valid())
    mask_len = np.zeros(n, dtype=np.int64) if mask is None else fill(pc.list_value_length(mask), 0)
    mask_sum = np.zeros(n, dtype=np.int64) if mask is None else list_sums(mask)
    length = response_length if response_length is not None else np.zeros(n, dtype=np.int64)
    length_given = (np.asarray(table.column("response_length").is_valid())
                    if response_length is not None else np.zeros(n, dtype=bool))
    length = np.where(length_given, length, mask_len)

    flag(problem, details, length_given & (length < 0), "negative-length",
          lambda i: negative_length_text(length[i]))
    flag(problem, details, (length > MAX_RESPONSE_TOKENS) | (mask_len > MAX_RESPONSE_TOKENS), "value-too-large",
          lambda i: too_large_text(max(length[i], mask_len[i])))
    flag(problem, details, has_mask & length_given & (mask_len != length), "mask-length",
          lambda i: mask_length_text(mask_len[i], length[i]))
    if mask is not None and mask.values.null_count:
        null_tokens = list_sums(pa.ListArray.from_arrays(mask.offsets, pc.cast(mask.values.is_null(), pa.int8())))
        flag(problem, details, has_mask & (null_tokens > 0), "null-mask-value",
              lambda i: null_mask_text(null_tokens[i], mask_len[i]))
    remove = bool_column(table, "remove_sample")
    trainable = np.where(remove, 0, np.where(has_mask, mask_sum, np.maximum(length, 0)))

    rollout_id, index = optional_int(table, "rollout_id"), optional_int(table, "index")
    rollout_key = pa.array(np.where(rollout_id[1], rollout_id[0], index[0]),
                           mask=~(rollout_id[1] | index[1]))
    group_index = optional_int(table, "group_index")
    detail = [None] * n
    for i, text in details.items():
        detail[i] = text
    slim = pa.table({
        "row": pa.array(np.arange(n, dtype=np.int64)),
        "reward": pa.array(np.where(problem == 0, reward, 0.0)),
        "trainable": pa.array(trainable.astype(np.int64)),
        "group_index": pa.array(group_index[0], mask=~group_index[1]),
        "rollout_key": rollout_key,
        "problem": pa.array(problem),
        "detail": pa.array(detail, pa.string()),
    }, schema=schemas.SLIM)

    if "step" not in table.column_names:
        return [(batch_key_of(source, None), slim)]
    steps = table.column("step")
    if steps.null_count:
        raise BadFile("missing-column", f"{source}: `step` is null on {steps.null_count} rows "
                                            f"(first: row {first_null(steps)}); every row needs its batch")
    out = []
    step_values = steps.to_numpy()
    for step in np.unique(step_values):
        out.append((batch_key_of(source, int(step)), slim.filter(pa.array(step_values == step))))
    return out

def _reward_values(table, reward_key, problem, details):
    n = table.num_rows
    if "reward" not in table.column_names:
        flag(problem, details, np.ones(n, dtype=bool), "missing-column", lambda i: "the file has no `reward` column")
        return np.zeros(n)
    column = table.column("reward")
    kind = column.type
    if reward_key is None:
        if not _is_number(kind):
            flag(problem, details, np.ones(n, dtype=bool), "non-numeric-reward",
                  lambda i: reward_type_text(str(kind), None))
            return np.zeros(n)
        values = column
    elif pa.types.is_struct(kind):
        if kind.get_field_index(reward_key) < 0:
            fields = ", ".join(f.name for f in kind)
            flag(problem, details, np.ones(n, dtype=bool), "missing-reward-key",
                  lambda i: f"reward struct has no field {reward_key!r} (fields: {fields})")
            return np.zeros(n)
        values = pc.struct_field(column, reward_key)
        absent = np.asarray(values.is_null()) & np.asarray(column.is_valid())
        flag(problem, details, absent, "missing-reward-key", lambda i: f"reward[{reward_key!r}] is null")
    elif pa.types.is_map(kind):
        values = pc.map_lookup(column, pa.scalar(reward_key, kind.key_type), "first")
        absent = np.asarray(values.is_null()) & np.asarray(column.is_valid())
        flag(problem, details, absent, "missing-reward-key", lambda i: f"reward map has no key {reward_key!r}")
    else:
        flag(problem, details, np.ones(n, dtype=bool), "missing-reward-key",
              lambda i: reward_type_text(str(kind), reward_key))
        return np.zeros(n)
    if not _is_number(values.type):
        flag(problem, details, np.ones(n, dtype=bool), "non-numeric-reward",
              lambda i: f"reward[{reward_key!r}] has type {values.type}")
        return np.zeros(n)
    numbers = fill(pc.cast(values, pa.float64()), np.nan)
    null = np.asarray(column.is_null())
    flag(problem, details, null, "non-numeric-reward", lambda i: "reward is null")
    flag(problem, details, ~null & ~np.isfinite(numbers), "non-finite-reward",
          lambda i: f"reward is {numbers[i]}")
    return numbers


def _is_number(kind) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
