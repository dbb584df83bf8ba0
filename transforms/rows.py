"""Arrow <-> numeric-core adapters: pure functions, no Beam.

extract_slim:    a file's table -> per-batch slim tables (keys, reward, trainable tokens, row problems)
relabel_batch:   one batch's slim tables -> per-source results, dead letters, filtered rows, counters
training_rows:   a file's full table + its results -> the training-row table that is written
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import schemas
from transforms.core.config import CoreConfig
from transforms.core.reasons import CODE, REASONS, BadFile


# ---------------------------------------------------------------- slim path

def batch_key_of(source: str, step) -> str:
    """Batch key: the Parquet `step` value, else the file itself (a .pt dump is one batch)."""
    return f"step={step}" if step is not None else f"file={source}"


# A response longer than this is not a real rollout; building its mask would exhaust memory.
MAX_RESPONSE_TOKENS = 1 << 24

INTEGER_COLUMNS = ("step", "group_index", "index", "rollout_id", "response_length")


def extract_slim(table: pa.Table, source: str, reward_key: str | None) -> list[tuple[str, pa.Table]]:
    """Split a file's rows by batch and reduce them to the slim columns the core needs.

    Row problems are found here, vectorized; a bad row stays in its batch (its
    position matters for positional grouping) and kills its prompt group later.
    """
    n = table.num_rows
    problem = np.zeros(n, dtype=np.int64)
    details: dict[int, str] = {}
    table = _usable_columns(table, source, problem, details)

    reward = _reward_values(table, reward_key, problem, details)
    response_length = _int_column(table, "response_length")
    mask = table.column("loss_mask").combine_chunks() if "loss_mask" in table.column_names else None
    has_mask = np.zeros(n, dtype=bool) if mask is None else np.asarray(mask.is_valid())
    mask_len = np.zeros(n, dtype=np.int64) if mask is None else _fill(pc.list_value_length(mask), 0)
    mask_sum = np.zeros(n, dtype=np.int64) if mask is None else _list_sums(mask)
    length = response_length if response_length is not None else np.zeros(n, dtype=np.int64)
    length_given = (np.asarray(table.column("response_length").is_valid())
                    if response_length is not None else np.zeros(n, dtype=bool))
    length = np.where(length_given, length, mask_len)

    _flag(problem, details, length_given & (length < 0), "negative-length",
          lambda i: f"response_length is {length[i]}")
    _flag(problem, details, (length > MAX_RESPONSE_TOKENS) | (mask_len > MAX_RESPONSE_TOKENS), "value-too-large",
          lambda i: f"response of {max(length[i], mask_len[i])} tokens is over the {MAX_RESPONSE_TOKENS} limit")
    _flag(problem, details, has_mask & length_given & (mask_len != length), "mask-length",
          lambda i: f"len(loss_mask) is {mask_len[i]} but response_length is {length[i]}")
    if mask is not None and mask.values.null_count:
        null_tokens = _list_sums(pa.ListArray.from_arrays(mask.offsets, pc.cast(mask.values.is_null(), pa.int8())))
        _flag(problem, details, has_mask & (null_tokens > 0), "null-mask-value",
              lambda i: f"loss_mask holds {null_tokens[i]} null value(s) among its {mask_len[i]}")
    remove = _bool_column(table, "remove_sample")
    trainable = np.where(remove, 0, np.where(has_mask, mask_sum, np.maximum(length, 0)))

    rollout_id, index = _optional_int(table, "rollout_id"), _optional_int(table, "index")
    rollout_key = pa.array(np.where(rollout_id[1], rollout_id[0], index[0]),
                           mask=~(rollout_id[1] | index[1]))
    group_index = _optional_int(table, "group_index")
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
                                            f"(first: row {_first_null(steps)}); every row needs its batch")
    out = []
    step_values = steps.to_numpy()
    for step in np.unique(step_values):
        out.append((batch_key_of(source, int(step)), slim.filter(pa.array(step_values == step))))
    return out


def _usable_columns(table, source, problem, details):
    """Flag every row of a file whose interpreted columns have the wrong type, and drop those columns.

    Integral floats (pandas' int-with-NaN) are accepted as integers. An all-null
    column (Arrow type null, e.g. from .pt dumps) means the values are absent.
    """
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_null(column.type) and name != "reward":
            table = table.drop_columns([name])
            continue
        expected = None
        if name in INTEGER_COLUMNS and not pa.types.is_integer(column.type):
            if pa.types.is_floating(column.type) and _integral(column):
                table = table.set_column(table.column_names.index(name), name, pc.cast(column, pa.int64()))
                continue
            expected = "integers"
        elif name == "loss_mask" and not ((pa.types.is_list(column.type) or pa.types.is_large_list(column.type))
                                          and pa.types.is_integer(column.type.value_type)):
            expected = "a list of integers"
        elif name == "remove_sample" and not pa.types.is_boolean(column.type):
            expected = "booleans"
        elif name == "status" and not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            expected = "strings"
        if expected:
            if name == "step":
                raise BadFile("ill-typed-column", f"{source}: `step` has type {column.type}, expected integers")
            _flag(problem, details, np.ones(table.num_rows, dtype=bool), "ill-typed-column",
                  lambda i, name=name, kind=column.type, expected=expected:
                  f"column `{name}` has type {kind}, expected {expected}")
            table = table.drop_columns([name])
    return table


def _integral(column) -> bool:
    values = pc.drop_null(column).to_numpy(zero_copy_only=False)
    return bool(np.all(np.isfinite(values)) and np.all(values == np.round(values))
                and (values.size == 0 or np.abs(values).max() < 2 ** 53))


def _first_null(column) -> int:
    return int(np.flatnonzero(np.asarray(column.is_null()))[0])


def _reward_values(table, reward_key, problem, details):
    n = table.num_rows
    if "reward" not in table.column_names:
        _flag(problem, details, np.ones(n, dtype=bool), "missing-column", lambda i: "the file has no `reward` column")
        return np.zeros(n)
    column = table.column("reward")
    kind = column.type
    if reward_key is None:
        if not _is_number(kind):
            _flag(problem, details, np.ones(n, dtype=bool), "non-numeric-reward",
                  lambda i: f"reward has type {kind}" + ("; pass --reward-key to pick a field"
                                                        if pa.types.is_struct(kind) or pa.types.is_map(kind) else ""))
            return np.zeros(n)
        values = column
    elif pa.types.is_struct(kind):
        if kind.get_field_index(reward_key) < 0:
            fields = ", ".join(f.name for f in kind)
            _flag(problem, details, np.ones(n, dtype=bool), "missing-reward-key",
                  lambda i: f"reward struct has no field {reward_key!r} (fields: {fields})")
            return np.zeros(n)
        values = pc.struct_field(column, reward_key)
        absent = np.asarray(values.is_null()) & np.asarray(column.is_valid())
        _flag(problem, details, absent, "missing-reward-key", lambda i: f"reward[{reward_key!r}] is null")
    elif pa.types.is_map(kind):
        values = pc.map_lookup(column, pa.scalar(reward_key, kind.key_type), "first")
        absent = np.asarray(values.is_null()) & np.asarray(column.is_valid())
        _flag(problem, details, absent, "missing-reward-key", lambda i: f"reward map has no key {reward_key!r}")
    else:
        _flag(problem, details, np.ones(n, dtype=bool), "missing-reward-key",
              lambda i: f"--reward-key {reward_key!r} given but reward has type {kind}")
        return np.zeros(n)
    if not _is_number(values.type):
        _flag(problem, details, np.ones(n, dtype=bool), "non-numeric-reward",
              lambda i: f"reward[{reward_key!r}] has type {values.type}")
        return np.zeros(n)
    numbers = _fill(pc.cast(values, pa.float64()), np.nan)
    null = np.asarray(column.is_null())
    _flag(problem, details, null, "non-numeric-reward", lambda i: "reward is null")
    _flag(problem, details, ~null & ~np.isfinite(numbers), "non-finite-reward",
          lambda i: f"reward is {numbers[i]}")
    return numbers


def _is_number(kind) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)


def _flag(problem, details, where, reason, describe):
    """Record `reason` on rows that have no earlier (higher-priority) problem."""
    fresh = np.flatnonzero(where & (problem == 0))
    problem[fresh] = CODE[reason]
    for i in fresh:  # bad rows only: rare
        details[int(i)] = describe(int(i))


def _fill(array, value) -> np.ndarray:
    return np.asarray(pc.fill_null(array, value).to_numpy(zero_copy_only=False))


def _int_column(table, name):
    if name not in table.column_names:
        return None
    return _fill(pc.cast(table.column(name), pa.int64()), 0).astype(np.int64)


def _optional_int(table, name):
    n = table.num_rows
    if name not in table.column_names:
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    column = pc.cast(table.column(name), pa.int64())
    return _fill(column, 0).astype(np.int64), np.asarray(column.is_valid())


def _bool_column(table, name):
    if name not in table.column_names:
        return np.zeros(table.num_rows, dtype=bool)
    return _fill(table.column(name), False).astype(bool)


def _list_sums(lists) -> np.ndarray:
    """Per-row sums of a list<int> array (null lists sum to 0), added in int64 over the flat values."""
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    offsets = np.asarray(lists.offsets, dtype=np.int64)
    values = lists.values
    if values.null_count:  # their rows are flagged (null-mask-value); 0 keeps the sums integers
        values = pc.fill_null(values, 0)
    values = values.to_numpy(zero_copy_only=False)[:offsets[-1]]  # a sliced array's values run on
    starts, nonempty = offsets[:-1], offsets[:-1] < offsets[1:]
    sums = np.zeros(len(lists), dtype=np.int64)
    if nonempty.any():  # each non-empty list runs from its start to the next one's: reduceat's segments
        sums[nonempty] = np.add.reduceat(values, starts[nonempty], dtype=np.int64)
    return np.where(np.asarray(lists.is_valid()), sums, 0)


# ---------------------------------------------------------------- one batch through the core

@dataclass
class BatchResult:
    results: dict[str, pa.Table]          # source -> RESULT rows that will be written
    dead: pa.Table                        # DEAD_LETTERS rows
    filtered: pa.Table                    # DEAD_LETTERS rows with reason uniform-group
    counters: dict = field(default_factory=dict)


def relabel_batch(batch_key: str, parts: list[tuple[str, pa.Table]], prompt_group_sizes, config: CoreConfig,
                  drop_uniform_groups: bool = False, device: str = "cpu") -> BatchResult:
    """One batch, given as (source, slim rows) parts, through the core.

    Row order is (source, row): parts sorted by source, each part's rows in file order.
    """
    from transforms.core.relabel import relabel

    parts = sorted(parts, key=lambda part: part[0])
    part_sources = [source for source, _ in parts]
    sizes = np.array([t.num_rows for _, t in parts], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    slim = (pa.concat_tables([t for _, t in parts]).combine_chunks() if parts else schemas.SLIM.empty_table())
    n = slim.num_rows
    problem = _fill(slim.column("problem"), 0).astype(np.int64)
    detail = slim.column("detail")
    details = {int(i): detail[int(i)].as_py() for i in np.flatnonzero(np.asarray(detail.is_valid()))}
    rows = np.asarray(slim.column("row"))

    def source_of(i):
        return part_sources[int(np.searchsorted(bounds, i, side="right")) - 1]

    if len(set(part_sources)) < len(part_sources):  # the same file twice in one batch
        owner = np.repeat(np.arange(len(parts)), sizes)
        keys = np.array([f"{part_sources[o]}\0{r}" for o, r in zip(owner, rows)])
        order = np.argsort(keys, kind="stable")
        duplicate = np.zeros(n, dtype=bool)
        duplicate[order[1:]] = keys[order[1:]] == keys[order[:-1]]
        _flag(problem, details, duplicate, "duplicate-row", lambda i: f"row {rows[i]} of {source_of(i)} appears twice")

    rollout_key = slim.column("rollout_key")
    reward = _fill(slim.column("reward"), 0.0).astype(np.float64)
    inp = core_input_from_slim(slim, np.zeros(n, dtype=np.int64), [prompt_group_sizes], problem)
    out = relabel(inp.to(device), config).to("cpu")

    dead_code = out.problem
    live = dead_code == 0
    uniform = out.uniform
    keep = live & ~uniform if drop_uniform_groups else live
    prompt_group = out.prompt_group
    result = pa.table({
        "row": pa.array(rows),
        "raw_reward": pa.array(np.where(problem == 0, reward, np.nan).astype(np.float32)),
        "advantage": pa.array(out.advantage),
        "mainstream": pa.array(out.mainstream),
        "rollout_key": rollout_key,
        "prompt_group": pa.array(prompt_group),
        "rollout_mask_sum": pa.array(out.rollout_mask_sum),
        "uniform": pa.array(uniform),
    }, schema=schemas.RESULT)
    everything_kept = bool(keep.all())
    results = {}
    for k, source in enumerate(part_sources):
        mine = result.slice(bounds[k], sizes[k])
        results[source] = mine if everything_kept else mine.filter(pa.array(keep[bounds[k]:bounds[k + 1]]))

    dead_rows = np.flatnonzero(~live)
    messages = _dead_messages(batch_key, dead_rows, dead_code, problem, details, source_of, rows,
                              prompt_group, reward, rollout_key, config)
    dead = _records(batch_key, [source_of(i) for i in dead_rows], rows[dead_rows],
                    [REASONS[c] for c in dead_code[dead_rows]], messages)
    filtered_rows = np.flatnonzero(live & uniform) if drop_uniform_groups else np.zeros(0, dtype=np.int64)
    filtered = _records(batch_key, [source_of(i) for i in filtered_rows], rows[filtered_rows],
                        ["uniform-group"] * len(filtered_rows),
                        [f"prompt group {prompt_group[i]} of {batch_key}: every reward equals {reward[i]!r}"
                         for i in filtered_rows])
    counters = {
        "rows": n, "rows_dead": int((~live).sum()), "rows_filtered": int(len(filtered_rows)),
        "groups": int(out.groups.sum()), "rollouts": int(out.units.sum()),
        "uniform_groups": int(out.uniform_groups.sum()),
        "group_sizes": np.bincount(np.bincount(prompt_group[live])).tolist() if live.any() else [],
    }
    return BatchResult(results, dead, filtered, counters)


def core_input_from_slim(slim: pa.Table, batch_ids: np.ndarray, prompt_group_sizes: list, problem: np.ndarray):
    """The core's flat arrays (numpy, on the CPU) from slim rows sorted by (batch, row order)."""
    from transforms.core.types import CoreInput

    group_index, rollout_key = slim.column("group_index"), slim.column("rollout_key")
    trainable = np.ascontiguousarray(_fill(slim.column("trainable"), 0), dtype=np.int64)
    return CoreInput(
        batch=np.ascontiguousarray(batch_ids, dtype=np.int64),
        reward=np.ascontiguousarray(_fill(slim.column("reward"), 0.0), dtype=np.float64),
        trainable=trainable,
        mask_sum=trainable,
        group_index=np.ascontiguousarray(_fill(group_index, 0), dtype=np.int64),
        has_group_index=np.ascontiguousarray(_fill(group_index.is_valid(), False), dtype=bool),
        rollout_key=np.ascontiguousarray(_fill(rollout_key, 0), dtype=np.int64),
        has_rollout_key=np.ascontiguousarray(_fill(rollout_key.is_valid(), False), dtype=bool),
        row_problem=np.ascontiguousarray(problem, dtype=np.int64),
        num_batches=len(prompt_group_sizes),
        prompt_group_sizes=[None if s is None else np.asarray(s, dtype=np.int64) for s in prompt_group_sizes],
    )


def _dead_messages(batch_key, dead_rows, dead_code, row_problem, details, source_of, rows, prompt_group,
                   reward, rollout_key, config):
    """A sentence per dead row naming the values involved (dead rows only: rare)."""
    first_bad_in_group = {}
    for i in np.flatnonzero(row_problem != 0):
        first_bad_in_group.setdefault(prompt_group[i], i)
    keys = rollout_key.to_pylist()
    messages = []
    for i in dead_rows:
        reason = REASONS[dead_code[i]]
        where = f"prompt group {prompt_group[i]} of {batch_key}"
        if row_problem[i] != 0 and reason == REASONS[row_problem[i]]:
            messages.append(f"{reason}: {details.get(int(i), reason)} ({where})")
        elif reason in ("partial-group-index", "group-sizes-mismatch", "batch-size-not-multiple",
                        "missing-n-samples-per-prompt"):
            messages.append(f"{reason}: the whole batch {batch_key} is dead-lettered: "
                            + _batch_problem_text(reason, len(rows), config))
        elif reason == "sibling-reward-mismatch":
            siblings = [j for j in np.flatnonzero(prompt_group == prompt_group[i]) if keys[j] == keys[i]]
            messages.append(f"{reason}: rollout {keys[i]} in {where} has rows {[int(rows[j]) for j in siblings]} "
                            f"with rewards {[float(reward[j]) for j in siblings]}; {config.semantics} "
                            "requires one shared reward per rollout")
        elif reason == "non-finite-advantage":
            messages.append(f"{reason}: {where} gives a non-finite advantage under {config.semantics} "
                            f"(a one-row group divided by std + 1e-6 is NaN, as in the original)")
        else:
            j = first_bad_in_group.get(prompt_group[i])
            cause = f"row {rows[j]} of {source_of(j)}: {details.get(int(j), reason)}" if j is not None else reason
            messages.append(f"{reason}: {where} is dead-lettered because {cause}")
    return messages


def _batch_problem_text(reason, n, config):
    if reason == "partial-group-index":
        return "some rows have group_index and some do not; group-index semantics never guesses"
    if reason == "group-sizes-mismatch":
        return f"metadata prompt_group_sizes do not sum to the batch's {n} rows"
    if reason == "batch-size-not-multiple":
        return f"{n} rows without group_index is not a multiple of n_samples_per_prompt={config.n_samples_per_prompt}"
    return "rows have no group_index and --n-samples-per-prompt is not set"


def _records(batch_key, sources, rows, reasons, messages) -> pa.Table:
    return pa.table({
        "source": pa.array(list(sources), pa.string()),
        "row": pa.array(np.asarray(rows, dtype=np.int64)),
        "batch": pa.array([batch_key] * len(reasons), pa.string()),
        "reason": pa.array(reasons, pa.string()),
        "message": pa.array(messages, pa.string()),
        "row_json": pa.nulls(len(reasons), pa.string()),
    }, schema=schemas.DEAD_LETTERS)


def split_by_source(records: pa.Table) -> dict[str, pa.Table]:
    sources = records.column("source").to_numpy(zero_copy_only=False)
    return {str(s): records.filter(pa.array(sources == s)) for s in np.unique(sources)}


def file_dead_letter(source: str, reason: str, message: str) -> pa.Table:
    return pa.table({"source": [source], "row": pa.array([None], pa.int64()), "batch": pa.array([None], pa.string()),
                     "reason": [reason], "message": [message], "row_json": pa.nulls(1, pa.string())},
                    schema=schemas.DEAD_LETTERS)


def with_row_json(records: pa.Table, table: pa.Table) -> pa.Table:
    """Attach each record's input row (every column, as JSON) so that nothing is lost."""
    import json

    positions = records.column("row").to_numpy(zero_copy_only=False).astype(np.int64)
    payload = [json.dumps(row, default=str, ensure_ascii=False) for row in table.take(positions).to_pylist()]
    return records.set_column(records.schema.get_field_index("row_json"), "row_json", pa.array(payload, pa.string()))


# ---------------------------------------------------------------- heavy path: the written table

def training_rows(table: pa.Table, result: pa.Table) -> pa.Table:
    """Input columns kept as they are (loss_mask replaced), training columns added, result rows only."""
    result = result.sort_by("row")
    take = result.column("row")
    if take.length() != table.num_rows:
        table = table.take(take)
    view = _usable_columns(table, "", np.zeros(table.num_rows, dtype=np.int64), {})
    mask = _final_loss_mask(view)
    truncated = (pc.fill_null(pc.equal(view.column("status"), "truncated"), False)
                 if "status" in view.column_names else pa.array(np.zeros(table.num_rows, dtype=bool)))
    added = {
        "raw_reward": result.column("raw_reward"),
        "advantage": result.column("advantage"),
        "mainstream": result.column("mainstream"),
        "rollout_key": result.column("rollout_key"),
        "prompt_group": result.column("prompt_group"),
        "truncated": truncated,
        "loss_mask": mask,
        "rollout_mask_sum": result.column("rollout_mask_sum"),
    }
    columns, names = [], []
    for name in table.column_names:  # in place: loss_mask, and training columns of an earlier relabel
        names.append(name)
        columns.append(added.pop(name) if name in added else table.column(name))
    for name, column in added.items():
        names.append(name)
        columns.append(column)
    return pa.table(columns, names=names)


def _final_loss_mask(table: pa.Table) -> pa.Array:
    """Each row's loss_mask as list<int32>: its own, else ones over its response; zeros when removed."""
    remove = _bool_column(table, "remove_sample")
    if "loss_mask" in table.column_names:
        mask = pc.cast(table.column("loss_mask"), pa.list_(pa.int32())).combine_chunks()
    else:
        mask = pa.nulls(table.num_rows, pa.list_(pa.int32()))
    if mask.null_count:  # list kernels, not a per-token index: 3x faster on 1k-token responses
        mask = pc.if_else(mask.is_valid(), mask, _ones_where_null(table, mask))
    return mask if not remove.any() else _zero_lists(mask, remove)


def _ones_where_null(table: pa.Table, mask: pa.ListArray) -> pa.ListArray:
    """Lists of ones of response_length (0 when absent or negative) at the null masks, empty elsewhere."""
    n = table.num_rows
    length = _int_column(table, "response_length")
    length = np.zeros(n, dtype=np.int64) if length is None else np.maximum(length, 0)
    lengths = np.where(np.asarray(mask.is_valid()), 0, length)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.ones(int(offsets[-1]), dtype=np.int32)))


def _zero_lists(lists: pa.ListArray, rows: np.ndarray) -> pa.ListArray:
    """lists with the lists of the flagged rows set to zeros (same lengths)."""
    offsets = np.asarray(lists.offsets)
    values = np.array(lists.values, dtype=np.int32)  # a copy: the input's buffers stay untouched
    starts, ends = offsets[:-1][rows], offsets[1:][rows]
    lengths = (ends - starts).astype(np.int64)
    positions = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(lengths.sum())
    values[positions] = 0
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
