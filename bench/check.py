"""Equality check of a peer's output against the pipeline's, file by file.

advantage: within 1e-5 (absolute), same nulls. Every other column: identical
values and nulls, the same logical type (large/small offsets, string views and
list field names are representation, not type: they are normalized), the same
column names in the same order, the same number of rows in the same order.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ADVANTAGE_TOLERANCE = 1e-5
SHOW = 5  # mismatching rows shown per column


class Mismatch(AssertionError):
    pass


def normalize_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(normalize_type(t.value_type))
    if pa.types.is_dictionary(t):
        return normalize_type(t.value_type)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, normalize_type(f.type)) for f in t])
    return t


def _normalized(column: pa.ChunkedArray) -> pa.ChunkedArray:
    target = normalize_type(column.type)
    if pa.types.is_dictionary(column.type):
        column = pc.cast(column, column.type.value_type)
    return column if column.type == target else pc.cast(column, target)


def compare_tables(expected: pa.Table, actual: pa.Table, label: str) -> list[str]:
    problems = []
    if expected.column_names != actual.column_names:
        return [f"{label}: columns differ:\n    pipeline {expected.column_names}\n    peer     {actual.column_names}"]
    if expected.num_rows != actual.num_rows:
        return [f"{label}: {expected.num_rows} rows from the pipeline, {actual.num_rows} from the peer"]
    for name in expected.column_names:
        a, b = expected.column(name), actual.column(name)
        ta, tb = normalize_type(a.type), normalize_type(b.type)
        if ta != tb:
            problems.append(f"{label}: column {name!r} has type {a.type} in the pipeline's output, "
                            f"{b.type} in the peer's")
            continue
        a, b = _normalized(a).combine_chunks(), _normalized(b).combine_chunks()
        if name == "advantage":
            av = a.to_numpy(zero_copy_only=False).astype(np.float64)
            bv = b.to_numpy(zero_copy_only=False).astype(np.float64)
            null_a, null_b = np.asarray(a.is_null()), np.asarray(b.is_null())
            bad = (null_a != null_b) | (~null_a & ~(np.abs(av - bv) <= ADVANTAGE_TOLERANCE))
            if bad.any():
                rows = np.flatnonzero(bad)
                shown = ", ".join(f"row {i}: pipeline {float(av[i])!r} peer {float(bv[i])!r}" for i in rows[:SHOW])
                problems.append(f"{label}: advantage differs by more than {ADVANTAGE_TOLERANCE} on "
                                f"{len(rows)} rows ({shown})")
            continue
        if a.equals(b):
            continue
        same = pc.fill_null(pc.equal(a, b), False) if not pa.types.is_list(ta) else None
        if same is None:  # lists: compare row by row (only on mismatch)
            la, lb = a.to_pylist(), b.to_pylist()
            rows = [i for i in range(len(la)) if la[i] != lb[i]]
            shown = ", ".join(f"row {i}: pipeline {la[i]!r} peer {lb[i]!r}" for i in rows[:SHOW])
        else:
            both_null = np.asarray(pc.and_(a.is_null(), b.is_null()))
            rows = np.flatnonzero(~np.asarray(same) & ~both_null).tolist()
            shown = ", ".join(f"row {i}: pipeline {a[i].as_py()!r} peer {b[i].as_py()!r}" for i in rows[:SHOW])
        problems.append(f"{label}: column {name!r} differs on {len(rows)} rows ({shown})")
    return problems


def compare_dirs(pipeline_dir: str, peer_dir: str, peer: str) -> list[str]:
    """Problems found comparing every part-*.parquet of the pipeline's output with the peer's."""
    expected = sorted(f for f in os.listdir(pipeline_dir) if f.startswith("part-") and f.endswith(".parquet"))
    actual = sorted(f for f in os.listdir(peer_dir) if f.startswith("part-") and f.endswith(".parquet"))
    if not expected:
        return [f"the pipeline wrote no part-*.parquet into {pipeline_dir}"]
    if expected != actual:
        missing, extra = sorted(set(expected) - set(actual)), sorted(set(actual) - set(expected))
        return [f"{peer}: output files differ from the pipeline's: missing {missing[:5]}, extra {extra[:5]}"]
    problems = []
    for name in expected:
        problems += compare_tables(pq.read_table(os.path.join(pipeline_dir, name)),
                                   pq.read_table(os.path.join(peer_dir, name)), f"{peer} {name}")
        if len(problems) >= 10:
            break
    return problems
