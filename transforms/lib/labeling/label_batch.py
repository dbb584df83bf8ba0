"""One batch's slim rows through the numeric core: per-source results, dead letters, filtered rows, counters."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel import schemas
from rollout_relabel.transforms.core.advantages import compute_advantages
from rollout_relabel.transforms.core.reasons import CODE, REASONS, Reason
from rollout_relabel.transforms.core.types import CoreInput
from rollout_relabel.transforms.lib.labeling.columns import fill, flag
from rollout_relabel.transforms.lib.labeling.dead_messages import dead_messages
from rollout_relabel.transforms.lib.labeling.settings import Labeling
from rollout_relabel.transforms.lib.output.dead_letters import records
from rollout_relabel.transforms.lib.output.stage_outputs import BatchCounts


@dataclass
class BatchResult:
    results: dict[str, pa.Table]          # source -> RESULT rows that will be written
    dead: pa.Table                        # DEAD_LETTERS rows
    filtered: pa.Table                    # DEAD_LETTERS rows with reason uniform-group
    counters: BatchCounts


def label_batch(batch_key: str, parts: list[tuple[str, pa.Table]], prompt_group_sizes, labeling: Labeling,
                device: str = "cpu") -> BatchResult:
    """One batch, given as (source, slim rows) parts, through the core.

    Row order is (source, row): parts sorted by source, each part's rows in file order.
    """
    config, drop_uniform_groups = labeling.core, labeling.drop_uniform_groups
    parts = sorted(parts, key=lambda part: part[0])
    part_sources = [source for source, _ in parts]
    sizes = np.array([t.num_rows for _, t in parts], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    slim = concat_slim([t for _, t in parts])
    n = slim.num_rows
    problem = fill(slim.column("problem"), 0).astype(np.int64)
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
        flag(problem, details, duplicate, Reason.DUPLICATE_ROW,
             lambda i: f"row {rows[i]} of {source_of(i)} appears twice")

    malformed = problem == CODE[Reason.MALFORMED_LINE]
    positional = prompt_group_sizes is None and slim.column("group_index").null_count == n
    if positional and malformed.any() and not malformed.all():
        return _without_malformed(batch_key, parts, bounds, malformed, problem, details, rows, source_of, labeling,
                                  device)

    keys = dense_keys(slim)
    rollout_key = keys[1]
    reward = fill(slim.column("reward"), 0.0).astype(np.float64)
    inp = core_input_from_slim(slim, np.zeros(n, dtype=np.int64), [prompt_group_sizes], problem, keys)
    out = compute_advantages(inp.to(device), config, drop_uniform_groups).to("cpu")

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
    keys = rollout_key.to_pylist() if len(dead_rows) else []
    baselines = (slim.column("baseline").to_pylist() if len(dead_rows) and "baseline" in slim.column_names
                 else None)
    messages = dead_messages(batch_key, dead_rows, dead_code, problem, details, source_of, rows, prompt_group,
                             reward, keys, config, labeling.baseline_column, out.mainstream, baselines,
                             np.asarray(slim.column("trainable")))
    dead = records(batch_key, [source_of(i) for i in dead_rows], rows[dead_rows],
                    [REASONS[c] for c in dead_code[dead_rows]], messages)
    filtered_rows = np.flatnonzero(live & uniform) if drop_uniform_groups else np.zeros(0, dtype=np.int64)
    filtered = records(batch_key, [source_of(i) for i in filtered_rows], rows[filtered_rows],
                        [Reason.UNIFORM_GROUP] * len(filtered_rows),
                        [f"prompt group {prompt_group[i]} of {batch_key}: every reward equals {reward[i]!r}"
                         for i in filtered_rows])
    counters = BatchCounts(
        batch=batch_key, rows=n, rows_dead=int((~live).sum()), rows_filtered=int(len(filtered_rows)),
        groups=int(out.groups.sum()), rollouts=int(out.units.sum()), uniform_groups=int(out.uniform_groups.sum()),
        group_sizes=np.bincount(np.bincount(prompt_group[live])).tolist() if live.any() else [])
    return BatchResult(results, dead, filtered, counters)


def _without_malformed(batch_key, parts, bounds, malformed, problem, details, rows, source_of, labeling, device):
    """Groups are positional slices (no row has a group_index): a malformed line would shift every slice after
    it, so its row is left out of the batch and dead-lettered alone; its neighbours are labelled as if it were
    not there (as a malformed line in its own prompt group is when groups are keyed)."""
    kept = [(source, table.filter(pa.array(~malformed[bounds[k]:bounds[k + 1]])))
            for k, (source, table) in enumerate(parts)]
    result = label_batch(batch_key, kept, None, labeling, device)
    bad = np.flatnonzero(malformed)
    messages = [f"malformed-line: {details.get(int(i), Reason.MALFORMED_LINE)} (left out of {batch_key})" for i in bad]
    own = records(batch_key, [source_of(i) for i in bad], rows[bad], [Reason.MALFORMED_LINE] * len(bad), messages)
    dead = pa.concat_tables([result.dead, own])
    order = pc.sort_indices(dead, sort_keys=[("source", "ascending"), ("row", "ascending")])
    counters = dataclasses.replace(result.counters, rows=result.counters.rows + len(bad),
                                   rows_dead=result.counters.rows_dead + len(bad))
    return BatchResult(result.results, dead.take(order), result.filtered, counters)


def core_input_from_slim(slim: pa.Table, batch_ids: np.ndarray, prompt_group_sizes: list, problem: np.ndarray,
                         keys: tuple[pa.Array, pa.Array] | None = None):
    """The core's flat arrays (numpy, on the CPU) from slim rows sorted by (batch, row order).

    keys: dense_keys(slim), when the caller has them already."""
    group_index, rollout_key = keys if keys is not None else dense_keys(slim)
    trainable = np.ascontiguousarray(fill(slim.column("trainable"), 0), dtype=np.int64)
    reward_parts = baseline = None
    if "reward_parts" in slim.column_names:
        lists = slim.column("reward_parts").combine_chunks()
        width = len(lists[0]) if len(lists) else 0
        values = lists.flatten().to_numpy(zero_copy_only=False)
        reward_parts = np.ascontiguousarray(np.asarray(values, dtype=np.float64).reshape(len(lists), width).T)
    if "baseline" in slim.column_names:
        baseline = np.ascontiguousarray(fill(slim.column("baseline"), np.nan), dtype=np.float64)
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
        baseline=baseline,
    )


def concat_slim(tables: list[pa.Table]) -> pa.Table:
    """One batch's slim parts as one table; a part without a text key gets nulls there (dense_keys)."""
    if not tables:
        return schemas.SLIM.empty_table()
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
