"""Tallies of many keys as one Arrow table, and the merge of such tables into one row a key.

What TallyDifficulty moves and combines is not one Tally a prompt but tables of them:

- a **tally batch** (BATCH columns) holds partial tallies, a key (prompt, and run or step under --by) any
  number of times: units, passes, the reward sum as exact float64 parts, the run it was counted in
  (`seen_in`, null for rows of a table already written, whose runs are known by number only:
  `runs_elsewhere`), first and last step, and a prompt;
- merge() groups the batches of a bucket by key with one Arrow group-by and gives the **merged rows**
  (ROW columns), each key once: what the table (table.py) is built from.

The merge is the Tally merge (tally.py) done column by column, so it is exact and order-free as well.
Sums of counts are int64 sums. A key's reward sum is one float64 sum where that sum is exact in any order
(every part a multiple of 2**-FINE and their absolute sum below 2**(53 - FINE): 0/1 rewards, partial
credit in halves); the few keys whose parts are finer go through Tally's expansion arithmetic. The merged
parts are canonical (tally.exact_parts), so equal exact sums give equal rows however the work was split.
"""
from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel.transforms.lib.difficulty.tally import FINE, Tally, exact_parts

KEY, RUN, STEP = "prompt_key", "run", "step"
ROLLOUTS, PASSES, PARTS, RUNS = "rollouts", "passes", "reward_sum_parts", "runs"
FIRST, LAST, PROMPT = "first_step", "last_step", "prompt"
SEEN_IN, RUNS_ELSEWHERE = "seen_in", "runs_elsewhere"
PARTS_TYPE = pa.list_(pa.float64())
# a batch's columns after its key columns, and a merged row's
BATCH = ((ROLLOUTS, pa.int64()), (PASSES, pa.int64()), (PARTS, PARTS_TYPE), (SEEN_IN, pa.string()),
         (RUNS_ELSEWHERE, pa.int64()), (FIRST, pa.int64()), (LAST, pa.int64()), (PROMPT, pa.string()))
ROW = ((ROLLOUTS, pa.int64()), (PASSES, pa.int64()), (PARTS, PARTS_TYPE), (RUNS, pa.int64()),
       (FIRST, pa.int64()), (LAST, pa.int64()), (PROMPT, pa.string()))
MIXED_KEYS = "--prompt-key: the runs hold prompt keys of different types (text and integers)"
# enough buckets for a runner to spread the merge over its workers, few enough that each carries many
# prompts; changing it changes no output (the table is sorted by key)
BUCKETS = 16


def key_columns(by: str | None) -> list[str]:
    return [KEY] + ([RUN] if by == "run" else [STEP] if by == "step" else [])


def schema(columns, by: str | None, key_type: pa.DataType = pa.string()) -> pa.Schema:
    extra = [pa.field(RUN, pa.string())] if by == "run" else [pa.field(STEP, pa.int64())] if by == "step" else []
    return pa.schema([pa.field(KEY, key_type), *extra, *(pa.field(name, t) for name, t in columns)])


def make(arrays: dict, by: str | None, columns=BATCH) -> pa.Table:
    """A table of `columns` (BATCH or ROW) from arrays by name; the key keeps its type (text or int64)."""
    key = arrays[KEY]
    return pa.Table.from_arrays([arrays[name] for name in schema(columns, by, key.type).names],
                                schema=schema(columns, by, key.type))


def key_array(values: list) -> pa.Array:
    """Prompt keys as one array: text, or integers as int64."""
    try:
        array = pa.array(values) if values else pa.array([], pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise ValueError(MIXED_KEYS) from None
    if pa.types.is_integer(array.type):
        return array.cast(pa.int64())
    if pa.types.is_null(array.type):
        return array.cast(pa.string())
    return array


def concat(tables: list[pa.Table]) -> pa.Table:
    """One table of tables with the same columns; prompt keys of two types are a ValueError."""
    if len({t.schema.field(KEY).type for t in tables}) > 1:
        raise ValueError(MIXED_KEYS)
    return pa.concat_tables(tables) if len(tables) != 1 else tables[0]


def from_states(pairs: Iterable[tuple[tuple, tuple]], by: str | None) -> pa.Table:
    """A batch of (key, Tally state) pairs (state: Tally(*state)'s arguments). A state counted in several
    named runs gives a row more for each further run, counting nothing else."""
    keys: list[tuple] = []
    rows: list[tuple] = []
    for key, (units, passes, parts, runs, elsewhere, first, last, prompt) in pairs:
        runs = tuple(runs)
        keys.append(key)
        rows.append((units, passes, list(parts), runs[0] if runs else None, elsewhere, first, last, prompt))
        for run in runs[1:]:
            keys.append(key)
            rows.append((0, 0, [], run, 0, None, None, None))
    return make(_columns(keys, rows, by, BATCH), by)


def _columns(keys: list[tuple], rows: list[tuple], by: str | None, columns,
             key_type: pa.DataType | None = None) -> dict:
    """Arrays by name of key tuples and rows of plain values (in the order of `columns`)."""
    key = key_array([k[0] for k in keys])
    arrays = {KEY: key.cast(key_type) if key_type is not None else key}
    if by is not None:
        arrays[RUN if by == "run" else STEP] = pa.array([k[1] for k in keys],
                                                        pa.string() if by == "run" else pa.int64())
    for i, (name, type_) in enumerate(columns):
        arrays[name] = pa.array([row[i] for row in rows], type_)
    return arrays


def states(batch: pa.Table, by: str | None) -> Iterator[tuple[tuple, tuple]]:
    """A batch's rows as (key, Tally state) pairs."""
    for row in _rows(batch, by, BATCH):
        key, (units, passes, parts, seen_in, elsewhere, first, last, prompt) = row
        yield key, (units, passes, tuple(parts or ()), (seen_in,) if seen_in is not None else (), elsewhere,
                    first, last, prompt)


def rows(merged: pa.Table, by: str | None) -> Iterator[tuple[tuple, tuple]]:
    """Merged rows as (key, row) pairs of plain values: row = (units, passes, reward sum parts, runs,
    first step, last step, prompt)."""
    for key, (units, passes, parts, runs, first, last, prompt) in _rows(merged, by, ROW):
        yield key, (units, passes, tuple(parts or ()), runs, first, last, prompt)


def _rows(table: pa.Table, by: str | None, columns) -> Iterator[tuple[tuple, tuple]]:
    keys = [table.column(name).to_pylist() for name in key_columns(by)]
    values = [table.column(name).to_pylist() for name, _ in columns]
    return zip(zip(*keys), zip(*values))


def final_row(state: tuple) -> tuple:
    """A key's merged Tally state as a merged row's plain values, its reward parts canonical."""
    units, passes, parts, runs, runs_elsewhere, first, last, prompt = state
    if len(parts) != 1 or not parts[0]:  # one nonzero part is canonical already (the common case)
        parts = tuple(exact_parts(list(parts)))
    return units, passes, tuple(parts), len(runs) + runs_elsewhere, first, last, prompt


def rows_table(pairs: list[tuple[tuple, tuple]], by: str | None, key_type: pa.DataType | None = None) -> pa.Table:
    """Merged rows from (key, row) pairs of plain values (rows() gives them back); `key_type`: the prompt
    key's (else text or int64, as the keys are)."""
    return make(_columns([k for k, _ in pairs], [row for _, row in pairs], by, ROW, key_type), by, ROW)


def merge(batches: list[pa.Table], by: str | None) -> pa.Table:
    """Batches -> merged rows, each key once (in no particular order)."""
    if not batches:
        return rows_table([], by)
    table = concat(batches)
    keys = key_columns(by)
    heads, fine, magnitude = _reward_heads(table.column(PARTS))
    grouped = (table.select([*keys, ROLLOUTS, PASSES, SEEN_IN, RUNS_ELSEWHERE, FIRST, LAST, PROMPT])
               .append_column("head", pa.array(heads))
               .append_column("magnitude", pa.array(magnitude))
               .append_column("coarse", pa.array(~fine))
               .group_by(keys, use_threads=False)
               .aggregate([(ROLLOUTS, "sum"), (PASSES, "sum"), (SEEN_IN, "count_distinct"),
                           (RUNS_ELSEWHERE, "sum"), (FIRST, "min"), (LAST, "max"), (PROMPT, "min"),
                           ("head", "sum"), ("magnitude", "sum"), ("coarse", "any")]))
    # the keys whose float64 sum is exact: each other key is merged through Tally
    exact = np.logical_and(~np.asarray(grouped.column("coarse_any")),
                           np.asarray(grouped.column("magnitude_sum")) < 2.0 ** (53 - FINE))
    fast = grouped.filter(pa.array(exact)) if not exact.all() else grouped
    sums = np.asarray(fast.column("head_sum"))
    nonzero = sums != 0
    arrays = {name: fast.column(name) for name in keys}
    arrays.update({
        ROLLOUTS: fast.column("rollouts_sum"), PASSES: fast.column("passes_sum"),
        PARTS: pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(nonzero)]), pa.int32()),
                                        pa.array(sums[nonzero])),
        RUNS: pc.add(fast.column("seen_in_count_distinct"), fast.column("runs_elsewhere_sum")),
        FIRST: fast.column("first_step_min"), LAST: fast.column("last_step_max"), PROMPT: fast.column("prompt_min"),
    })
    merged = make(arrays, by, ROW)
    if exact.all():
        return merged
    return concat([merged, _merge_exactly(table, grouped.filter(pa.array(~exact)), by)])


def _reward_heads(parts: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the float64 sum of its parts, whether every part is a multiple of 2**-FINE (so that sum
    is exact while the key's magnitude allows: fine), and the sum of the parts' magnitudes."""
    parts = parts.combine_chunks()
    n = len(parts)
    values = np.asarray(pc.list_flatten(parts))
    row = np.asarray(pc.list_parent_indices(parts))
    scaled = values * float(2 ** FINE)
    fine_value = np.floor(scaled) == scaled  # False for inf and nan too
    fine = np.ones(n, dtype=bool)
    fine[row[~fine_value]] = False
    values = np.where(fine_value, values, 0.0)  # the sums of rows not fine are not used
    return (np.bincount(row, weights=values, minlength=n), fine,
            np.bincount(row, weights=np.abs(values), minlength=n))


def _merge_exactly(table: pa.Table, keys_of: pa.Table, by: str | None) -> pa.Table:
    """The merged rows of the keys in `keys_of` (a few: their rewards need the expansion), through Tally."""
    wanted = set(zip(*(keys_of.column(name).to_pylist() for name in key_columns(by))))
    candidates = table.filter(pc.is_in(table.column(KEY), value_set=keys_of.column(KEY).combine_chunks()))
    merged: dict = {}
    for key, state in states(candidates, by):
        if key not in wanted:
            continue
        seen = merged.get(key)
        if seen is None:
            merged[key] = state
        else:
            if not isinstance(seen, Tally):
                seen = merged[key] = Tally(*seen)
            seen.merge(Tally(*state))
    pairs = [(key, final_row(value.state_args() if isinstance(value, Tally) else value))
             for key, value in merged.items()]
    return rows_table(pairs, by, table.schema.field(KEY).type)


def existing(table: pa.Table, by: str | None) -> pa.Table:
    """A written table's rows as a batch: its runs are known by number only (the record names them)."""
    n = table.num_rows
    key = table.column(KEY).combine_chunks()
    key = key.cast(pa.int64()) if pa.types.is_integer(key.type) else key.cast(pa.string())
    arrays = {KEY: key, SEEN_IN: pa.nulls(n, pa.string()), RUNS_ELSEWHERE: table.column(RUNS)}
    for name, type_ in BATCH:
        if name not in arrays:
            arrays[name] = table.column(name).cast(type_)
    if by is not None:
        extra = RUN if by == "run" else STEP
        arrays[extra] = table.column(extra).cast(pa.string() if by == "run" else pa.int64())
    return make(arrays, by)


def buckets(batch: pa.Table) -> np.ndarray:
    """Each row's bucket: a hash of its prompt key (the same in every process, unlike hash() of text)."""
    return np.fromiter((bucket_of_key(k) for k in batch.column(KEY).to_pylist()), dtype=np.int64,
                       count=batch.num_rows)


def bucket_of_key(prompt_key) -> int:
    return zlib.crc32(str(prompt_key).encode()) % BUCKETS


def split(batch: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """(bucket, its rows) for each bucket the batch has rows in, in bucket order."""
    of = buckets(batch)
    order = np.argsort(of, kind="stable")
    batch, of = batch.take(pa.array(order)), of[order]
    edges = np.flatnonzero(np.diff(of)) + 1
    for start, stop in zip([0, *edges.tolist()], [*edges.tolist(), len(of)]):
        if stop > start:
            yield int(of[start]), batch.slice(start, stop - start)
