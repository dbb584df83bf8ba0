"""One batch's slim rows through the numeric core: per-source results, dead letters, filtered rows, counters."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel import schemas
from rollout_relabel.transforms.core.advantages import compute_advantages
from rollout_relabel.transforms.core.reasons import CODE, REASONS, Reason
from rollout_relabel.transforms.core.types import CoreInput
from rollout_relabel.transforms.lib.io.columns import fill, flag
from rollout_relabel.transforms.lib.labeling import correction_columns
from rollout_relabel.transforms.lib.labeling.dead_messages import BatchRows, EstimatorRows, dead_messages
from rollout_relabel.transforms.lib.labeling.slim_columns import SLIM_COLUMNS
from rollout_relabel.transforms.lib.output.dead_letters import records
from rollout_relabel.transforms.lib.output.stage_outputs import BatchCounts
from rollout_relabel.transforms.lib.settings import Labeling


@dataclass
class BatchResult:
    results: dict[str, pa.Table]          # source -> RESULT rows that will be written
    dead: pa.Table                        # DEAD_LETTERS rows
    filtered: pa.Table                    # DEAD_LETTERS rows with a filter reason (not-trained, stale, metric-band,
                                          # uniform-group)
    counters: BatchCounts


@dataclass
class _Rows:
    """A batch's slim rows in (source, row) order, with what the reading found per row (problem codes and
    details, which the labelling adds to)."""
    key: str
    parts: list[tuple[str, pa.Table]]  # (source, slim rows), sorted by source
    sizes: np.ndarray                  # rows per part
    bounds: np.ndarray                 # part k holds rows bounds[k]:bounds[k + 1]
    slim: pa.Table
    rows: np.ndarray                   # each row's number in its file
    problem: np.ndarray                # reason code per row (0: none)
    details: dict                      # row position -> what the reading found

    @classmethod
    def of(cls, batch_key: str, parts: list[tuple[str, pa.Table]]) -> _Rows:
        parts = sorted(parts, key=lambda part: part[0])
        sizes = np.array([t.num_rows for _, t in parts], dtype=np.int64)
        slim = concat_slim([t for _, t in parts])
        detail = slim.column("detail")
        details = {int(i): detail[int(i)].as_py() for i in np.flatnonzero(np.asarray(detail.is_valid()))}
        return cls(batch_key, parts, sizes, np.concatenate([[0], np.cumsum(sizes)]), slim,
                   np.asarray(slim.column("row")), fill(slim.column("problem"), 0).astype(np.int64), details)

    @property
    def sources(self) -> list[str]:
        return [source for source, _ in self.parts]

    def source_of(self, i) -> str:
        return self.parts[int(np.searchsorted(self.bounds, i, side="right")) - 1][0]


def label_batch(batch_key: str, parts: list[tuple[str, pa.Table]], prompt_group_sizes, labeling: Labeling,
                device: str = "cpu") -> BatchResult:
    """One batch, given as (source, slim rows) parts, through the core.

    Row order is (source, row): parts sorted by source, each part's rows in file order.
    """
    batch = _Rows.of(batch_key, parts)
    if schemas.SLIM_NOT_TRAINED.name in batch.slim.column_names:
        return _without_not_trained(batch, prompt_group_sizes, labeling, device)
    _flag_duplicate_rows(batch)
    if not labeling.reads_turns and "null_reward" in batch.slim.column_names:
        # read for a turn-level labeling (relabel compare's other side): a null reward is a problem here
        null = fill(batch.slim.column("null_reward"), False).astype(bool)
        flag(batch.problem, batch.details, null, Reason.NON_NUMERIC_REWARD, lambda i: "reward is null")
    n = batch.slim.num_rows
    malformed = batch.problem == CODE[Reason.MALFORMED_LINE]
    positional = prompt_group_sizes is None and batch.slim.column("group_index").null_count == n
    if positional and malformed.any() and not malformed.all():
        return _without_malformed(batch, malformed, labeling, device)

    keys = dense_keys(batch.slim)
    reward = fill(batch.slim.column("reward"), 0.0).astype(np.float64)
    inp = core_input_from_slim(batch.slim, np.zeros(n, dtype=np.int64), [prompt_group_sizes], batch.problem, keys)
    out = compute_advantages(inp.to(device), labeling.core, labeling.drop_uniform_groups).to("cpu")
    filtered_rows = np.flatnonzero(out.filtered != 0) if labeling.filters_rows else np.zeros(0, dtype=np.int64)
    corrected = _correction(batch, out, keys[1], labeling)
    counts = _counts(batch, out, len(filtered_rows))
    if corrected is not None:
        counts = dataclasses.replace(counts, correction=corrected.summary)
    return BatchResult(_results(batch, out, reward, keys[1], corrected),
                       _dead_records(batch, out, reward, keys[1], labeling),
                       _filtered_records(batch, out, reward, filtered_rows, labeling),
                       counts)


def _written(out) -> np.ndarray:
    """Which rows are written as training rows: live, and not filtered."""
    return (out.problem == 0) & (out.filtered == 0)


def _correction(batch: _Rows, out, rollout_key: pa.Array, labeling: Labeling):
    """Rollout correction over the rows the batch writes (after grouping, advantages, filters and dead
    letters, on their pre-correction masks), in the batch's row order; None when it is off."""
    config = labeling.correction()
    if config is None:
        return None
    written = np.flatnonzero(_written(out))
    # each written row's rollout, as the core counts rollout_mask_sum: a key inside its prompt group, a keyless
    # row alone
    has_key = np.asarray(rollout_key.is_valid())[written]
    key = np.where(has_key, fill(rollout_key, 0)[written], written)
    pairs = np.stack([out.prompt_group[written], has_key.astype(np.int64), key], axis=1)
    rollout = (np.unique(pairs, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64) if len(written)
               else np.zeros(0, dtype=np.int64))
    rows = batch.slim if len(written) == batch.slim.num_rows else batch.slim.take(pa.array(written))
    return correction_columns.correct_rows(rows, rollout, config)


def _flag_duplicate_rows(batch: _Rows) -> None:
    """The same file twice in one batch: each row after its first appearance is a duplicate-row."""
    sources = batch.sources
    if len(set(sources)) == len(sources):
        return
    owner = np.repeat(np.arange(len(sources)), batch.sizes)
    keys = np.array([f"{sources[o]}\0{r}" for o, r in zip(owner, batch.rows)])
    order = np.argsort(keys, kind="stable")
    duplicate = np.zeros(len(keys), dtype=bool)
    duplicate[order[1:]] = keys[order[1:]] == keys[order[:-1]]
    flag(batch.problem, batch.details, duplicate, Reason.DUPLICATE_ROW,
         lambda i: f"row {batch.rows[i]} of {batch.source_of(i)} appears twice")


def _results(batch: _Rows, out, reward: np.ndarray, rollout_key: pa.Array,
             corrected: correction_columns.Corrected | None) -> dict[str, pa.Table]:
    """source -> its RESULT rows that will be written (live rows, less the filtered ones); with rollout
    correction, their final masks, weights and rejection flags beside them."""
    keep = _written(out)
    if corrected is not None:
        return _corrected_results(batch, out, reward, rollout_key, keep, corrected)
    result = pa.table({
        "row": pa.array(batch.rows),
        "raw_reward": pa.array(np.where(batch.problem == 0, reward, np.nan).astype(np.float32)),
        "advantage": pa.array(out.advantage),
        "mainstream": pa.array(out.mainstream),
        "rollout_key": rollout_key,
        "prompt_group": pa.array(out.prompt_group),
        "rollout_mask_sum": pa.array(out.rollout_mask_sum),
        "uniform": pa.array(out.uniform),
        "loss_weight": (pa.nulls(len(batch.rows), pa.float32()) if out.loss_weight is None
                        else pa.array(out.loss_weight)),
    }, schema=schemas.RESULT)
    everything_kept = bool(keep.all())
    results = {}
    for k, source in enumerate(batch.sources):
        mine = result.slice(batch.bounds[k], batch.sizes[k])
        results[source] = mine if everything_kept else mine.filter(pa.array(keep[batch.bounds[k]:batch.bounds[k + 1]]))
    return results


def _corrected_results(batch: _Rows, out, reward, rollout_key, keep, corrected) -> dict[str, pa.Table]:
    written = np.flatnonzero(keep)
    mask_sum = np.asarray(out.rollout_mask_sum)[written] - corrected.mask_sum_drop
    columns = {
        "row": pa.array(batch.rows[written]),
        "raw_reward": pa.array(np.asarray(reward[written], dtype=np.float32)),
        "advantage": pa.array(np.asarray(out.advantage)[written]),
        "mainstream": pa.array(np.asarray(out.mainstream)[written]),
        "rollout_key": rollout_key.take(pa.array(written)),
        "prompt_group": pa.array(np.asarray(out.prompt_group)[written]),
        "rollout_mask_sum": pa.array(mask_sum.astype(np.int64)),
        "uniform": pa.array(np.asarray(out.uniform)[written]),
        "loss_weight": (pa.nulls(len(written), pa.float32()) if out.loss_weight is None
                        else pa.array(np.asarray(out.loss_weight)[written])),
        "loss_mask": corrected.mask,
        "rollout_rejected": pa.array(corrected.rejected),
    }
    if corrected.weights is not None:
        columns["is_weights"] = corrected.weights
    result = pa.table(columns, schema=schemas.result_schema(corrected.weights is not None, True))
    ends = np.searchsorted(written, batch.bounds)  # part k's written rows: ends[k]:ends[k + 1]
    return {source: result.slice(ends[k], ends[k + 1] - ends[k]) for k, source in enumerate(batch.sources)}


def _dead_records(batch: _Rows, out, reward: np.ndarray, rollout_key: pa.Array, labeling: Labeling) -> pa.Table:
    """The dead rows' DEAD_LETTERS records, each with the sentence naming its values."""
    dead_rows = np.flatnonzero(out.problem != 0)
    if not len(dead_rows):
        return _no_records()
    slim = batch.slim
    keys = rollout_key.to_pylist()
    baselines = slim.column("baseline").to_pylist() if "baseline" in slim.column_names else None
    rows = BatchRows(batch.key, batch.rows, batch.source_of, out.prompt_group, reward, keys, batch.problem,
                     batch.details)
    turns = slim.column("turn").to_pylist() if "turn" in slim.column_names else None
    estimator = EstimatorRows(labeling.baseline_column, out.mainstream, baselines, np.asarray(slim.column("trainable")),
                              turns)
    messages = dead_messages(dead_rows, out.problem, rows, labeling.core, estimator)
    return records(batch.key, [batch.source_of(i) for i in dead_rows], batch.rows[dead_rows],
                   [REASONS[c] for c in out.problem[dead_rows]], messages)


def _filtered_records(batch: _Rows, out, reward: np.ndarray, filtered_rows: np.ndarray, labeling: Labeling
                      ) -> pa.Table:
    """The filtered rows (stale, metric-band, uniform-group), as records."""
    if not len(filtered_rows):
        return _no_records()
    return records(batch.key, [batch.source_of(i) for i in filtered_rows], batch.rows[filtered_rows],
                   [REASONS[c] for c in out.filtered[filtered_rows]],
                   filter_messages(batch.key, filtered_rows, out.filtered, out.prompt_group, reward, batch.slim,
                                   labeling.core, labeling.filter_metric))


@functools.cache
def _no_records() -> pa.Table:
    """No records: what most batches have, dead or filtered, built once (Arrow tables are immutable)."""
    return records("", [], np.zeros(0, dtype=np.int64), [], [])


def _counts(batch: _Rows, out, rows_filtered: int) -> BatchCounts:
    live = out.problem == 0
    return BatchCounts(
        batch=batch.key, rows=batch.slim.num_rows, rows_dead=int((~live).sum()), rows_filtered=int(rows_filtered),
        groups=int(out.groups.sum()), rollouts=int(out.units.sum()), uniform_groups=int(out.uniform_groups.sum()),
        group_sizes=np.bincount(np.bincount(out.prompt_group[live])).tolist() if live.any() else [],
        null_step_rewards=(int(pc.sum(batch.slim.column("null_reward")).as_py() or 0)
                           if "null_reward" in batch.slim.column_names else 0))


def filter_messages(batch_key, filtered_rows, filter_code, prompt_group, reward, slim, config,
                    metric_column) -> list[str]:
    """A sentence per filtered row, naming the values that decided it."""
    if not len(filtered_rows):
        return []
    versions = slim.column("version").to_pylist() if "version" in slim.column_names else None
    metrics = slim.column("metric").to_pylist() if "metric" in slim.column_names else None
    messages = []
    for i in filtered_rows:
        where = f"prompt group {prompt_group[i]} of {batch_key}"
        reason = REASONS[filter_code[i]]
        if reason == Reason.STALE:
            current = (f"--current-version {config.current_version}" if config.current_version is not None
                       else "the batch's newest version")
            messages.append(f"row version {versions[i] if versions else None} is more than --max-staleness "
                            f"{config.max_staleness} behind {current} ({where}; --stale-rows {config.stale_rows})")
        elif reason == Reason.METRIC_BAND:
            what = f"mean {metric_column}" if metric_column is not None else "mean unit reward"
            value = f" (this row: {metrics[i]!r})" if metrics is not None else ""
            messages.append(f"{where}: its {what} lies outside --keep-band {config.keep_band}{value}")
        elif config.uniform_tolerance:
            messages.append(f"{where}: its unit rewards differ by at most --uniform-tolerance "
                            f"{config.uniform_tolerance!r} (this row: {reward[i]!r})")
        else:
            messages.append(f"{where}: every reward equals {reward[i]!r}")
    return messages


def _without_malformed(batch: _Rows, malformed: np.ndarray, labeling: Labeling, device) -> BatchResult:
    """Groups are positional slices (no row has a group_index): a malformed line would shift every slice after
    it, so its row is left out of the batch and dead-lettered alone; its neighbours are labelled as if it were
    not there (as a malformed line in its own prompt group is when groups are keyed)."""
    bounds = batch.bounds
    kept = [(source, table.filter(pa.array(~malformed[bounds[k]:bounds[k + 1]])))
            for k, (source, table) in enumerate(batch.parts)]
    result = label_batch(batch.key, kept, None, labeling, device)
    bad = np.flatnonzero(malformed)
    messages = [f"malformed-line: {batch.details.get(int(i), Reason.MALFORMED_LINE)} (left out of {batch.key})"
                for i in bad]
    own = records(batch.key, [batch.source_of(i) for i in bad], batch.rows[bad], [Reason.MALFORMED_LINE] * len(bad),
                  messages)
    dead = pa.concat_tables([result.dead, own])
    order = pc.sort_indices(dead, sort_keys=[("source", "ascending"), ("row", "ascending")])
    counters = dataclasses.replace(result.counters, rows=result.counters.rows + len(bad),
                                   rows_dead=result.counters.rows_dead + len(bad))
    return BatchResult(result.results, dead.take(order), result.filtered, counters)


def _without_not_trained(batch: _Rows, prompt_group_sizes, labeling: Labeling, device) -> BatchResult:
    """Rows their framework wrote but never trained on (a preset's reader says why in `not_trained`: a padding
    row, an errored trace) leave the batch before anything is grouped or checked: they are no rollout of any
    prompt group, so neither their rewards nor their problems reach a group; each is a filtered row."""
    name = schemas.SLIM_NOT_TRAINED.name
    why = batch.slim.column(name)
    out = np.asarray(why.is_valid())
    bounds = batch.bounds
    # a part whose rows all trained has no such column (extract_slim writes none): only the batch has it
    kept = [(source, table.filter(pa.array(~out[bounds[k]:bounds[k + 1]])).drop_columns(
        [c for c in (name,) if c in table.column_names])) for k, (source, table) in enumerate(batch.parts)]
    result = label_batch(batch.key, kept, prompt_group_sizes, labeling, device)
    gone = np.flatnonzero(out)
    if not len(gone):
        return result
    texts = why.take(pa.array(gone)).to_pylist()
    own = records(batch.key, [batch.source_of(i) for i in gone], batch.rows[gone], [Reason.NOT_TRAINED] * len(gone),
                  [f"{batch.key}: the framework never trained on this row ({text})" for text in texts])
    filtered = pa.concat_tables([result.filtered, own])
    order = pc.sort_indices(filtered, sort_keys=[("source", "ascending"), ("row", "ascending")])
    counters = dataclasses.replace(result.counters, rows=result.counters.rows + len(gone),
                                   rows_filtered=result.counters.rows_filtered + len(gone))
    return BatchResult(result.results, result.dead, filtered.take(order), counters)


def core_input_from_slim(slim: pa.Table, batch_ids: np.ndarray, prompt_group_sizes: list, problem: np.ndarray,
                         keys: tuple[pa.Array, pa.Array] | None = None):
    """The core's flat arrays (numpy, on the CPU) from slim rows sorted by (batch, row order).

    keys: dense_keys(slim), when the caller has them already."""
    group_index, rollout_key = keys if keys is not None else dense_keys(slim)
    trainable = np.ascontiguousarray(fill(slim.column("trainable"), 0), dtype=np.int64)
    reward_parts = None
    if "reward_parts" in slim.column_names:
        lists = slim.column("reward_parts").combine_chunks()
        width = len(lists[0]) if len(lists) else 0
        values = lists.flatten().to_numpy(zero_copy_only=False)
        reward_parts = np.ascontiguousarray(np.asarray(values, dtype=np.float64).reshape(len(lists), width).T)
    # each column an option reads (slim_columns.py) fills the CoreInput field of its name; NaN where unusable
    read = {column.field.name: column.core(slim.column(column.field.name))
            for column in SLIM_COLUMNS if column.field.name in slim.column_names}
    return CoreInput(
        batch=np.ascontiguousarray(batch_ids, dtype=np.int64),
        reward=np.ascontiguousarray(fill(slim.column("reward"), 0.0), dtype=np.float64),
        trainable=trainable,
        mask_sum=trainable,
        group_index=np.ascontiguousarray(fill(group_index, 0), dtype=np.int64),
        has_group_index=np.ascontiguousarray(fill(group_index.is_valid(), False), dtype=bool),
        rollout_key=np.ascontiguousarray(fill(rollout_key, 0), dtype=np.int64),
        has_rollout_key=np.ascontiguousarray(fill(rollout_key.is_valid(), False), dtype=bool),
        row_problem=np.ascontiguousarray(problem, dtype=np.int64),
        num_batches=len(prompt_group_sizes),
        prompt_group_sizes=[None if s is None else np.asarray(s, dtype=np.int64) for s in prompt_group_sizes],
        reward_parts=reward_parts,
        **read,
    )


def concat_slim(tables: list[pa.Table]) -> pa.Table:
    """One batch's slim parts as one table; a part without a text key gets nulls there (dense_keys)."""
    if not tables:
        return schemas.SLIM.empty_table()
    if len(tables) == 1 and all(column.num_chunks == 1 for column in tables[0].columns):
        return tables[0]  # the usual batch, one file's part: already one chunk a column (combining copies)
    return pa.concat_tables(tables, promote_options="permissive").combine_chunks()


def dense_keys(slim: pa.Table) -> tuple[pa.Array, pa.Array]:
    """(group_index, rollout_key) as int64: integer keys as they are; when any part holds a key as text,
    every key of that column is compared as text (an integer as its decimal digits) and coded 0, 1, ...
    by first appearance in row order, so the prompt groups and rollouts do not depend on the key's type."""
    return (_dense(slim, "group_index", "group_text"), _dense(slim, "rollout_key", "rollout_text"))


def _dense(slim: pa.Table, name: str, text_name: str) -> pa.Array:
    keys = slim.column(name).combine_chunks()
    if text_name not in slim.column_names:
        return keys
    text = slim.column(text_name).combine_chunks()
    if text.null_count:  # parts whose key was an integer
        text = pc.if_else(text.is_valid(), text, pc.cast(keys, pa.string()))
    codes = pc.index_in(text, pc.unique(pc.drop_null(text)))  # unique keeps first-appearance order
    return pc.cast(codes, pa.int64())
