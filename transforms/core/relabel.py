"""The numeric core: every semantics as one batched pass of torch segment ops.

Pure functions over flat tensors (see types.py); no Beam, no Python loop over
rows or groups, the same code on any torch device. Each step maps rows to
dense segment ids (batch -> prompt group -> rollout/unit) and reduces with
scatter ops, so any number of batches is handled in one call.
"""
from __future__ import annotations

import torch

from .config import STD_EPS, CoreConfig, RLOO
from .reasons import CODE
from .types import CoreInput, CoreOutput

# Grouping rules, decided per batch (SEMANTICS.md, "Semantics").
WHOLE_BATCH, SLICES, GROUP_INDEX, EXPLICIT_SIZES = 0, 1, 2, 3


def relabel(inp: CoreInput, config: CoreConfig) -> CoreOutput:
    device = inp.batch.device
    n_rows = inp.num_rows
    if n_rows == 0:
        return _empty_output(inp.num_batches, device)
    row = torch.arange(n_rows, device=device)

    rule, batch_problem, sizes_boundaries = _choose_grouping(inp, config)
    group, n_groups, group_first_row = _assign_groups(inp, row, rule, sizes_boundaries, config)
    group_batch = _take(inp.batch, group_first_row)
    prompt_group = _ordinal_within_batch(group, group_batch, inp.num_batches)

    rollout, n_rollouts = _rollout_ids(group, n_groups, inp.rollout_key, inp.has_rollout_key)
    if config.row_units:
        unit, n_units = row, n_rows
        chosen = row
    else:
        unit, n_units = rollout, n_rollouts
        chosen = _mainstream_rows(inp.trainable, unit, n_units, row, config.policy)
    mainstream = torch.zeros(n_rows, dtype=torch.bool, device=device)
    mainstream.index_fill_(0, chosen, True)
    unit_reward = _take(inp.reward, chosen)
    unit_group = _take(group, chosen)

    group_problem = _group_problems(inp, row, group, n_groups, group_batch, batch_problem)
    if config.require_shared_rewards:
        mismatch = _segment(unit, n_units, inp.reward, "amin") != _segment(unit, n_units, inp.reward, "amax")
        group_mismatch = _segment(unit_group, n_groups, mismatch.long(), "amax").bool()
        group_problem = torch.where((group_problem == 0) & group_mismatch,
                                    CODE["sibling-reward-mismatch"], group_problem)

    units_in_group = torch.bincount(unit_group, minlength=n_groups)
    uniform_group = (units_in_group >= 2) & (
        _segment(unit_group, n_groups, unit_reward, "amin") == _segment(unit_group, n_groups, unit_reward, "amax"))

    if config.normalizes:
        unit_advantage = _unit_advantages(unit_reward, unit_group, n_groups, units_in_group, uniform_group, config)
        advantage = _take(unit_advantage, unit).to(torch.float32)
    else:  # pass-through estimators: the row's own reward
        advantage = inp.reward.to(torch.float32)

    non_finite = _segment(group, n_groups, (~torch.isfinite(advantage)).long(), "amax").bool()
    group_problem = torch.where((group_problem == 0) & non_finite, CODE["non-finite-advantage"], group_problem)

    live_group = group_problem == 0
    problem = _take(group_problem, group)
    live_row = problem == 0
    advantage = torch.where(live_row, advantage, torch.zeros_like(advantage))
    rollout_mask_sum = _take(_segment(rollout, n_rollouts, inp.mask_sum, "sum"), rollout)

    unit_live = _take(live_group, unit_group)
    unit_batch = _take(group_batch, unit_group)
    return CoreOutput(
        advantage=advantage,
        mainstream=mainstream,
        prompt_group=prompt_group,
        rollout_mask_sum=rollout_mask_sum,
        problem=problem,
        uniform=_take(uniform_group, group) & live_row,
        groups=torch.bincount(group_batch[live_group], minlength=inp.num_batches),
        units=torch.bincount(unit_batch[unit_live], minlength=inp.num_batches),
        uniform_groups=torch.bincount(group_batch[live_group & uniform_group], minlength=inp.num_batches),
    )


def _choose_grouping(inp: CoreInput, config: CoreConfig):
    """Per batch: which grouping rule applies, or which problem kills the batch."""
    device = inp.batch.device
    n_batches = inp.num_batches
    batch_size = torch.bincount(inp.batch, minlength=n_batches)
    with_index = torch.bincount(inp.batch, weights=inp.has_group_index.to(torch.float64),
                                minlength=n_batches).long()
    all_index = with_index == batch_size
    no_index = with_index == 0
    n, b = config.n_samples_per_prompt, config.rollout_batch_size
    exact_slices = batch_size == (n * b) if (n and b) else torch.zeros_like(all_index)

    rule = torch.full((n_batches,), WHOLE_BATCH, dtype=torch.long, device=device)
    problem = torch.zeros(n_batches, dtype=torch.long, device=device)
    sizes_boundaries = None
    if config.semantics == "legacy-reshape":
        rule[exact_slices] = SLICES
    elif config.semantics == "group-index":
        rule[all_index] = GROUP_INDEX
        problem[~all_index & ~no_index] = CODE["partial-group-index"]
        if n is None:
            problem[no_index & (batch_size > 0)] = CODE["missing-n-samples-per-prompt"]
        else:
            rule[no_index] = SLICES
            problem[no_index & (batch_size % n != 0)] = CODE["batch-size-not-multiple"]
    else:
        rule[exact_slices] = SLICES
        rule[all_index] = GROUP_INDEX
        given = [i for i, s in enumerate(inp.prompt_group_sizes) if s is not None]
        if given:
            batch_start = torch.cumsum(batch_size, 0) - batch_size
            sizes = [inp.prompt_group_sizes[i] for i in given]  # loop over batches, not rows
            totals = torch.stack([s.sum() for s in sizes])
            given_t = torch.tensor(given, device=device)
            rule[given_t] = EXPLICIT_SIZES
            matches = totals == _take(batch_size, given_t)
            problem[given_t] = torch.where(matches, 0, CODE["group-sizes-mismatch"])
            # boundaries of a batch whose sizes do not add up would spill into the next batch
            usable = [(i, s) for (i, s), ok in zip(zip(given, sizes), matches.tolist()) if ok]
            if usable:
                sizes_boundaries = torch.cat([batch_start[i] + torch.cumsum(s[s > 0], 0) for i, s in usable])
    return rule, problem, sizes_boundaries


def _assign_groups(inp, row, rule, sizes_boundaries, config):
    """Dense prompt-group ids numbered by first row (row order), their first rows."""
    batch = inp.batch
    row_rule = _take(rule, batch)
    batch_size = torch.bincount(batch, minlength=inp.num_batches)
    position = row - _take(torch.cumsum(batch_size, 0) - batch_size, batch)
    within = torch.zeros_like(row)
    if config.n_samples_per_prompt:
        within = torch.where(row_rule == SLICES, position // config.n_samples_per_prompt, within)
    within = torch.where(row_rule == GROUP_INDEX, inp.group_index, within)
    if sizes_boundaries is not None:
        segment = torch.searchsorted(sizes_boundaries, row, right=True)
        within = torch.where(row_rule == EXPLICIT_SIZES, segment, within)
    group, n_groups = _dense_pairs(batch, inp.num_batches, within)
    # renumber by first row so ids follow row order (and are stable across runs); first rows are
    # distinct row numbers, so their rank is a prefix count over a presence table: no sort
    first_row = _segment(group, n_groups, row, "amin")
    present = torch.zeros(row.numel(), dtype=torch.long, device=row.device)
    present.index_fill_(0, first_row, 1)
    rank = _take(torch.cumsum(present, 0) - 1, first_row)
    ordered_first_row = torch.empty_like(first_row)
    ordered_first_row.index_copy_(0, rank, first_row)
    return _take(rank, group), n_groups, ordered_first_row


def _ordinal_within_batch(group, group_batch, n_batches):
    per_batch = torch.bincount(group_batch, minlength=n_batches)
    offset = torch.cumsum(per_batch, 0) - per_batch
    ordinal = torch.arange(group_batch.numel(), device=group.device) - _take(offset, group_batch)
    return _take(ordinal, group)


def _mainstream_rows(trainable, unit, n_units, row, policy):
    """The row supplying each unit's reward: most trainable tokens (ties: earliest) or last."""
    if policy == "last":
        return _segment(unit, n_units, row, "amax")
    most = _segment(unit, n_units, trainable, "amax")
    candidates = torch.where(trainable == _take(most, unit), row, row.numel())
    return _segment(unit, n_units, candidates, "amin")


def _group_problems(inp, row, group, n_groups, group_batch, batch_problem):
    """A group inherits its batch's problem, else the problem of its first bad row."""
    bad_rows = torch.where(inp.row_problem != 0, row, row.numel())
    first_bad = _segment(group, n_groups, bad_rows, "amin")
    has_bad = first_bad < row.numel()
    row_problem = torch.where(has_bad, inp.row_problem[first_bad.clamp(max=row.numel() - 1)], 0)
    from_batch = _take(batch_problem, group_batch)
    return torch.where(from_batch != 0, from_batch, row_problem)


def _unit_advantages(reward, unit_group, n_groups, k, uniform, config: CoreConfig):
    kf = k.to(torch.float64)
    mean = _segment(unit_group, n_groups, reward, "sum") / kf
    centred = reward - _take(mean, unit_group)
    k_unit = _take(k, unit_group)
    if config.estimator == RLOO:
        k_row = _take(kf, unit_group)
        advantage = torch.where(k_unit > 1, k_row / (k_row - 1).clamp(min=1) * centred,
                                torch.zeros_like(centred))
    elif config.divides_by_std:
        std = _take(torch.sqrt(_segment(unit_group, n_groups, centred * centred, "sum") / (kf - 1)), unit_group)
        scaled = centred / (std + STD_EPS)
        if config.semantics == "legacy-reshape":
            advantage = scaled
        elif config.semantics == "group-index":
            advantage = torch.where(k_unit > 1, scaled, centred)
        else:
            advantage = torch.where((k_unit > 1) & (std > 0), scaled, centred)
    else:
        advantage = centred
    return torch.where(_take(uniform, unit_group), torch.zeros_like(advantage), advantage)


def _take(values, index):
    """values[index] for 1-D tensors; index_select is several times faster than advanced indexing."""
    return values.index_select(0, index)


def _segment(ids, n, values, reduce):
    """Reduce values over segment ids (ids in [0, n))."""
    if reduce == "sum":
        out = torch.zeros(n, dtype=values.dtype, device=values.device)
        return out.index_add_(0, ids, values)
    out = torch.empty(n, dtype=values.dtype, device=values.device)
    return out.scatter_reduce_(0, ids, values, reduce=reduce, include_self=False)


def _rollout_ids(group, n_groups, rollout_key, has_key):
    """Dense ids of rollouts: rows sharing a key inside a group; a keyless row is its own rollout."""
    if bool(has_key.all()):
        return _dense_pairs(group, n_groups, rollout_key)
    keyed_rows = torch.nonzero(has_key).squeeze(1)
    keyed, n_keyed = _dense_pairs(_take(group, keyed_rows), n_groups, _take(rollout_key, keyed_rows))
    ids = torch.cumsum((~has_key).long(), 0) - 1 + n_keyed  # a keyless row is a rollout of its own
    ids.index_copy_(0, keyed_rows, keyed)
    return ids, n_keyed + int((~has_key).sum())


# A key table larger than this many entries per row falls back to sorting.
TABLE_ROWS_FACTOR = 8


def _dense_pairs(segment, n_segments, key):
    """Dense ids 0..n-1 of the distinct (segment, key) pairs, ordered by (segment, key).

    Keys are usually compact inside a segment (group_index within a step,
    rollout ids within a prompt): then a presence table indexed by
    segment offset + (key - segment's smallest key) gives the ids with
    prefix sums in O(rows). Sparse keys fall back to sorting.
    """
    big = torch.iinfo(torch.long).max
    low = torch.full((n_segments,), big, dtype=torch.long, device=key.device).scatter_reduce_(
        0, segment, key, reduce="amin")
    high = torch.full((n_segments,), -big - 1, dtype=torch.long, device=key.device).scatter_reduce_(
        0, segment, key, reduce="amax")
    used = low <= high
    low_f, high_f = low.to(torch.float64), high.to(torch.float64)
    span_f = torch.where(used, high_f - low_f + 1, torch.zeros_like(low_f))
    if float(span_f.sum()) <= TABLE_ROWS_FACTOR * key.numel() + 1024:
        span = torch.where(used, high - low + 1, torch.zeros_like(low))
        offset = torch.cumsum(span, 0) - span
        slot = _take(offset, segment) + (key - _take(low, segment))
        present = torch.zeros(int(span.sum()), dtype=torch.long, device=key.device)
        present.index_fill_(0, slot, 1)
        ranks = torch.cumsum(present, 0) - 1
        return _take(ranks, slot), int(ranks[-1]) + 1 if ranks.numel() else 0
    values, codes = torch.unique(key, return_inverse=True)
    combined = segment * values.numel() + codes
    uniq, ids = torch.unique(combined, return_inverse=True)
    return ids, uniq.numel()


def _empty_output(n_batches, device):
    zeros = torch.zeros(0, dtype=torch.long, device=device)
    per_batch = torch.zeros(n_batches, dtype=torch.long, device=device)
    return CoreOutput(
        advantage=torch.zeros(0, dtype=torch.float32, device=device),
        mainstream=torch.zeros(0, dtype=torch.bool, device=device),
        prompt_group=zeros, rollout_mask_sum=zeros, problem=zeros,
        uniform=torch.zeros(0, dtype=torch.bool, device=device),
        groups=per_batch, units=per_batch.clone(), uniform_groups=per_batch.clone(),
    )
