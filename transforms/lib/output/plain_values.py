"""Arrow values as plain Python values that JSON (strict) and torch.load(weights_only=True) both accept.

Two users: a dead letter's `row_json` (the whole input row, kept so that nothing is lost) and
`relabel export`'s dumps (a Parquet row as a sample). Both must work for every Arrow type a
pass-through column may have. pyarrow's to_pylist gives datetime, date, time, timedelta, Decimal
and bytes objects (and refuses nanosecond values without pandas); torch's safe loader refuses all
of these classes but bytes, and JSON has no form for any of them. The rules (docs/bad-input.md):

    timestamp, date, time   ISO text, as Arrow casts them ("2024-05-01 12:00:00.000000001", a zone as "Z")
    duration                its count and unit as text ("1500ms")
    decimal                 its exact decimal text ("12.50")
    dictionary              its values
    float16                 a float
    binary (row_json only)  {"$base64": "<base64 of the bytes>"}; exports keep bytes, which torch loads
    NaN, +-inf (row_json)   the text "NaN", "Infinity", "-Infinity" (strict JSON has no such numbers)

Nested lists, structs and maps are converted inside. Every other type is left as it is.
"""
from __future__ import annotations

import base64
import json
import math

import pyarrow as pa
import pyarrow.compute as pc

BYTES_MARKER = "$base64"
MALFORMED_LINE_MARKER = "$malformed_line"  # row_json of a JSONL line that is not a JSON object: its whole text
NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _needs(kind: pa.DataType, only_nanoseconds: bool) -> bool:
    """Whether arrays of this type need converting (only_nanoseconds: only what to_pylist refuses)."""
    if pa.types.is_dictionary(kind) or pa.types.is_float16(kind):
        return not only_nanoseconds
    if pa.types.is_timestamp(kind) or pa.types.is_time(kind) or pa.types.is_duration(kind):
        return not only_nanoseconds or kind.unit == "ns"
    if pa.types.is_date(kind) or pa.types.is_decimal(kind):
        return not only_nanoseconds
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _needs(kind.value_type, only_nanoseconds)
    if pa.types.is_struct(kind):
        return any(_needs(kind.field(i).type, only_nanoseconds) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _needs(kind.key_type, only_nanoseconds) or _needs(kind.item_type, only_nanoseconds)
    return False


def plain_table(table: pa.Table, only_nanoseconds: bool = False) -> pa.Table:
    """`table` with each column that needs it converted (see the module's rules); others untouched.

    only_nanoseconds: convert only the nanosecond temporal values to_pylist cannot give (row_json keeps
    its earlier text for the rest)."""
    for position, kind in enumerate(table.schema.types):
        if _needs(kind, only_nanoseconds):
            column = table.column(position)
            chunks = [_plain(chunk, only_nanoseconds) for chunk in column.chunks]
            converted = pa.chunked_array(chunks, type=chunks[0].type if chunks else _plain(
                pa.array([], kind), only_nanoseconds).type)
            table = table.set_column(position, table.field(position).name, converted)
    return table


def _plain(array: pa.Array, only_nanoseconds: bool) -> pa.Array:
    kind = array.type
    if not _needs(kind, only_nanoseconds):
        return array
    if pa.types.is_dictionary(kind):
        return _plain(array.dictionary_decode(), only_nanoseconds)
    if pa.types.is_float16(kind):
        return array.cast(pa.float32())
    if pa.types.is_duration(kind):
        return pc.binary_join_element_wise(array.cast(pa.int64()).cast(pa.string()), pa.scalar(kind.unit), "")
    if pa.types.is_timestamp(kind) or pa.types.is_time(kind) or pa.types.is_date(kind) or pa.types.is_decimal(kind):
        return array.cast(pa.string())
    mask = array.is_null() if array.null_count else None
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets, values = _rebased(array)
        build = pa.ListArray if pa.types.is_list(kind) else pa.LargeListArray
        return build.from_arrays(offsets, _plain(values, only_nanoseconds), mask=mask)
    if pa.types.is_fixed_size_list(kind):
        size = kind.list_size
        values = array.values.slice(array.offset * size, len(array) * size)
        return pa.FixedSizeListArray.from_arrays(_plain(values, only_nanoseconds), size, mask=mask)
    if pa.types.is_struct(kind):
        fields = [_plain(array.field(i), only_nanoseconds) for i in range(kind.num_fields)]
        names = [kind.field(i).name for i in range(kind.num_fields)]
        return pa.StructArray.from_arrays(fields, names=names, mask=mask)
    if pa.types.is_map(kind):
        offsets, entries = _rebased(array)
        return pa.MapArray.from_arrays(offsets, _plain(entries.field(0), only_nanoseconds),
                                       _plain(entries.field(1), only_nanoseconds), mask=mask)
    return array


def _rebased(array):
    """A (possibly sliced) list or map array's offsets from 0 and the values they index (a null bitmap
    cannot be combined with sliced offsets)."""
    offsets = array.offsets
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    return pc.subtract(offsets, pa.scalar(start, offsets.type)), array.values.slice(start, end - start)


def strict(value):
    """A to_pylist value as one strict JSON accepts (module rules); other classes as their str(), as before."""
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if math.isfinite(value) else ("NaN" if value != value else NON_FINITE[value])
    if kind in (list, tuple):
        return [strict(v) for v in value]
    if kind is dict:
        return {str(k) if not isinstance(k, str) else k: strict(v) for k, v in value.items()}
    if kind in (bytes, bytearray):
        return {BYTES_MARKER: base64.b64encode(value).decode("ascii")}
    return str(value)


def row_json(row: dict) -> str:
    """One row (a to_pylist dict) as strict JSON text (no NaN, no repr of bytes)."""
    return json.dumps(strict(row), ensure_ascii=False, allow_nan=False)
