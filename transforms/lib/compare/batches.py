"""Two labelings of the same batch, compared row by row: pure functions, no Beam.

compare_batch:  one batch's slim rows -> its counts, its differing groups, a sample of (a, b) points
summarize:      every batch's results -> the report dict that report.json holds

Definitions (README, "Comparing semantics"):
- compared rows: rows written (neither dead-lettered nor filtered) under both labelings;
- zero: |x| <= ZERO_TOL;
- agree: |a - b| <= AGREE_ABS + AGREE_REL * |b|;
- wrong sign: both non-zero and sign(a) != sign(b);
- groups are B's prompt groups; a group differs when one of its rows does not agree or is not
  written under A.
- a stored side (`--a column:NAME`, Side.stored_column): A's advantage is the value the input stores at
  NAME, not computed; a row whose stored value is null or absent is dead under A (STORED_MISSING), one
  whose value is NaN or infinite too (STORED_NON_FINITE). A's groups are then B's groups with a row live
  under A, uniform when all of those rows are zero.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel import schemas
from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.labeling.label_batch import BatchResult, concat_slim, dense_keys, label_batch
from rollout_relabel.transforms.lib.output.dead_letters import split_by_source
from rollout_relabel.transforms.lib.settings import Side

ZERO_TOL = 1e-6
AGREE_ABS = 1e-6
AGREE_REL = 1e-5
SAMPLE_POINTS = 2000   # (a, b) points kept for the scatter, whatever the run's size
LISTED_GROUPS = 100    # differing groups listed by name, largest |a - b| first

LIVE, DEAD, FILTERED = 0, 1, 2
STORED_MISSING = "stored-advantage-missing"
STORED_NON_FINITE = "stored-advantage-non-finite"
COUNTS = ("rows", "compared", "dead_a", "dead_b", "filtered_a", "filtered_b", "dead_both", "agree", "wrong_sign",
          "zero_to_nonzero", "nonzero_to_zero", "nonzero_a", "nonzero_b", "groups_a", "groups_b", "groups_differing",
          "uniform_groups_a", "uniform_groups_b")


@dataclass
class BatchComparison:
    counts: dict                                 # counts of the batch (COUNTS and more), JSON-able
    groups: list[dict] = field(default_factory=list)
    points: list[tuple] = field(default_factory=list)  # (sample key, file name, row, a, b)


def batch_label(batch_key: str, names: dict[str, str]) -> tuple[int | None, str]:
    """(step, label): `step=N` -> (N, "N"); a file batch -> (None, the file's name relative to its root)."""
    kind, _, value = batch_key.partition("=")
    if kind == "step":
        return int(value), value
    return None, names.get(value, value)


def compare_batch(batch_key: str, parts: list[tuple[str, pa.Table]], prompt_group_sizes, a: Side, b: Side,
                  names: dict[str, str], device: str = "cpu", parts_a: list | None = None) -> BatchComparison:
    """Label one batch twice (the pipeline's own label_batch) and compare row by row; a stored side A
    (a.stored_column) is read from the slim rows' `stored_advantage` instead of being labelled.

    names maps each source path to its name relative to its --input root: labels and the
    sample do not depend on where the run is stored. parts_a: A's own slim rows of the same batch, when A's
    rewards are not B's (a verifier per side, docs/rescoring.md); the record then counts reward agreement.
    """
    step, label = batch_label(batch_key, names)
    parts = sorted(parts, key=lambda part: part[0])
    rescored = parts_a is not None
    parts_a = parts if parts_a is None else sorted(parts_a, key=lambda part: part[0])
    side_b = label_batch(batch_key, parts, prompt_group_sizes, b.labeling, device)
    adv_b, state_b, group_b = _aligned(side_b, parts)
    slim = concat_slim([t for _, t in parts]) if parts else None
    if a.stored_column is None:
        side_a = label_batch(batch_key, parts_a, prompt_group_sizes, a.labeling, device)
        adv_a, state_a, _ = _aligned(side_a, parts)
        dead_a_by_reason, filtered_a_by_reason = _reasons(side_a.dead), _reasons(side_a.filtered)
        groups_a, uniform_groups_a = side_a.counters.groups, side_a.counters.uniform_groups
    else:
        adv_a, state_a, dead_a_by_reason, filtered_a_by_reason = _stored(slim, len(adv_b))
        groups_a, uniform_groups_a = _stored_groups(adv_a, state_a, group_b)
    n = len(adv_a)
    file_rows = np.concatenate([np.asarray(t.column("row")) for _, t in parts]) if parts else np.zeros(0, np.int64)
    file_names = np.repeat(np.array([names.get(s, s) for s, _ in parts], dtype=object),
                           [t.num_rows for _, t in parts])

    compared = (state_a == LIVE) & (state_b == LIVE)
    delta = np.abs(adv_a - adv_b)
    agree = compared & (delta <= AGREE_ABS + AGREE_REL * np.abs(adv_b))
    zero_a, zero_b = np.abs(adv_a) <= ZERO_TOL, np.abs(adv_b) <= ZERO_TOL
    wrong_sign = compared & ~zero_a & ~zero_b & (np.sign(adv_a) != np.sign(adv_b))
    differs = (state_b == LIVE) & ~agree  # rows of B's groups that A did not label the same

    counts: dict[str, object] = {  # JSON-able
        "batch": batch_key, "step": step, "label": label,
        "rows": n, "compared": int(compared.sum()),
        "dead_a": int((state_a == DEAD).sum()), "dead_b": int((state_b == DEAD).sum()),
        "dead_both": int(((state_a == DEAD) & (state_b == DEAD)).sum()),
        "filtered_a": int((state_a == FILTERED).sum()), "filtered_b": int((state_b == FILTERED).sum()),
        "dead_a_by_reason": dead_a_by_reason, "dead_b_by_reason": _reasons(side_b.dead),
        "filtered_a_by_reason": filtered_a_by_reason,
        "filtered_b_by_reason": _reasons(side_b.filtered),
        "agree": int(agree.sum()), "wrong_sign": int(wrong_sign.sum()),
        "zero_to_nonzero": int((compared & zero_a & ~zero_b).sum()),
        "nonzero_to_zero": int((compared & ~zero_a & zero_b).sum()),
        "nonzero_a": int((compared & ~zero_a).sum()), "nonzero_b": int((compared & ~zero_b).sum()),
        "sum_abs_delta": float(delta[compared].sum()) if compared.any() else 0.0,
        "max_abs_delta": float(delta[compared].max()) if compared.any() else 0.0,
        "groups_a": groups_a, "groups_b": side_b.counters.groups,
        "uniform_groups_a": uniform_groups_a, "uniform_groups_b": side_b.counters.uniform_groups,
    }
    groups, counts["groups_differing"], counts["group_sizes"] = _groups(
        slim, group_b, differs, wrong_sign, delta, compared, state_a, file_names, file_rows, label)
    points = _sample(compared, file_names, file_rows, adv_a, adv_b)
    if a.labeling.reads_turns or b.labeling.reads_turns:
        counts["turns"] = by_turn_depth(slim, group_b, compared, adv_a, adv_b)
    weighed = side_b if b.labeling.core.weighs_rows else (
        side_a if a.stored_column is None and a.labeling.core.weighs_rows else None)
    if weighed is not None:
        counts["row_weights"] = by_rollout_depth(weighed.results)
    if rescored:
        counts.update(reward_agreement(parts_a, parts))
    if side_b.counters.correction is not None:  # rollout correction: run-wide, so B's is A's
        counts["rollout_correction"] = side_b.counters.correction
        counts["is_weight_counts"] = is_weight_counts(side_b.results)
    return BatchComparison(counts, sorted(groups, key=group_rank), points)


# the IS weight histogram's bins: log-spaced over [1e-3, 1e3], with one bin below and one above
IS_WEIGHT_EDGES = tuple(float(10.0 ** (k / 10)) for k in range(-30, 31))


def is_weight_counts(results: dict[str, pa.Table]) -> list[int] | None:
    """How many weighted tokens of the batch's written rows fall in each IS_WEIGHT_EDGES bin (first: below
    the first edge, last: above the last); tokens of weight 0 (untrainable, or zeroed by IcePop) are left
    out. None without IS weights."""
    tables = [t for t in results.values() if "is_weights" in t.column_names]
    if not tables:
        return None
    weights = np.concatenate([np.asarray(t.column("is_weights").combine_chunks().flatten().to_numpy(
        zero_copy_only=False), dtype=np.float64) for t in tables] or [np.zeros(0)])
    weights = weights[weights > 0]
    bins = np.searchsorted(np.asarray(IS_WEIGHT_EDGES), weights, side="right")
    return np.bincount(bins, minlength=len(IS_WEIGHT_EDGES) + 1).tolist()


REWARD_COUNTS = ("reward_rows", "reward_changed")


def reward_agreement(parts_a, parts_b) -> dict:
    """Rows with a reward under both verifiers, how many of them changed reward, and by how much."""
    def column(parts, name):
        return np.concatenate([np.asarray(t.column(name)) for _, t in parts]) if parts else np.zeros(0)
    both = (column(parts_a, "problem") == 0) & (column(parts_b, "problem") == 0)
    delta = np.abs(column(parts_a, "reward") - column(parts_b, "reward"))[both]
    return {"reward_rows": int(both.sum()), "reward_changed": int((delta > 0).sum()),
            "reward_sum_abs_delta": float(delta.sum()), "reward_max_abs_delta": float(delta.max(initial=0.0))}


def _aligned(side: BatchResult, parts):
    """The side's advantage, row state and prompt group, in the batch's row order (parts sorted by source)."""
    sizes = [t.num_rows for _, t in parts]
    n = int(sum(sizes))
    advantage = np.full(n, np.nan)
    state = np.full(n, LIVE, dtype=np.int8)
    group = np.full(n, -1, dtype=np.int64)
    dead = split_by_source(side.dead) if side.dead.num_rows else {}
    filtered = split_by_source(side.filtered) if side.filtered.num_rows else {}
    offset = 0
    for (source, slim), size in zip(parts, sizes):
        file_rows = np.asarray(slim.column("row"))  # ascending: extract_slim keeps file order
        result = side.results.get(source)
        if result is not None and result.num_rows:
            at = offset + np.searchsorted(file_rows, np.asarray(result.column("row")))
            advantage[at] = np.asarray(result.column("advantage"), dtype=np.float64)
            group[at] = np.asarray(result.column("prompt_group"))
        for records, kind in ((dead.get(source), DEAD), (filtered.get(source), FILTERED)):
            if records is not None:
                state[offset + np.searchsorted(file_rows, np.asarray(records.column("row")))] = kind
        offset += size
    return advantage, state, group


def _stored(slim, n: int):
    """A stored side's advantage, row state, dead reasons and filtered reasons, in the batch's row order. A row
    its framework never trained on (`not_trained`) is filtered under the stored side too, as under a labelled
    one: the framework stored no advantage it trained with."""
    name = schemas.SLIM_NOT_TRAINED.name
    not_trained = (np.asarray(slim.column(name).is_valid()) if slim is not None and name in slim.column_names
                   else np.zeros(n, dtype=bool))
    filtered = {Reason.NOT_TRAINED.value: int(not_trained.sum())} if not_trained.any() else {}
    if slim is None or "stored_advantage" not in slim.column_names:
        state = np.where(not_trained, FILTERED, DEAD).astype(np.int8)
        dead = int((state == DEAD).sum())
        return np.full(n, np.nan), state, ({STORED_MISSING: dead} if dead else {}), filtered
    column = slim.column("stored_advantage").combine_chunks()
    missing = np.asarray(column.is_null()) & ~not_trained
    advantage = np.asarray(pc.fill_null(column, np.nan), dtype=np.float64)
    non_finite = ~missing & ~not_trained & ~np.isfinite(advantage)
    state = np.where(not_trained, FILTERED, np.where(missing | non_finite, DEAD, LIVE)).astype(np.int8)
    reasons = {reason: int(count) for reason, count in ((STORED_MISSING, missing.sum()),
                                                        (STORED_NON_FINITE, non_finite.sum())) if count}
    return np.where(state == LIVE, advantage, np.nan), state, reasons, filtered


def _stored_groups(adv_a, state_a, group_b) -> tuple[int, int]:
    """A stored side's groups: B's groups with a row live under A; uniform when all those rows are zero."""
    live = (group_b >= 0) & (state_a == LIVE)
    if not live.any():
        return 0, 0
    g = group_b[live]
    rows = np.bincount(g)
    nonzero = np.bincount(g, weights=np.abs(adv_a[live]) > ZERO_TOL, minlength=len(rows))
    return int((rows > 0).sum()), int(((rows > 0) & (nonzero == 0)).sum())


def _reasons(dead: pa.Table) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason in dead.column("reason").to_pylist():  # dead rows only: rare
        counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items()))


def _groups(slim, group_b, differs, wrong_sign, delta, compared, state_a, file_names, file_rows, label):
    """B's groups that differ (at most LISTED_GROUPS, with their fan-out), their count and the batch's
    group-size histogram; vectorized over rows (a step may hold many groups)."""
    live = np.flatnonzero(group_b >= 0)
    if not len(live):
        return [], 0, {}
    g = group_b[live]
    n_groups = int(g.max()) + 1
    size = np.bincount(g, minlength=n_groups)
    differing = np.bincount(g, weights=differs[live], minlength=n_groups).astype(np.int64)
    histogram: dict[str, list[int]] = {}
    for s, d in zip(size[size > 0], differing[size > 0]):
        entry = histogram.setdefault(str(int(s)), [0, 0])
        entry[0] += 1
        entry[1] += int(d > 0)

    keys = dense_keys(slim)[1]
    rollout = np.where(np.asarray(keys.is_valid()), np.asarray(pc.fill_null(keys, 0)), -1 - np.arange(len(group_b)))
    pairs, fan = np.unique(np.stack([g, rollout[live]]), axis=1, return_counts=True)
    rollouts = np.bincount(pairs[0], minlength=n_groups)
    max_fanout = np.zeros(n_groups, dtype=np.int64)
    np.maximum.at(max_fanout, pairs[0], fan)
    wrong = np.bincount(g, weights=wrong_sign[live], minlength=n_groups).astype(np.int64)
    unwritten = np.bincount(g, weights=state_a[live] != LIVE, minlength=n_groups).astype(np.int64)
    largest = np.full(n_groups, -1.0)
    hit = live[compared[live]]
    np.maximum.at(largest, group_b[hit], delta[hit])
    first = np.full(n_groups, len(group_b))
    np.minimum.at(first, g, live)

    candidates = np.flatnonzero(differing)
    # group_rank, vectorized: groups with rows A does not write (or no compared row) first, then largest |a - b|
    worst = np.where((unwritten[candidates] > 0) | (largest[candidates] < 0), np.inf, largest[candidates])
    listed = candidates[np.lexsort((candidates, -worst))[:LISTED_GROUPS]]
    group_index = slim.column("group_index")
    out = [{
        "label": label, "group": int(k), "group_index": group_index[int(first[k])].as_py(),
        "first_row": f"{file_names[first[k]]}:{int(file_rows[first[k]])}",
        "rows": int(size[k]), "rollouts": int(rollouts[k]), "max_fanout": int(max_fanout[k]),
        "rows_differing": int(differing[k]), "wrong_sign": int(wrong[k]), "not_written_under_a": int(unwritten[k]),
        "max_abs_delta": float(largest[k]) if largest[k] >= 0 else None,
    } for k in listed]
    return out, len(candidates), histogram


def by_turn_depth(slim, group_b, compared, adv_a, adv_b) -> dict:
    """A side with a turn-level estimator: the compared rows by turn depth (0 the first turn of a rollout of one
    of B's groups, in turn order: the turn column's, else row order), with each side's sum of advantages and
    the rows whose sign flips; and per rollout whether the signs agree (every compared row non-zero under both
    with the same sign, where it has such a row)."""
    live = np.flatnonzero(compared)
    if not len(live):
        return {"depths": [], "rollouts": 0, "rollouts_sign_agree": 0}
    keys = dense_keys(slim)[1]
    rollout = np.where(np.asarray(keys.is_valid()), np.asarray(pc.fill_null(keys, 0)), -1 - np.arange(len(group_b)))
    turn = (np.asarray(pc.fill_null(slim.column("turn"), 0), dtype=np.float64) if "turn" in slim.column_names
            else np.arange(len(group_b), dtype=np.float64))
    # every row of B's groups counts for the depth, compared or not: a turn's depth is its place in its rollout
    rows = np.flatnonzero(group_b >= 0)
    order = rows[np.lexsort((rows, turn[rows], rollout[rows], group_b[rows]))]
    same = np.zeros(len(order), dtype=bool)
    same[1:] = (group_b[order][1:] == group_b[order][:-1]) & (rollout[order][1:] == rollout[order][:-1])
    start = np.flatnonzero(~same)
    run = np.cumsum(~same) - 1
    depth = np.full(len(group_b), -1, dtype=np.int64)
    depth[order] = np.arange(len(order)) - start[run]
    trajectory = np.full(len(group_b), -1, dtype=np.int64)
    trajectory[order] = run
    signed = (np.abs(adv_a) > ZERO_TOL) & (np.abs(adv_b) > ZERO_TOL)
    flip = signed & (np.sign(adv_a) != np.sign(adv_b))
    d = depth[live]
    n = int(d.max()) + 1
    rows_at = np.bincount(d, minlength=n)
    sum_a = np.bincount(d, weights=adv_a[live], minlength=n)
    sum_b = np.bincount(d, weights=adv_b[live], minlength=n)
    flips = np.bincount(d, weights=flip[live], minlength=n)
    t = trajectory[live]
    n_traj = int(trajectory.max()) + 1
    signed_rows = np.bincount(t, weights=signed[live], minlength=n_traj)
    flipped = np.bincount(t, weights=flip[live], minlength=n_traj)
    return {"depths": [[int(k), int(rows_at[k]), float(sum_a[k]), float(sum_b[k]), int(flips[k])]
                       for k in range(n) if rows_at[k]],
            "rollouts": int((signed_rows > 0).sum()), "rollouts_sign_agree": int(((signed_rows > 0)
                                                                                    & (flipped == 0)).sum())}


def by_rollout_depth(results: dict[str, pa.Table]) -> list[list]:
    """A weighing side's written rows by their rollout's depth (its written rows, N): per depth
    [N, rollouts, rows, the rows' sum of loss_weight]: each row counting once (before) against its weight
    (after), docs/semantics.md "Row weights"."""
    tables = [t for t in results.values() if t.num_rows]
    if not tables:
        return []
    table = pa.concat_tables(tables)
    group = np.asarray(table.column("prompt_group"))
    key = table.column("rollout_key")
    valid = np.asarray(key.is_valid())
    # a keyless row is a rollout of its own
    rollout = np.where(valid, np.asarray(pc.fill_null(key, 0)), -1 - np.arange(table.num_rows))
    _, ids, sizes = np.unique(np.stack([group, rollout]), axis=1, return_inverse=True, return_counts=True)
    depth = sizes[ids.reshape(-1)]
    weight = np.asarray(table.column("loss_weight"), dtype=np.float64)
    out = []
    for n in np.unique(depth):
        at = depth == n
        out.append([int(n), int(at.sum() // n), int(at.sum()), float(weight[at].sum())])
    return out


def summarize_row_weights(batches: list[dict]) -> list[dict]:
    """The run's share of the gradient by rollout depth: rows (each counted once, as a trainer without
    weights counts them) against loss_weight, from its batches' by_rollout_depth."""
    depths: dict[int, list] = {}
    for r in batches:
        for n, rollouts, rows, weight in r["row_weights"]:
            entry = depths.setdefault(n, [0, 0, 0.0])
            entry[0] += rollouts
            entry[1] += rows
            entry[2] += weight
    rollouts = sum(v[0] for v in depths.values()) or 1
    rows = sum(v[1] for v in depths.values()) or 1
    weight = sum(v[2] for v in depths.values()) or 1.0
    return [{"depth": n, "rollouts": v[0], "rollout_share": v[0] / rollouts, "rows": v[1],
             "share_before": v[1] / rows, "share_after": v[2] / weight} for n, v in sorted(depths.items())]


def summarize_turns(batches: list[dict]) -> dict:
    """The run's turn-depth view from its batches' (by_turn_depth)."""
    depths: dict[int, list] = {}
    for r in batches:
        for depth, rows, sum_a, sum_b, flips in r["turns"]["depths"]:
            entry = depths.setdefault(depth, [0, 0.0, 0.0, 0])
            entry[0] += rows
            entry[1] += sum_a
            entry[2] += sum_b
            entry[3] += flips
    rollouts = sum(r["turns"]["rollouts"] for r in batches)
    agree = sum(r["turns"]["rollouts_sign_agree"] for r in batches)
    return {
        "by_depth": [{"depth": k, "rows": v[0], "mean_a": v[1] / v[0], "mean_b": v[2] / v[0], "sign_flips": v[3],
                      "sign_flip_fraction": v[3] / v[0]} for k, v in sorted(depths.items())],
        "rollouts_with_signs": rollouts, "rollouts_sign_agree": agree,
        "rollouts_sign_agree_fraction": agree / rollouts if rollouts else None,
    }


def group_rank(group: dict):
    """Largest |a - b| first (groups not written under A first of all), then by name: a total order."""
    worst = float("inf") if group["max_abs_delta"] is None or group["not_written_under_a"] else group["max_abs_delta"]
    return (-worst, group["label"], group["group"])


def sample_keys(name: str, file_rows: np.ndarray) -> np.ndarray:
    """A pseudo-random key per (file name, row): the sample is the rows with the smallest keys (splitmix64)."""
    x = (np.uint64(zlib.crc32(name.encode())) << np.uint64(32)) ^ file_rows.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _sample(compared, file_names, file_rows, adv_a, adv_b) -> list[tuple]:
    at = np.flatnonzero(compared)
    if not len(at):
        return []
    keys = np.empty(len(at), dtype=np.uint64)
    for name in np.unique(file_names[at]):
        mine = file_names[at] == name
        keys[mine] = sample_keys(str(name), file_rows[at[mine]])
    keep = at[np.argsort(keys, kind="stable")[:SAMPLE_POINTS]]
    keys = keys[np.argsort(keys, kind="stable")[:SAMPLE_POINTS]]
    return [(int(k), str(file_names[i]), int(file_rows[i]), float(adv_a[i]), float(adv_b[i]))
            for k, i in zip(keys, keep)]


# ---------------------------------------------------------------- the whole run

def step_order(counts: dict):
    return (0, counts["step"], "") if counts["step"] is not None else (1, 0, counts["label"])


def summarize(batches: list[dict], files: list[dict], groups: list[dict], points: list[tuple], a: dict,
              b: dict) -> dict:
    """The report: totals, per-step rows, group-size histogram, listed groups, scatter sample.

    Inputs may arrive in any order; everything is sorted here, so the same run gives the same report.
    """
    batches = sorted(batches, key=step_order)
    files = sorted(files, key=lambda f: f["name"])
    totals = {name: sum(r[name] for r in batches) for name in COUNTS}
    totals["batches"] = len(batches)
    totals["rows_in_files"] = sum(f["rows"] for f in files)
    totals["files"] = len(files)
    totals["files_unreadable"] = sum(1 for f in files if f["reason"])
    totals["sum_abs_delta"] = float(sum(r["sum_abs_delta"] for r in batches))
    totals["max_abs_delta"] = max((r["max_abs_delta"] for r in batches), default=0.0)
    for side in ("a", "b"):
        reasons: dict[str, int] = {}
        for r in batches:
            for reason, count in r[f"dead_{side}_by_reason"].items():
                reasons[reason] = reasons.get(reason, 0) + count
        for f in files:
            if f["reason"]:
                reasons[f"{f['reason']} (file)"] = reasons.get(f"{f['reason']} (file)", 0) + 1
        totals[f"dead_{side}_by_reason"] = dict(sorted(reasons.items()))
        filtered: dict[str, int] = {}
        for r in batches:
            for reason, count in r[f"filtered_{side}_by_reason"].items():
                filtered[reason] = filtered.get(reason, 0) + count
        totals[f"filtered_{side}_by_reason"] = dict(sorted(filtered.items()))
    if batches and "reward_rows" in batches[0]:  # a verifier per side: reward agreement
        totals.update({name: sum(r[name] for r in batches) for name in REWARD_COUNTS})
        totals["reward_sum_abs_delta"] = float(sum(r["reward_sum_abs_delta"] for r in batches))
        totals["reward_max_abs_delta"] = max(r["reward_max_abs_delta"] for r in batches)
        rows = totals["reward_rows"]
        totals["reward_changed_fraction"] = totals["reward_changed"] / rows if rows else None
        totals["reward_mean_abs_delta"] = totals["reward_sum_abs_delta"] / rows if rows else None
    _add_fractions(totals)
    row_weights = summarize_row_weights(batches) if batches and "row_weights" in batches[0] else None
    turns = summarize_turns(batches) if batches and "turns" in batches[0] else None
    steps = []
    for r in batches:
        step = {k: v for k, v in r.items() if k not in ("group_sizes", "batch", "turns", "is_weight_counts",
                                                        "row_weights")}
        _add_fractions(step)
        steps.append(step)
    histogram: dict[int, list[int]] = {}
    for r in batches:
        for size, (count, differing) in r["group_sizes"].items():
            entry = histogram.setdefault(int(size), [0, 0])
            entry[0] += count
            entry[1] += differing
    report = {
        "a": a, "b": b,
        "definitions": {"zero": f"|x| <= {ZERO_TOL:g}", "agree": f"|a - b| <= {AGREE_ABS:g} + {AGREE_REL:g} * |b|",
                        "wrong_sign": "both non-zero and sign(a) != sign(b)",
                        "compared": "rows written (not dead-lettered, not filtered) under both A and B",
                        "groups": "B's prompt groups; a group differs when a row does not agree or A does not "
                                  "write it"},
        "totals": totals,
        "steps": steps,
        "group_sizes": [{"rows": size, "groups": count, "differing": differing}
                        for size, (count, differing) in sorted(histogram.items())],
        "differing_groups": sorted(groups, key=group_rank)[:LISTED_GROUPS],
        "unreadable_files": [f for f in files if f["reason"]],
        "scatter_sample": {"of_rows": totals["compared"],
                           "points": [[p[3], p[4]] for p in sorted(points)[:SAMPLE_POINTS]]},
    }
    if turns is not None:  # a turn-level side: compared rows by turn depth, sign agreement per rollout
        report["turns"] = turns
    if row_weights is not None:  # a side weighing its rows: the gradient's share by rollout depth
        report["row_weights"] = row_weights
    if batches and "rollout_correction" in batches[0]:
        report["rollout_correction"] = summarize_correction(batches)
    return report


def summarize_correction(batches: list[dict]) -> dict:
    """Rollout correction over the run: the rejections, and the IS weights' histogram over every batch (each
    step's metrics stay in its step row)."""
    counts = [r["is_weight_counts"] for r in batches if r.get("is_weight_counts") is not None]
    entries = [r["rollout_correction"] for r in batches]
    return {
        "rows_rejected": sum(e["rows_rejected"] for e in entries),
        "tokens_rejected": sum(e["tokens_rejected"] for e in entries),
        "trainable_tokens": sum(e["trainable_tokens"] for e in entries),
        "is_weights": ({"edges": list(IS_WEIGHT_EDGES), "counts": np.sum(counts, axis=0).tolist()} if counts
                       else None),
    }


def _add_fractions(counts: dict) -> None:
    compared = counts["compared"]
    for name in ("agree", "wrong_sign", "zero_to_nonzero", "nonzero_to_zero"):
        counts[f"{name}_fraction"] = counts[name] / compared if compared else None
    counts["mean_abs_delta"] = counts["sum_abs_delta"] / compared if compared else None
