"""slime / miles sample dicts (`Sample.to_dict()`) -> an Arrow table, one column per field.

Apart from readers.py (which reads .pt dumps through Beam's FileSystems) so that
the in-memory API (rollout_relabel) converts sample dicts without importing Beam.
"""
from __future__ import annotations

import json

import pyarrow as pa

from transforms.lib.errors import BadFile


def samples_to_table(samples: list[dict], columns=None) -> pa.Table:
    """Sample.to_dict() rows as columns; key order of first appearance.

    Rule for values Arrow cannot type (mixed types in one field, empty dicts,
    objects): the column is stored as JSON text, documented in README.
    """
    names: dict[str, None] = {}
    for sample in samples:
        names.update(dict.fromkeys(sample))
    wanted = [n for n in names if columns is None or n in columns]
    arrays = [_to_arrow([_plain(s.get(name)) for s in samples]) for name in wanted]
    return pa.table(arrays, names=wanted) if wanted else pa.table({}).append_column(
        "_empty", pa.nulls(len(samples))).drop(["_empty"])


def _plain(value):
    if hasattr(value, "tolist") and type(value).__module__.startswith("torch"):
        return value.tolist()
    return value


def _to_arrow(values: list) -> pa.Array:
    try:
        array = pa.array(values)
        if _storable(array.type):
            return array
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, RecursionError):
        pass
    try:
        return pa.array([None if v is None else json.dumps(v, sort_keys=True, default=str) for v in values],
                        pa.string())
    except (RecursionError, ValueError) as error:
        raise BadFile("unreadable-file", f"a value is nested too deeply to store: {error}") from error


MAX_NESTING = 16  # Parquet readers choke on deeper schemas; deeper values are stored as JSON text


def _storable(data_type: pa.DataType, depth: int = 0) -> bool:
    """Parquet can write it: no empty struct, no absurd nesting."""
    if depth > MAX_NESTING:
        return False
    if pa.types.is_struct(data_type):
        return data_type.num_fields > 0 and all(_storable(f.type, depth + 1) for f in data_type)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return _storable(data_type.value_type, depth + 1)
    if pa.types.is_map(data_type):
        return _storable(data_type.key_type, depth + 1) and _storable(data_type.item_type, depth + 1)
    return True
