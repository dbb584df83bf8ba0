"""The optional slim columns an option reads from the input: one registry row each.

A row names the slim column (its schema field, whose name is also the `CoreInput` field it fills:
transforms/core/types.py) and the reader that turns the input's values into float64 with NaN where
unusable; where the labeling reads it is `Labeling.read_columns()`. Slim extraction (slim.py) reads every column whose
path is set, the slim schema gains its field, and the core's input gets the array
(label_batch.core_input_from_slim): an option that reads a column is its field (with its facts), a row here,
and the core's use of it.

Like the baseline, a value read here is not a row problem: which row's value counts is the core's decision
(missing-baseline, missing-version, missing-metric); rows get a detail naming what was wrong, for that
message.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.io.columns import fill, flag, is_number, is_text, lookup_path, note
from rollout_relabel.transforms.lib.settings import Labeling


def baseline_values(table, path, problem, details) -> np.ndarray:
    """float64 [n]: the --baseline-column value, NaN where null, non-numeric or absent.

    Not a row problem: only a unit's mainstream baseline counts, and the core decides which row that
    is (missing-baseline). Rows without a problem get a detail naming the value, for that message.
    """
    n = table.num_rows
    values, why = lookup_path(table, path)
    if values is None:
        numbers = np.full(n, np.nan)
        note(problem, details, np.ones(n, dtype=bool), lambda i: why)
        return numbers
    if is_number(values.type):
        numbers = fill(pc.cast(values, pa.float64(), safe=False), np.nan)  # an integer beyond 2^53: rounded
    else:
        numbers = np.full(n, np.nan)
        kind = values.type
        note(problem, details, np.asarray(values.is_valid()), lambda i: f"baseline {path!r} has type {kind}")
    note(problem, details, np.isnan(numbers), lambda i: f"baseline {path!r} is null, absent or not a number")
    note(problem, details, np.isinf(numbers), lambda i: f"baseline {path!r} is {numbers[i]}")
    return numbers


def version_values(table, path, problem, details) -> np.ndarray:
    """float64 [n]: each row's weight version at --version-column, NaN where unusable. A number, a numeric
    string, or a list of them (slime/miles `weight_versions`: one per turn of the sample), whose smallest
    is the row's version: the oldest weights behind any of its tokens. Like the baseline, not a row
    problem: only a unit's mainstream row counts (the core's missing-version); rows get a detail."""
    n = table.num_rows
    values, why = lookup_path(table, path, "version")
    if values is None:
        note(problem, details, np.ones(n, dtype=bool), lambda i: why)
        return np.full(n, np.nan)
    if isinstance(values, np.ndarray):  # parsed from JSON text
        numbers = values
    else:
        kind = values.type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            flat = as_numbers(values.flatten())
            parents = np.asarray(pc.list_parent_indices(values))
            inexact = beyond_exact(values.flatten())
            if inexact.any():
                flat[inexact] = np.nan
                note(problem, details, np.isin(np.arange(n), parents[inexact]), lambda i: inexact_version(path))
            numbers = np.full(n, np.inf)
            np.minimum.at(numbers, parents, flat)  # NaN (a null or non-number inside) wins: unusable
            numbers[np.isinf(numbers)] = np.nan       # an empty list (or a null one)
            lengths = fill(pc.list_value_length(values), 0)
            note(problem, details, lengths == 0, lambda i: f"version {path!r} is an empty list or null")
        else:
            numbers = as_numbers(values)
            inexact = beyond_exact(values)
            numbers[inexact] = np.nan
            note(problem, details, inexact, lambda i: inexact_version(path))
    note(problem, details, ~np.isfinite(numbers), lambda i: f"version {path!r} is null or not a number")
    return numbers


EXACT_INTEGER = 2 ** 53  # float64, the core's number, holds every integer up to this one exactly


def beyond_exact(values) -> np.ndarray:
    """bool [n]: integers float64 cannot hold exactly (beyond 2^53 either way); False for any other type."""
    if not pa.types.is_integer(values.type):
        return np.zeros(len(values), dtype=bool)
    outside = pc.or_(pc.greater(values, EXACT_INTEGER), pc.less(values, -EXACT_INTEGER))
    return fill(outside, False).astype(bool)


def inexact_version(path) -> str:
    return (f"version {path!r} is an integer beyond 2^53: as the core's float64 it could not be told from its "
            "neighbours, so staleness would be wrong")


def metric_values(table, path, problem, details) -> np.ndarray:
    """float64 [n]: --filter-metric's value (a number, or a boolean as 0/1), NaN where unusable (the core's
    missing-metric, for the units whose metric counts)."""
    n = table.num_rows
    values, why = lookup_path(table, path, "metric")
    if values is None:
        note(problem, details, np.ones(n, dtype=bool), lambda i: why)
        return np.full(n, np.nan)
    numbers = values if isinstance(values, np.ndarray) else as_numbers(values)
    note(problem, details, ~np.isfinite(numbers), lambda i: f"metric {path!r} is null or not a number")
    return numbers


def turn_values(table, path, problem, details) -> np.ndarray:
    """float64 [n]: each row's --turn-column value, an integer (an integral float counts); a null or anything
    else is the row's missing-turn (its group's: no order of its trajectory is defined)."""
    n = table.num_rows
    values, why = lookup_path(table, path, "turn")
    if values is None:
        flag(problem, details, np.ones(n, dtype=bool), Reason.MISSING_COLUMN, lambda i: why)
        return np.full(n, np.nan)
    kind = values.type
    if isinstance(values, np.ndarray) or not (is_number(kind) and not pa.types.is_decimal(kind)):
        numbers = values if isinstance(values, np.ndarray) else np.full(n, np.nan)
        describe = (lambda i: f"turn {path!r} is null or not an integer") if isinstance(values, np.ndarray) else \
            (lambda i: f"turn {path!r} has type {kind}, not integers")
    else:
        numbers = fill(pc.cast(values, pa.float64(), safe=False), np.nan).astype(np.float64)
        describe = lambda i: f"turn {path!r} is null or not an integer"  # noqa: E731
    bad = ~np.isfinite(numbers) | (numbers != np.round(numbers)) | (np.abs(numbers) >= 2.0 ** 53)
    flag(problem, details, bad, Reason.MISSING_TURN, describe)
    return np.where(bad, np.nan, numbers)


def state_values(table, path, problem, details) -> pa.Array:
    """string [n]: each row's --state-column key as text (ROLL compares the keys' text); a null is the row's
    missing-state (ROLL would pool every null as one state)."""
    n = table.num_rows
    values, why = lookup_path(table, path, "state")
    if values is None:
        flag(problem, details, np.ones(n, dtype=bool), Reason.MISSING_COLUMN, lambda i: why)
        return pa.nulls(n, pa.string())
    if isinstance(values, np.ndarray):
        values = pa.array(values)
    try:
        text = pc.cast(values, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # nested keys: their Python text, row by row (rare)
        text = pa.array([None if v is None else str(v) for v in values.to_pylist()], pa.string())
    flag(problem, details, np.asarray(text.is_null()), Reason.MISSING_STATE, lambda i: f"state {path!r} is null")
    return text


def state_ids(column) -> np.ndarray:
    """int64 [n] dense ids of the state keys of one batch (first appearance first): equal text, equal id. A null
    (a dead row's) gets -1."""
    codes = pc.dictionary_encode(column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column).indices
    return fill(pc.cast(codes, pa.int64()), -1).astype(np.int64)


def as_numbers(values) -> np.ndarray:
    """float64 of numbers, booleans (0/1) or numeric strings; NaN for nulls and anything else."""
    kind = values.type
    if is_number(kind) or pa.types.is_boolean(kind):  # an integer beyond 2^53 is rounded (version_values refuses it)
        return fill(pc.cast(values, pa.float64(), safe=False), np.nan).astype(np.float64)
    if is_text(kind):
        out = np.full(len(values), np.nan)
        for i, text in enumerate(values.to_pylist()):  # text versions are rare: a loop over rows is fine
            try:
                out[i] = float(text) if text is not None else np.nan
            except ValueError:
                pass
        return out
    return np.full(len(values), np.nan)


def float_values(column) -> np.ndarray:
    """float64 [n] of a numeric slim column, NaN where null."""
    return np.ascontiguousarray(fill(column, np.nan), dtype=np.float64)


@dataclass(frozen=True)
class SlimColumn:
    """An optional slim column: its field (name = the CoreInput field it fills), its reader, and how a batch's
    slim column becomes the core's array."""
    field: pa.Field
    # (table, path, problem, details) -> float64 [n] with NaN where unusable (or an Arrow array of the field's type)
    read: Callable[[pa.Table, str, np.ndarray, dict], np.ndarray | pa.Array]
    core: Callable[[pa.ChunkedArray], np.ndarray] = float_values

    def path(self, labeling: Labeling) -> str | None:
        """Where the labeling reads this column (Labeling.read_columns), or None when it does not."""
        return labeling.read_columns().get(self.field.name)


SLIM_COLUMNS = (
    # version 2: remax's baseline (--baseline-column)
    SlimColumn(pa.field("baseline", pa.float64()), baseline_values),
    # version 3: the row's weight version (--version-column, read under --max-staleness) and --filter-metric's value
    SlimColumn(pa.field("version", pa.float64()), version_values),
    SlimColumn(pa.field("metric", pa.float64()), metric_values),
    # version 4: the turn-level estimators' turn order (--turn-column) and state key (--state-column); a bad value
    # is a row problem (missing-turn, missing-state)
    SlimColumn(pa.field("turn", pa.float64()), turn_values),
    SlimColumn(pa.field("state", pa.string()), state_values, state_ids),
)
