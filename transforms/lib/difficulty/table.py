"""The pass-rate table: merged rows (tally_batch.merge) -> the table, a row a key in key order.

A row per prompt (and per run or step under --by), its columns (docs/difficulty.md): prompt_key,
run | step, rollouts, passes, pass_rate, mean_reward, pass_at_k_<k> per --k, runs, first_step,
last_step, prompt, reward_sum_parts. The last two are what adding runs later needs: the prompt kept for
--keep, and the reward sum as exact float64 parts (so a table built run by run equals one built at once).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel.transforms.lib.difficulty import tally_batch
from rollout_relabel.transforms.lib.difficulty.tally import Tally, pass_at_k

# the table's key and kept columns, named where the rows they come from are made
KEY, RUN, STEP = tally_batch.KEY, tally_batch.RUN, tally_batch.STEP
PROMPT, PARTS = tally_batch.PROMPT, tally_batch.PARTS
# columns holding (nearly) a value a row, where a dictionary costs time and gains no space: the key, and
# its prompt (repeated only under --by, or by keys of a --prompt-key that share a prompt)
DISTINCT = (KEY, PROMPT)
NUMBERS = ("rollouts", "passes", "pass_rate", "mean_reward", "runs", "first_step", "last_step")
# the table's own record, in the Parquet file's metadata and each Delta commit's info
RECORD_KEY = "rollout_relabel_difficulty"
TABLE_VERSION = 1


def pass_at_k_column(k: int) -> str:
    return f"pass_at_k_{k}"


def row_of(key: tuple, tally: Tally) -> tuple:
    """A combined key's row as plain values (cheap to move and to collect): the key, then
    (units, passes, reward sum parts, runs, first step, last step, prompt)."""
    return key, (tally.units, tally.passes, tuple(tally.parts()), tally.run_count, tally.first_step,
                 tally.last_step, tally.prompt)


def build(pairs, by: str | None, ks: tuple[int, ...], key_type: pa.DataType | None = None) -> pa.Table:
    """The table of (key, Tally) pairs (one per key), sorted by key; a pair's value may be a Tally or the
    plain values row_of gives."""
    pairs = [row_of(k, t) if isinstance(t, Tally) else (k, t) for k, t in pairs]
    return from_rows([tally_batch.rows_table(pairs, by, key_type)], by, ks)


def from_rows(merged: list[pa.Table], by: str | None, ks: tuple[int, ...]) -> pa.Table:
    """The table of merged rows (tally_batch.ROW columns, each key once in all of them), sorted by key (a
    null step first)."""
    rows = tally_batch.concat(merged) if merged else tally_batch.rows_table([], by)
    order = pc.sort_indices(rows, sort_keys=[(name, "ascending", "at_start") for name in tally_batch.key_columns(by)])
    rows = rows.take(order).combine_chunks()
    units = rows.column("rollouts").to_numpy()
    passes = rows.column("passes").to_numpy()
    columns: dict[str, pa.Array] = {name: rows.column(name) for name in tally_batch.key_columns(by)}
    columns["rollouts"] = rows.column("rollouts")
    columns["passes"] = rows.column("passes")
    columns["pass_rate"] = _per_unit(passes, units)
    # the parts are canonical (tally_batch.merge): their first is the exact sum rounded once
    columns["mean_reward"] = _per_unit(_first_parts(rows.column(PARTS).combine_chunks()), units)
    for k in ks:
        columns[pass_at_k_column(k)] = _pass_at_k(units, passes, k)
    for name in ("runs", "first_step", "last_step", PROMPT, PARTS):
        columns[name] = rows.column(name)
    return pa.table(columns)


def _per_unit(values: np.ndarray, units: np.ndarray) -> pa.Array:
    """values / units in float64 (null where there are no units): the division Python's c / n does, as
    both are exact doubles."""
    out = np.zeros(len(units))
    np.divide(values, units, out=out, where=units != 0)
    return pa.array(out, mask=units == 0)


def _first_parts(parts: pa.ListArray) -> np.ndarray:
    """Each list's first value, 0.0 for an empty or null list."""
    lengths = pc.fill_null(pc.list_value_length(parts), 0).to_numpy()
    values = np.append(parts.values.to_numpy(zero_copy_only=False), 0.0)
    starts = parts.offsets.to_numpy()[:-1]
    return values[np.where(lengths > 0, starts, len(values) - 1)]


def _pass_at_k(units: np.ndarray, passes: np.ndarray, k: int) -> pa.Array:
    """pass_at_k (exact integers, rounded once) for each distinct (n, c) pair, spread to its rows."""
    if not len(units):
        return pa.array([], pa.float64())
    distinct, inverse = np.unique(np.stack([units, passes], axis=1), axis=0, return_inverse=True)
    found = [pass_at_k(n, c, k) for n, c in distinct.tolist()]
    inverse = inverse.reshape(-1)
    values = np.array([0.0 if v is None else v for v in found])[inverse]
    return pa.array(values, mask=np.array([v is None for v in found])[inverse])
