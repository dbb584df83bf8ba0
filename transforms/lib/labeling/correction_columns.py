"""Rollout correction on Arrow rows: the two logprob streams read into slim columns, and one batch's written
rows corrected (transforms/core/rollout_correction.py does the numbers; docs/off-policy.md says what).

Reading (`read_streams`, called by slim extraction) keeps per row, beside the slim keys, what the batch's
correction needs of the row's tokens, so that both write paths see a whole batch: the pre-correction mask
(`loss_mask` as the training row will carry it: the input mask, `response_length` ones when absent, zeros
when removed); the log ratio log pi_old - log pi_rollout at each trainable token (float64; only those
tokens, in order); and the sums of both streams' logprobs over them (float64). Bad streams are row problems
(unit: the prompt group): the column absent (`missing-column`), a null list or one whose length is not the
mask's (`logprob-length`), a null, NaN or infinite value at a trainable token (`non-finite-logprob`).
Values at untrainable tokens are never read.

Correcting (`correct_rows`, called by label_batch after the core) runs over the rows the batch writes, in
the batch's row order, and gives each its final `loss_mask`, `is_weights` and `rollout_rejected`, and its
rollout's `rollout_mask_sum` recomputed from the final masks.

The per-token work is on the lists' flat value buffers and offsets (zero-copy where Arrow allows), never
through Python objects; a row's values are one contiguous run of the buffer, so per-row sums are
`reduceat`s over the runs (arrays.py's segments).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel import schemas
from rollout_relabel.transforms.core.arrays import NumpyArrays
from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.core.rollout_correction import BLOCK_TOKENS, CorrectionConfig, Layout, correct_trainable
from rollout_relabel.transforms.lib.io.columns import flag, is_number, lookup_path, one_array
from rollout_relabel.transforms.lib.labeling.training_rows import final_loss_mask
from rollout_relabel.transforms.lib.settings import Labeling

MASK, LOG_RATIO = "correction_mask", "correction_log_ratio"
OLD_SUM, ROLLOUT_SUM = "correction_old_sum", "correction_rollout_sum"
SLIM_FIELDS = (pa.field(MASK, pa.list_(pa.int32())), pa.field(LOG_RATIO, pa.list_(pa.float64())),
               pa.field(OLD_SUM, pa.float64()), pa.field(ROLLOUT_SUM, pa.float64()))
_NP = NumpyArrays()


def result_schema(labeling: Labeling) -> pa.Schema:
    """The schema of the labeling's RESULT rows: with the correction's columns when it is on."""
    config = labeling.correction()
    return schemas.RESULT if config is None else schemas.result_schema(config.rollout_is is not None, True)


@dataclass
class _Tokens:
    """A list<int32> mask's flat layout: offsets from 0, each row's length, and which tokens train."""
    offsets: np.ndarray   # int64, n + 1
    lengths: np.ndarray   # int64 per row
    trains: np.ndarray    # bool per token

    @classmethod
    def of(cls, mask: pa.ListArray) -> _Tokens:
        offsets = np.asarray(mask.offsets, dtype=np.int64)
        values = mask.values.slice(offsets[0], offsets[-1] - offsets[0])
        if values.null_count:  # their rows are dead (null-mask-value): they train nothing here
            values = pc.fill_null(values, 0)
        return cls(offsets - offsets[0], np.diff(offsets), np.asarray(values) != 0)

    def binary(self, mask: pa.ListArray) -> bool:
        """Whether every value of the mask is 0 or 1 (a trainable token's value then is 1)."""
        values = mask.values.slice(mask.offsets[0].as_py(), len(self.trains))
        return values.null_count == 0 and (not len(values) or pc.min_max(values).as_py() in (
            {"min": 0, "max": 0}, {"min": 0, "max": 1}, {"min": 1, "max": 1}))

    def trainable_counts(self) -> np.ndarray:
        """Each row's trainable tokens: its length less its untrainable tokens (usually few: no pass over the
        rows' tokens but one to find those)."""
        untrained = np.flatnonzero(~self.trains)
        rows = np.searchsorted(self.offsets, untrained, side="right") - 1
        return self.lengths - np.bincount(rows, minlength=len(self.lengths))

    def trainable(self, values: np.ndarray) -> np.ndarray:
        """values (one per token) at the trainable tokens only."""
        return values if len(self.trains) == len(values) and self.trains.all() else values[self.trains]


def read_streams(table: pa.Table, labeling: Labeling, problem: np.ndarray, details: dict) -> dict[str, pa.Array]:
    """{slim column: per-row values}: the pre-correction mask, the log ratios and the streams' sums, bad rows
    flagged."""
    mask = final_loss_mask(table)
    tokens = _Tokens.of(mask)
    rows = _NP.segments(tokens.trainable_counts())
    old, rollout = (_Stream.read(table, path, what, tokens) for path, what in (
        (labeling.old_logprobs_column, "old logprobs"), (labeling.rollout_logprobs_column, "rollout logprobs")))
    log_ratio = np.empty(rows.total)
    old_flat, rollout_flat = old.flat, rollout.flat
    if old_flat is None or rollout_flat is None:  # every row is flagged
        log_ratio.fill(np.nan)
    else:
        # a run of rows at a time: each run's float64 copies are small (in cache, memory used again)
        for trainable, row_range, part in rows.blocks(BLOCK_TOKENS):
            run = slice(tokens.offsets[row_range.start], tokens.offsets[row_range.stop])
            trains = tokens.trains[run]
            every = trains.all()
            old_values, rollout_values = (np.asarray(flat[run] if every else flat[run][trains], dtype=np.float64)
                                          for flat in (old_flat, rollout_flat))
            old.sums[row_range], rollout.sums[row_range] = part.sum(old_values), part.sum(rollout_values)
            np.subtract(old_values, rollout_values, out=log_ratio[trainable])
    for stream in (old, rollout):
        stream.flag(tokens, rows, problem, details)
    offsets = np.zeros(rows.n + 1, dtype=np.int32)
    np.cumsum(rows.counts, out=offsets[1:])
    return {MASK: mask, LOG_RATIO: pa.ListArray.from_arrays(pa.array(offsets), pa.array(log_ratio)),
            OLD_SUM: pa.array(old.sums), ROLLOUT_SUM: pa.array(rollout.sums)}


@dataclass
class _Stream:
    """One logprob stream of a file, as read: its values at the mask's tokens and what is wrong with it."""
    path: str
    what: str
    flat: np.ndarray | None  # float32 or float64 per mask token (NaN in rows whose list does not line up)
    have: np.ndarray         # each row's list length, -1 for a null list (or an unusable column)
    unusable: tuple | None   # (reason, message) for every row: the column absent or not a list of numbers
    sums: np.ndarray         # float64 per row: the sum over its trainable tokens (NaN until computed)

    @classmethod
    def read(cls, table, path, what, tokens: _Tokens) -> _Stream:
        sums, absent = np.full(table.num_rows, np.nan), np.full(table.num_rows, -1)
        values, why = lookup_path(table, path, what)
        if values is None:
            return cls(path, what, None, absent, (Reason.MISSING_COLUMN, why), sums)
        kind = values.type
        if not ((pa.types.is_list(kind) or pa.types.is_large_list(kind)) and is_number(kind.value_type)):
            return cls(path, what, None, absent, (Reason.ILL_TYPED_COLUMN,
                                                f"{what} {path!r} has type {kind}, not a list of numbers"), sums)
        have = np.where(np.asarray(values.is_valid()), np.asarray(pc.list_value_length(values).fill_null(0)), -1)
        same = have == tokens.lengths
        if same.all():  # every list lines up with its mask: the flat values are the mask's tokens' own
            offsets = np.asarray(values.offsets, dtype=np.int64)
            flat = _floats(values.values.slice(offsets[0], offsets[-1] - offsets[0]))
        elif same.any():  # the rows whose list lines up, at their tokens; NaN at the others' (dead rows)
            flat = np.full(len(tokens.trains), np.nan)
            flat[np.repeat(same, tokens.lengths)] = _floats(values.filter(pa.array(same)).flatten())
        else:
            flat = None
        return cls(path, what, flat, have, None, sums)

    def flag(self, tokens: _Tokens, rows, problem, details) -> None:
        """The stream's row problems, in their order: the column, each list's length, its values."""
        n, what, path = len(problem), self.what, self.path
        if self.unusable is not None:
            reason, message = self.unusable
            flag(problem, details, np.ones(n, dtype=bool), reason, lambda i: message)
            return
        have, lengths = self.have, tokens.lengths
        flag(problem, details, have != lengths, Reason.LOGPROB_LENGTH,
             lambda i: (f"{what} {path!r} is null" if have[i] < 0 else
                        f"{what} {path!r} has {have[i]} values for a loss_mask of {lengths[i]} tokens"))
        # a sum is finite exactly when every value in it is (inf and NaN propagate; float32 values cannot
        # overflow float64, and logprobs come nowhere near float64's range): values counted only for the others
        suspect = ~np.isfinite(self.sums) & (have == lengths)
        if suspect.any() and self.flat is not None:
            bad = rows.sum(~np.isfinite(tokens.trainable(self.flat)), np.int64)
            flag(problem, details, suspect & (bad > 0), Reason.NON_FINITE_LOGPROB,
                 lambda i: f"{what} {path!r} has {bad[i]} null, NaN or infinite values at trainable tokens")


def _floats(values: pa.Array) -> np.ndarray:
    """A flat array of numbers as float32 or float64 numpy (zero-copy when it is one and has no null), NaN at
    nulls."""
    if not (pa.types.is_float32(values.type) or pa.types.is_float64(values.type)):
        values = pc.cast(values, pa.float64())
    if values.null_count:
        values = pc.fill_null(values, np.nan)
    return values.to_numpy(zero_copy_only=False)


@dataclass
class Corrected:
    """One batch's written rows, corrected, in the order they were given."""
    mask: pa.Array                # list<int32>: the final loss_mask
    weights: pa.Array | None      # list<float32>, None without rollout_is
    rejected: np.ndarray          # bool per row
    mask_sum_drop: np.ndarray     # int64 per row: what its rollout's rollout_mask_sum loses
    summary: dict                 # the manifest's entry for the batch


def correct_rows(slim: pa.Table, rollout: np.ndarray, config: CorrectionConfig) -> Corrected:
    """The rows of `slim` (all written, in batch row order), `rollout` (each row's rollout, int64 ids) ->
    their correction."""
    n = slim.num_rows
    mask = one_array(slim.column(MASK))
    tokens = _Tokens.of(mask)
    ratios = one_array(slim.column(LOG_RATIO))
    ratio_offsets = np.asarray(ratios.offsets, dtype=np.int64)
    log_ratio = ratios.values.slice(ratio_offsets[0], ratio_offsets[-1] - ratio_offsets[0]).to_numpy()
    rows = _NP.segments(np.diff(ratio_offsets))
    if rows.total != np.count_nonzero(tokens.trains):  # slim extraction keeps one ratio per trainable token
        raise AssertionError(f"{rows.total} log ratios for {np.count_nonzero(tokens.trains)} trainable tokens")
    old_sum, rollout_sum = (np.asarray(slim.column(name).to_numpy(), dtype=np.float64)
                            for name in (OLD_SUM, ROLLOUT_SUM))
    layout = Layout(_NP, tokens.lengths, tokens.trains)
    result = correct_trainable(rows, log_ratio, old_sum, rollout_sum, config, weights_dtype="float32",
                               layout=layout)
    offsets = mask.offsets if mask.offsets[0].as_py() == 0 else pa.array(tokens.offsets.astype(np.int32))
    if result.keep is None and tokens.binary(mask):
        final = mask  # nothing rejected: the mask as it was (0 and 1)
    else:
        kept = tokens.trains if result.keep is None else result.keep
        final = pa.ListArray.from_arrays(offsets, pa.array(np.asarray(kept, dtype=np.int32)))
    weights = None if result.weights is None else pa.ListArray.from_arrays(offsets, pa.array(result.weights))
    dropped = np.asarray(result.dropped, dtype=np.int64)
    per_rollout = np.bincount(rollout, weights=dropped, minlength=int(rollout.max()) + 1 if n else 0)
    rejected = np.asarray(result.rejected, dtype=bool)
    summary = {"rows": n, "trainable_tokens": rows.total, "rows_rejected": int(rejected.sum()),
               "tokens_rejected": int(dropped.sum()), "metrics": result.metrics}
    return Corrected(final, weights, rejected, per_rollout[rollout].astype(np.int64) if n else dropped, summary)
