"""The interpreted columns of an input table, read as numpy: types checked, nulls filled; a column or a
dotted path into one (`lookup_path`), and the table as --column NAME=SOURCE maps it (`mapped_columns`).

Shared by planning (transforms/lib/io/plan.py), rescoring (transforms/lib/rescoring/rows.py), slim
extraction (transforms/lib/labeling/slim.py) and the written table (transforms/lib/labeling/training_rows.py),
so each reads a column the same way.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel.transforms.core.reasons import CODE, Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.hooks.sample_core import ill_typed_text

INTEGER_COLUMNS = ("step", "group_index", "index", "rollout_id", "response_length")
# Keys: integers, or any value that can be told apart as text (a uid, a task id, the prompt itself)
KEY_COLUMNS = ("group_index", "index", "rollout_id")
TEXT_COLUMNS = ("status", "not_trained")
INT64_MAX = 2 ** 63 - 1


def _is_list(kind) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def usable_columns(table, source, problem, details):
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
        if name in KEY_COLUMNS:
            keys = key_column(column)
            if keys is None:
                flag(problem, details, np.ones(table.num_rows, dtype=bool), Reason.ILL_TYPED_COLUMN,
                     lambda i, name=name, kind=column.type: ill_typed_text(name, kind, "integers or strings"))
                table = table.drop_columns([name])
            elif keys is not column:
                table = table.set_column(table.column_names.index(name), name, keys)
            continue
        if name in INTEGER_COLUMNS and pa.types.is_uint64(column.type) and pc.max(column).as_py() is not None \
                and pc.max(column).as_py() > INT64_MAX:
            # a key beyond int64 cannot be told from others: its group, so its batch, is unknown
            raise BadFile(Reason.VALUE_TOO_LARGE, f"{source}: `{name}` holds {pc.max(column).as_py()}, beyond the "
                                             "int64 range")
        if name in INTEGER_COLUMNS and not pa.types.is_integer(column.type):
            if pa.types.is_floating(column.type) and integral(column):
                table = table.set_column(table.column_names.index(name), name, pc.cast(column, pa.int64()))
                continue
            expected = "integers"
        elif name == "loss_mask" and _is_list(column.type) and pa.types.is_null(column.type.value_type):
            # every mask empty (or all its values null): Arrow infers list<null>; as integers, nulls kept
            kind = pa.large_list(pa.int64()) if pa.types.is_large_list(column.type) else pa.list_(pa.int64())
            table = table.set_column(table.column_names.index(name), name, pc.cast(column, kind))
            continue
        elif name == "loss_mask" and not ((pa.types.is_list(column.type) or pa.types.is_large_list(column.type))
                                          and pa.types.is_integer(column.type.value_type)):
            expected = "a list of integers"
        elif name == "remove_sample" and not pa.types.is_boolean(column.type):
            expected = "booleans"
        elif name in TEXT_COLUMNS and pa.types.is_dictionary(column.type) and is_text(column.type.value_type):
            table = table.set_column(table.column_names.index(name), name, pc.cast(column, pa.string()))
            continue
        elif name in TEXT_COLUMNS and not is_text(column.type):
            expected = "strings"
        if expected:
            if name == "step":
                raise BadFile(Reason.ILL_TYPED_COLUMN, f"{source}: `step` has type {column.type}, expected integers")
            flag(problem, details, np.ones(table.num_rows, dtype=bool), Reason.ILL_TYPED_COLUMN,
                  lambda i, name=name, kind=column.type, expected=expected: ill_typed_text(name, kind, expected))
            table = table.drop_columns([name])
    return table


def key_column(column):
    """A key column as int64 (integers that fit, integral floats) or as strings (anything else that has a
    text form: strings, integers beyond int64, other floats, booleans); None when it has none (lists...)."""
    kind = column.type
    if pa.types.is_dictionary(kind):
        column = pc.cast(column, kind.value_type)
        kind = column.type
    if pa.types.is_integer(kind):
        if pa.types.is_uint64(kind) and (pc.max(column).as_py() or 0) > INT64_MAX:
            return pc.cast(column, pa.string())
        return column
    if pa.types.is_floating(kind) and integral(column):
        return pc.cast(column, pa.int64())
    if is_text(kind):
        return pc.cast(column, pa.string()) if pa.types.is_large_string(kind) else column
    if pa.types.is_floating(kind) or pa.types.is_boolean(kind) or pa.types.is_decimal(kind):
        return pc.cast(column, pa.string())
    return None


def is_text(kind: pa.DataType) -> bool:
    """Whether an Arrow type is text (string or large_string)."""
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def integral(column) -> bool:
    values = pc.drop_null(column).to_numpy(zero_copy_only=False)
    return bool(np.all(np.isfinite(values)) and np.all(values == np.round(values))
                and (values.size == 0 or np.abs(values).max() < 2 ** 53))


def first_null(column) -> int:
    return int(np.flatnonzero(np.asarray(column.is_null()))[0])


def flag(problem, details, where, reason, describe):
    """Record `reason` on rows that have no earlier (higher-priority) problem."""
    fresh = np.flatnonzero(where & (problem == 0))
    problem[fresh] = CODE[reason]
    for i in fresh:  # bad rows only: rare
        details[int(i)] = describe(int(i))


def fill(array, value) -> np.ndarray:
    if array.null_count:
        array = pc.fill_null(array, value)
    return np.asarray(array.to_numpy(zero_copy_only=False))


def int_column(table, name):
    if name not in table.column_names:
        return None
    return fill(pc.cast(table.column(name), pa.int64()), 0).astype(np.int64)


def bool_column(table, name):
    if name not in table.column_names:
        return np.zeros(table.num_rows, dtype=bool)
    return fill(table.column(name), False).astype(bool)


def list_sums(lists) -> np.ndarray:
    """Per-row sums of a list<int> array (null lists sum to 0), added in int64 over the flat values."""
    lists = one_array(lists) if isinstance(lists, pa.ChunkedArray) else lists
    offsets = lists.offsets.to_numpy()  # a sliced array's own (its values array is not sliced)
    if not len(lists):
        return np.zeros(0, dtype=np.int64)
    values = lists.values
    if values.null_count:  # their rows are flagged (null-mask-value); 0 keeps the sums integers
        values = pc.fill_null(values, 0)
    values = values.to_numpy(zero_copy_only=False)[:offsets[-1]]  # a sliced array's values run on
    # reduceat sums each list from its start to the next one's in one call; for an empty list it gives the
    # value at its start instead, zeroed below, and the 0 after the values is what a start at the very end
    # points at
    sums = np.add.reduceat(np.concatenate([values, np.zeros(1, values.dtype)]), offsets[:-1], dtype=np.int64)
    sums[offsets[:-1] == offsets[1:]] = 0
    return np.where(np.asarray(lists.is_valid()), sums, 0) if lists.null_count else sums


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """A column as one array: its only chunk as it is (combine_chunks copies even that), else the chunks
    concatenated."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def lookup_path(table, path, what="baseline"):
    """The values at `path`: a column, or a dotted path into a struct, map or JSON-text column; a number
    steps into a list (`rewards.0`: the first element, null where the list is shorter).

    JSON text (a string column of JSON objects: as a JSONL or Parquet input may hold them, and as the .pt
    reader stores dicts of mixed types) is read as a struct would be: the values at the path keep their
    type (text ids stay text, integers stay integers; json_values says how).

    Returns (Arrow array, None) or (None, why it cannot be read)."""
    if path in table.column_names:
        return one_array(table.column(path)), None
    top, *steps = path.split(".")
    if top not in table.column_names:
        return None, f"the file has no column {top!r} (for {what} {path!r})"
    values = one_array(table.column(top))
    for depth, step in enumerate(steps):
        kind = values.type
        if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and step.isdigit():
            lengths = fill(pc.list_value_length(values), 0)
            short = np.asarray(values.is_null()) | (lengths <= int(step))
            safe = pc.if_else(pa.array(short), pa.scalar(None, kind), values)
            values = pc.list_element(pc.fill_null(safe, pa.scalar([None] * (int(step) + 1), kind)), int(step))
            continue
        if pa.types.is_struct(kind):
            if kind.get_field_index(step) < 0:
                where = ".".join([top] + steps[:depth])
                return None, f"{where} has no field {step!r} (fields: {', '.join(f.name for f in kind)})"
            values = pc.struct_field(values, step)
        elif pa.types.is_map(kind) and is_text(kind.key_type):
            values = pc.map_lookup(values, pa.scalar(step, kind.key_type), "first")
        elif is_text(kind):
            return json_values(values, steps[depth:]), None
        else:
            return None, f"{'.'.join([top] + steps[:depth])} has type {kind}: no field {step!r} in it"
    return values, None


def json_values(texts, steps) -> pa.Array:
    """The values at `steps` inside each row's JSON text (null where the text is not JSON or the path is
    absent), typed as one column: integers as int64 (text when one is beyond int64: kept exact),
    numbers with a fraction as float64, text as text, booleans as booleans; a mix of kinds, as text
    (each value its JSON text: a key tells them apart, a reward of mixed kinds is not numeric). A loop
    over rows, only for JSON text."""
    found = []
    for text in texts.to_pylist():
        try:
            value = json.loads(text) if text is not None else None
        except (ValueError, RecursionError):  # not JSON (plain text), or nested beyond the parser: no value
            value = None
        for step in steps:
            if isinstance(value, dict):
                value = value.get(step)
            elif isinstance(value, list) and step.isdigit():
                value = value[int(step)] if int(step) < len(value) else None
            else:
                value = None
        found.append(value)
    present = [v for v in found if v is not None]
    kinds = {bool if isinstance(v, bool) else int if isinstance(v, int) else float if isinstance(v, float)
             else str if isinstance(v, str) else object for v in present}
    if not present:
        return pa.nulls(len(found), pa.float64())
    if kinds == {int} and all(-INT64_MAX - 1 <= v <= INT64_MAX for v in present):
        return pa.array(found, pa.int64())
    if kinds <= {int, float} and float in kinds:
        return pa.array([None if v is None else float(v) for v in found], pa.float64())
    if kinds == {bool}:
        return pa.array(found, pa.bool_())
    if kinds == {object}:
        try:
            return pa.array(found)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
            pass
    return pa.array([None if v is None else v if isinstance(v, str) else json.dumps(v) for v in found], pa.string())


def mapped_columns(table: pa.Table, columns, problem=None, details=None) -> pa.Table:
    """The table as the interpreted columns see it under --column NAME=SOURCE: NAME holds SOURCE's values
    (a column, or a dotted path into one; the input's own NAME, if any, is not interpreted). A SOURCE the
    file lacks makes every row's NAME missing (missing-column)."""
    if not columns:
        return table
    metadata = table.schema.metadata
    for item in columns:
        name, _, source = item.partition("=")
        values, why = lookup_path(table, source, name)
        if name in table.column_names:
            table = table.drop_columns([name])
        if values is None:
            if problem is not None:
                flag(problem, details, np.ones(table.num_rows, dtype=bool), Reason.MISSING_COLUMN,
                     lambda i, why=why, item=item: f"--column {item}: {why}")
            continue
        table = table.append_column(name, values)
    return table.replace_schema_metadata(metadata)


def mapped_sources(columns) -> tuple[str, ...]:
    """The input columns --column reads (each SOURCE's top-level column)."""
    return tuple(item.partition("=")[2].split(".", 1)[0] for item in columns or ())


def note(problem, details, where, describe):
    """A detail for rows without a problem (and without a detail yet); their problem stays 0."""
    for i in np.flatnonzero(where & (problem == 0)):
        details.setdefault(int(i), describe(int(i)))


def is_number(kind) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
