"""A file's table -> per-batch slim tables: keys, reward value, trainable tokens and row problems.

Row problems are found here, vectorized; a bad row stays in its batch (its
position matters for positional grouping) and kills its prompt group later.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel import schemas
from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.hooks.sample_core import (
    FLOAT32_MAX,
    MAX_RESPONSE_TOKENS,
    mask_length_text,
    mask_value_text,
    negative_length_text,
    null_mask_text,
    reward_type_text,
    too_large_text,
)
from rollout_relabel.transforms.lib.io.columns import (
    bool_column,
    fill,
    first_null,
    flag,
    int_column,
    is_number,
    list_sums,
    lookup_path,
    mapped_columns,
    mapped_sources,
    one_array,
    usable_columns,
)
from rollout_relabel.transforms.lib.io.jsonl import malformed_lines
from rollout_relabel.transforms.lib.labeling import correction_columns
from rollout_relabel.transforms.lib.labeling.slim_columns import SLIM_COLUMNS
from rollout_relabel.transforms.lib.rescoring.rows import REWARD_FAILED
from rollout_relabel.transforms.lib.settings import Labeling


def batch_key_of(source: str, step) -> str:
    """Batch key: the Parquet `step` value, else the file itself (a .pt dump is one batch)."""
    return f"step={step}" if step is not None else f"file={source}"




def slim_input_columns(labeling: Labeling | None = None, stored_advantage: str | None = None) -> tuple[str, ...]:
    """The input columns slim extraction reads: the interpreted ones (where --column maps them), the
    baseline's column, and the column of an advantage stored in the input."""
    if labeling is None and stored_advantage is None:
        return schemas.SLIM_INPUT_COLUMNS
    labeling = labeling or Labeling()
    extra = mapped_sources(labeling.columns)
    streams = ((labeling.old_logprobs_column, labeling.rollout_logprobs_column) if labeling.correction() is not None
               else ())
    for path in (*(column.path(labeling) for column in SLIM_COLUMNS), *streams, stored_advantage):
        if path is not None:
            extra += (path, path.split(".", 1)[0])
    return tuple(dict.fromkeys(schemas.SLIM_INPUT_COLUMNS + extra))


def extract_slim(table: pa.Table, source: str, labeling: Labeling | str | None = None,
                 stored_advantage: str | None = None) -> list[tuple[str, pa.Table]]:
    """Split a file's rows by batch and reduce them to the slim columns the core needs.

    `labeling`: the options that say where each value is read (the reward and its keys and weights, the
    baseline, --column, --batch-from, --group-key); a plain string is a --reward-key. `stored_advantage`:
    `relabel compare --a column:NAME`, the advantage the input stores.
    Row problems are found here, vectorized; a bad row stays in its batch (its
    position matters for positional grouping) and kills its prompt group later.
    """
    fields = labeling if isinstance(labeling, Labeling) else Labeling(reward_key=labeling)
    n = table.num_rows
    problem = np.zeros(n, dtype=np.int64)
    details: dict[int, str] = {}
    table, legacy_verl = _usable_rows(table, source, fields, problem, details)
    null_rewards = np.zeros(n, dtype=bool) if null_step_rewards(fields) else None
    reward, parts = _rewards(table, fields, problem, details, null_rewards)
    trainable = _trainable_tokens(table, problem, details)
    group_index, group_text = _group_keys(table, fields, legacy_verl)
    rollout_key, rollout_text = _rollout_key(table)
    if fields.group_key == "verl-uid" and not legacy_verl and "rollout_id" not in table.column_names:
        rollout_key, rollout_text = _verl_sessions(table)
    stored = None
    if stored_advantage is not None:
        stored = stored_advantage_values(table, stored_advantage)
    # the optional columns the options read (--baseline-column, --version-column, --filter-metric, ...): after
    # every row problem, so that a problem's text wins its row's detail
    read = {column.field: column.read(table, path, problem, details) for column in SLIM_COLUMNS
            if (path := column.path(fields)) is not None}
    # rollout correction: the per-token mask and both logprob streams, for the batch's correction
    streams = (correction_columns.read_streams(table, fields, problem, details) if fields.correction() is not None
               else {})
    columns = {
        "row": pa.array(np.arange(n, dtype=np.int64)),
        "reward": pa.array(np.where(problem == 0, reward, 0.0)),
        "trainable": pa.array(trainable.astype(np.int64)),
        "group_index": group_index,
        "rollout_key": rollout_key,
        "problem": pa.array(problem),
        "detail": _detail_column(details, n),
    }
    optional = {
        "reward_parts": _parts_column(parts, problem) if parts is not None else None,
        "group_text": group_text,
        "rollout_text": rollout_text,
        "stored_advantage": stored,
        # a turn estimator's null step rewards, read as 0: counted in the manifest
        "null_reward": pa.array(null_rewards & (problem == 0)) if null_rewards is not None else None,
        "not_trained": _not_trained(table),
    }
    columns.update((name, column) for name, column in optional.items() if column is not None)
    columns.update((field.name, values if isinstance(values, pa.Array) else pa.array(values, mask=~np.isfinite(values)))
                   for field, values in read.items())
    columns.update(streams)
    read_fields = (tuple(read) + ((schemas.SLIM_NULL_REWARD,) if null_rewards is not None else ())
                   + (correction_columns.SLIM_FIELDS if streams else ()))
    slim = pa.table(columns, schema=schemas.slim_schema(parts is not None, group_text is not None,
                                                        rollout_text is not None, stored is not None, read_fields,
                                                        optional["not_trained"] is not None))
    return _by_batch(table, source, fields, slim)


def _usable_rows(table: pa.Table, source: str, fields: Labeling, problem, details) -> tuple[pa.Table, bool]:
    """(the table as the interpreted columns see it (--column), whether it is a legacy verl dump): malformed
    lines flagged first (their nulls are not the row's problem), then each interpreted column checked for a
    usable type."""
    n = table.num_rows
    columns, legacy_verl = _verl_columns(table, fields)
    table = mapped_columns(table, columns, problem, details)
    malformed = malformed_lines(table)
    if malformed:
        where = np.zeros(n, dtype=bool)
        where[list(malformed)] = True
        flag(problem, details, where, Reason.MALFORMED_LINE, lambda i: malformed[i])
        table = _around_malformed(table, where, source)
    if REWARD_FAILED in table.column_names:  # before the reward's own checks: the call's error explains it
        failed = table.column(REWARD_FAILED).combine_chunks()
        if failed.null_count < n:
            texts = failed.to_pylist()
            flag(problem, details, np.asarray(failed.is_valid()), Reason.REWARD_FAILED, lambda i: texts[i])
        table = table.drop_columns([REWARD_FAILED])
    return usable_columns(table, source, problem, details), legacy_verl


def _rewards(table: pa.Table, fields: Labeling, problem, details, null_rewards=None
             ) -> tuple[np.ndarray, np.ndarray | None]:
    """(each row's reward value, each row's per-key values under --reward-keys, else None). `null_rewards`: see
    _reward_values."""
    parts, keys = None, fields.core.reward_keys
    if keys is None:
        reward = _reward_values(table, fields.reward_key, problem, details, null_rewards)
    else:
        parts = _reward_parts(table, keys, problem, details)
        reward = _weighted_sum(parts, fields.core.weights, keys, problem, details)
    # rewards and advantages are written as float32: a value beyond its range would be written as inf
    flag(problem, details, np.isfinite(reward) & (np.abs(reward) > FLOAT32_MAX), Reason.VALUE_TOO_LARGE,
         lambda i: f"reward {reward[i]!r} does not fit float32 (largest {FLOAT32_MAX:.6g})")
    return reward, parts


def _trainable_tokens(table: pa.Table, problem, details) -> np.ndarray:
    """Each row's trainable tokens (its loss mask's sum, else its response length; 0 when removed), with
    the length and mask checks flagged."""
    n = table.num_rows
    response_length = int_column(table, "response_length")
    mask = one_array(table.column("loss_mask")) if "loss_mask" in table.column_names else None
    has_mask = np.zeros(n, dtype=bool) if mask is None else np.asarray(mask.is_valid())
    mask_len = np.zeros(n, dtype=np.int64) if mask is None else fill(pc.list_value_length(mask), 0)
    mask_sum = np.zeros(n, dtype=np.int64) if mask is None else list_sums(mask)
    length = response_length if response_length is not None else np.zeros(n, dtype=np.int64)
    length_given = (np.asarray(table.column("response_length").is_valid())
                    if response_length is not None else np.zeros(n, dtype=bool))
    length = np.where(length_given, length, mask_len)

    flag(problem, details, length_given & (length < 0), Reason.NEGATIVE_LENGTH,
         lambda i: negative_length_text(length[i]))
    flag(problem, details, (length > MAX_RESPONSE_TOKENS) | (mask_len > MAX_RESPONSE_TOKENS), Reason.VALUE_TOO_LARGE,
         lambda i: too_large_text(max(length[i], mask_len[i])))
    flag(problem, details, has_mask & length_given & (mask_len != length), Reason.MASK_LENGTH,
         lambda i: mask_length_text(mask_len[i], length[i]))
    if mask is not None and mask.values.null_count:
        null_tokens = list_sums(pa.ListArray.from_arrays(mask.offsets, pc.cast(mask.values.is_null(), pa.int8())))
        flag(problem, details, has_mask & (null_tokens > 0), Reason.NULL_MASK_VALUE,
             lambda i: null_mask_text(null_tokens[i], mask_len[i]))
    if mask is not None and not _only_zeros_and_ones(mask.values):
        # 0 or 1 each: another value would weigh the token's loss (negative sums were written)
        values = mask.values
        odd = pc.and_(pc.is_valid(values), pc.invert(pc.is_in(values, value_set=pa.array([0, 1], values.type))))
        odd_tokens = list_sums(pa.ListArray.from_arrays(mask.offsets, pc.cast(pc.fill_null(odd, False), pa.int8())))
        flag(problem, details, has_mask & (odd_tokens > 0), Reason.MASK_VALUE,
             lambda i: mask_value_text(int(odd_tokens[i]), mask[i].as_py()))
    remove = bool_column(table, "remove_sample")
    return np.where(remove, 0, np.where(has_mask, mask_sum, np.maximum(length, 0)))


def _only_zeros_and_ones(values: pa.Array) -> bool:
    """True when an integer mask's values are all 0 or 1 (nulls aside): one min/max pass, where counting
    odd values row by row costs a file several passes; other types take the count."""
    if not pa.types.is_integer(values.type):
        return False
    bounds = pc.min_max(values)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    return low is None or (low >= 0 and high <= 1)


def _group_keys(table: pa.Table, fields: Labeling, legacy_verl: bool = False):
    """(group_index, group_text): the prompt-group key as an integer, or as text when any row's is text."""
    group_index, group_text = _key(table, "group_index")
    if fields.group_key == "verl-uid" and not legacy_verl:  # {uid}_{session}_{index} -> {uid} (uid.rsplit("_", 2)[0])
        text = group_text if group_text is not None else pc.cast(group_index, pa.string())
        group_text = pc.replace_substring_regex(text, r"_[^_]*_[^_]*$", "")
        group_index = _placeholder(group_text)
    return group_index, group_text


def _verl_sessions(table: pa.Table):
    """verl v1's rollouts: `{uid}_{session}` of group_index `{uid}_{session}_{index}` (as
    `compute_advantage_for_multi_trajectories` splits it: uid.rsplit("_", 2), verl/trainer/ppo/v1/utils.py,
    verl-project/verl@1dda039b9c63). A key without a session part is a rollout of its own (no rollout key)."""
    group_index, group_text = _key(table, "group_index")
    text = group_text if group_text is not None else pc.cast(group_index, pa.string())
    has_session = pc.fill_null(pc.match_substring_regex(text, r"_[^_]*_[^_]*$"), False)
    session = pc.if_else(has_session, pc.replace_substring_regex(text, r"_[^_]*$", ""), pa.scalar(None, pa.string()))
    return _placeholder(session), session


def _not_trained(table: pa.Table) -> pa.Array | None:
    """Why the framework never trained on each row (null: it did), as a preset's reader wrote it; None when
    no row says so (the slim table then has no such column)."""
    name = schemas.SLIM_NOT_TRAINED.name
    if name not in table.column_names or table.column(name).null_count == table.num_rows:
        return None
    return table.column(name).combine_chunks()


def _detail_column(details: dict[int, str], n: int) -> pa.Array:
    if not details:
        return pa.nulls(n, pa.string())
    detail: list[str | None] = [None] * n
    for i, text in details.items():
        detail[i] = text
    return pa.array(detail, pa.string())


def _parts_column(parts: np.ndarray, problem: np.ndarray) -> pa.Array:
    """The per-key reward values as a list per row (zeros on a row with a problem)."""
    n, width = len(problem), parts.shape[1]
    kept = np.where((problem == 0)[:, None], parts, 0.0).reshape(-1)
    return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * width), pa.array(kept))


def _by_batch(table: pa.Table, source: str, fields: Labeling, slim: pa.Table) -> list[tuple[str, pa.Table]]:
    """The slim rows split by batch: one folder, one file, or the file's `step` values (a null step: BadFile)."""
    if fields.batch_from == "folder":
        return [(f"folder={source.rsplit('/', 1)[0] if '/' in source else '.'}", slim)]
    if "step" not in table.column_names or fields.batch_from == "file":
        return [(batch_key_of(source, None), slim)]
    steps = table.column("step")
    if steps.null_count:
        raise BadFile(Reason.MISSING_COLUMN, f"{source}: `step` is null on {steps.null_count} rows "
                                            f"(first: row {first_null(steps)}); every row needs its batch")
    step_values = steps.to_numpy()
    if len(step_values) and step_values.min() == step_values.max():  # the usual file: one step, nothing to split
        return [(batch_key_of(source, int(step_values[0])), slim)]
    unique = np.unique(step_values)
    return [(batch_key_of(source, int(step)), slim.filter(pa.array(step_values == step))) for step in unique]


def _verl_columns(table: pa.Table, fields: Labeling) -> tuple[tuple[str, ...] | None, bool]:
    """(the --column mapping to read `table` with, whether it is a legacy verl dump).

    Under --group-key verl-uid, a file without the uid column (verl's legacy trainer writes none; its
    `_write_generations` in verl/trainer/ppo/ray_trainer.py, verl-project/verl@1dda039b9c63) is grouped by
    identical `input` text, the prompt its responses share, taken whole (no suffix to cut)."""
    columns = fields.columns
    if fields.group_key != "verl-uid" or "input" not in table.column_names:
        return columns, False
    source = dict(item.partition("=")[::2] for item in columns or ()).get("group_index", "group_index")
    if source.split(".", 1)[0] in table.column_names:
        return columns, False
    kept = tuple(item for item in columns or () if item.partition("=")[0] != "group_index")
    return kept + ("group_index=input",), True


def _around_malformed(table, where, source):
    """A malformed line's row (all nulls) in a prompt group of its own, in the batch of the row before it
    (after it, for the first lines): the rows around it are labelled as if it were not there."""
    rows = np.flatnonzero(where)
    if "group_index" in table.column_names:
        column = table.column("group_index").combine_chunks()
        text = pc.cast(column, pa.string()).to_pylist()
        for i in rows:
            text[i] = f"\0malformed line of {source}, row {i}"  # no real key holds a NUL
        table = table.set_column(table.column_names.index("group_index"), "group_index", pa.array(text))
    if "step" in table.column_names and table.column("step").null_count < table.num_rows:
        steps = pc.fill_null_backward(pc.fill_null_forward(table.column("step").combine_chunks()))
        table = table.set_column(table.column_names.index("step"), "step", steps)
    return table


def _key(table, name):
    """(int64 key with nulls, None) for integer keys; (placeholder int64 valid where the text is, the key
    as text) for text keys, which label_batch codes by first appearance in the batch."""
    n = table.num_rows
    if name not in table.column_names:
        return pa.nulls(n, pa.int64()), None
    column = one_array(table.column(name))
    if pa.types.is_integer(column.type):
        return pc.cast(column, pa.int64()), None
    return _placeholder(column), pc.cast(column, pa.string())


def _placeholder(text) -> pa.Array:
    return pa.array(np.zeros(len(text), dtype=np.int64), mask=np.asarray(text.is_null()))


def _rollout_key(table):
    """rollout_id, falling back to index where it is null: int64, or text when either is text."""
    rollout_id, rollout_text = _key(table, "rollout_id")
    index, index_text = _key(table, "index")
    if rollout_text is None and index_text is None:
        return pc.coalesce(rollout_id, index), None
    as_text = [t if t is not None else pc.cast(k, pa.string())
               for k, t in ((rollout_id, rollout_text), (index, index_text))]
    text = pc.coalesce(*as_text)
    return _placeholder(text), text


def null_step_rewards(labeling: Labeling) -> bool:
    """A null reward is a step reward of 0, not a problem: under a turn-level estimator, agents reward only
    some turns (AReaL's rule, docs/estimators.md "Turn-level credit"). The rows are counted (null_reward)."""
    return labeling.reads_turns


def _reward_values(table, reward_key, problem, details, null_is_zero=None):
    """`null_is_zero`: a bool [n] to mark the null rewards in, which then are 0 and no problem; None: a null
    is non-numeric-reward."""
    n = table.num_rows
    if "reward" not in table.column_names:
        flag(problem, details, np.ones(n, dtype=bool), Reason.MISSING_COLUMN,
             lambda i: "the file has no `reward` column")
        return np.zeros(n)
    column = table.column("reward")
    kind = column.type
    if reward_key is None:
        if not is_number(kind):
            flag(problem, details, np.ones(n, dtype=bool), Reason.NON_NUMERIC_REWARD,
                  lambda i: reward_type_text(str(kind), None))
            return np.zeros(n)
        values = column
    elif pa.types.is_struct(kind):
        if kind.get_field_index(reward_key) < 0:
            fields = ", ".join(f.name for f in kind)
            flag(problem, details, np.ones(n, dtype=bool), Reason.MISSING_REWARD_KEY,
                  lambda i: f"reward struct has no field {reward_key!r} (fields: {fields})")
            return np.zeros(n)
        values = pc.struct_field(column, reward_key)
        absent = np.asarray(values.is_null()) & np.asarray(column.is_valid()) & (null_is_zero is None)
        flag(problem, details, absent, Reason.MISSING_REWARD_KEY, lambda i: f"reward[{reward_key!r}] is null")
    elif pa.types.is_map(kind):
        values = pc.map_lookup(column, pa.scalar(reward_key, kind.key_type), "first")
        absent = np.asarray(values.is_null()) & np.asarray(column.is_valid())
        flag(problem, details, absent, Reason.MISSING_REWARD_KEY, lambda i: f"reward map has no key {reward_key!r}")
    else:
        flag(problem, details, np.ones(n, dtype=bool), Reason.MISSING_REWARD_KEY,
              lambda i: reward_type_text(str(kind), reward_key))
        return np.zeros(n)
    if not is_number(values.type):
        flag(problem, details, np.ones(n, dtype=bool), Reason.NON_NUMERIC_REWARD,
              lambda i: f"reward[{reward_key!r}] has type {values.type}")
        return np.zeros(n)
    inexact = _beyond_float64_integers(values)
    numbers = fill(pc.cast(values, pa.float64(), safe=False), np.nan)
    null = np.asarray(column.is_null())
    if null_is_zero is not None:  # a turn without a reward (the field's null too): 0, counted
        null = np.asarray(values.is_null())
        null_is_zero |= null & (problem == 0)
        numbers = np.where(null, 0.0, numbers)
    else:
        flag(problem, details, null, Reason.NON_NUMERIC_REWARD, lambda i: "reward is null")
    flag(problem, details, inexact, Reason.VALUE_TOO_LARGE,
         lambda i: f"reward {values[i].as_py()} is an integer beyond 2**53: no float holds it exactly")
    flag(problem, details, ~null & ~np.isfinite(numbers), Reason.NON_FINITE_REWARD,
         lambda i: f"reward is {numbers[i]}")
    return numbers


def _beyond_float64_integers(values) -> np.ndarray:
    """Rows of an integer reward column whose value float64 cannot hold exactly (beyond 2**53)."""
    kind = values.type
    if not pa.types.is_integer(kind) or kind.bit_width <= 32:
        return np.zeros(len(values), dtype=bool)
    beyond = pc.greater(values, pa.scalar(2 ** 53, kind))
    if pa.types.is_signed_integer(kind):
        beyond = pc.or_(beyond, pc.less(values, pa.scalar(-2 ** 53, kind)))
    return fill(beyond, False).astype(bool)


def _reward_parts(table, keys, problem, details) -> np.ndarray:
    """float64 [n, K]: each --reward-keys field of the struct/map reward (NaN where unusable, flagged)."""
    n = table.num_rows
    parts = np.full((n, len(keys)), np.nan)
    if "reward" not in table.column_names:
        flag(problem, details, np.ones(n, dtype=bool), Reason.MISSING_COLUMN,
             lambda i: "the file has no `reward` column")
        return parts
    column = table.column("reward")
    kind = column.type
    null = np.asarray(column.is_null())
    if not (pa.types.is_struct(kind) or pa.types.is_map(kind)):
        flag(problem, details, ~null, Reason.MISSING_REWARD_KEY,
             lambda i: f"--reward-keys {','.join(keys)} given but reward has type {kind}")
        flag(problem, details, null, Reason.NON_NUMERIC_REWARD, lambda i: "reward is null")
        return parts
    for j, key in enumerate(keys):
        if pa.types.is_struct(kind) and kind.get_field_index(key) < 0:
            names = ", ".join(f.name for f in kind)
            flag(problem, details, ~null, Reason.MISSING_REWARD_KEY,
                 lambda i, key=key, names=names: f"reward struct has no field {key!r} (fields: {names})")
            continue
        values = (pc.struct_field(column, key) if pa.types.is_struct(kind)
                  else pc.map_lookup(column, pa.scalar(key, kind.key_type), "first"))
        if not is_number(values.type):
            flag(problem, details, ~null & np.asarray(values.is_valid()), Reason.MISSING_REWARD_KEY,
                 lambda i, key=key, t=values.type: f"reward[{key!r}] has type {t}, not a number")
        else:
            parts[:, j] = fill(pc.cast(values, pa.float64()), np.nan)
        absent = np.asarray(values.is_null()) & ~null
        flag(problem, details, absent, Reason.MISSING_REWARD_KEY,
             lambda i, key=key: f"reward[{key!r}] is null" if pa.types.is_struct(kind)
             else f"reward map has no key {key!r}")
    flag(problem, details, null, Reason.NON_NUMERIC_REWARD, lambda i: "reward is null")
    bad = ~np.isfinite(parts)
    flag(problem, details, bad.any(axis=1), Reason.NON_FINITE_REWARD,
         lambda i: "; ".join(f"reward[{keys[j]!r}] is {parts[i, j]}" for j in np.flatnonzero(bad[i])))
    return parts


def _weighted_sum(parts, weights, keys, problem, details) -> np.ndarray:
    """The reward value under --reward-keys: sum of w_j * reward[K_j], added in key order (float64)."""
    total = np.zeros(parts.shape[0])
    with np.errstate(all="ignore"):  # an overflow is flagged below
        for j, weight in enumerate(weights):  # a loop over keys, not rows
            total += weight * parts[:, j]
    flag(problem, details, ~np.isfinite(total), Reason.NON_FINITE_REWARD,
         lambda i: f"the weighted sum of reward[{', '.join(map(repr, keys))}] is {total[i]}")
    return total


def stored_advantage_values(table, path) -> pa.Array:
    """float64 with nulls: the advantage stored at `path` (`relabel compare --a column:NAME`), read with the
    same path lookup as --column and --baseline-column. Null where the column is absent, the value null or
    not a number; NaN and inf are kept as they are (compare_batch counts both kinds as dead under A)."""
    n = table.num_rows
    values, _ = lookup_path(table, path, "stored advantage")
    if values is None:
        return pa.nulls(n, pa.float64())
    if not is_number(values.type):
        return pa.nulls(n, pa.float64())
    return pc.cast(values, pa.float64())
