"""An independent, plain-Python oracle of the numeric core.

Written straight from /work/shared/SEMANTICS.md plus the project's decisions
where that file is silent (listed in the docstring of ``reference_relabel``).
No torch, no numpy, no project code except the config dataclass (read for
its option values only: which estimators divide by std, and the other rules,
are written out below from SEMANTICS.md, not taken from the project) and the
reason-code strings. Loops everywhere: clarity over speed.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

from transforms.core.config import CoreConfig
from transforms.core.reasons import REASONS

# SEMANTICS.md, "Estimators": centre, then divide by (std + 1e-6) when std normalization is on
STD_ESTIMATORS = ("grpo", "gspo", "cispo")
CENTRE_ONLY_ESTIMATORS = ("reinforce_plus_plus_baseline", "dr_grpo")  # centre only, std flag ignored
RLOO = "rloo"
STD_EPS = 1e-6
# SEMANTICS.md, "Semantics": every row is its own unit (no rollout dedup)
ROW_UNIT_SEMANTICS = ("legacy-reshape", "group-index")

# Reason strings used below; asserting here keeps the oracle honest if codes are renamed.
PARTIAL_GROUP_INDEX = "partial-group-index"
MISSING_N = "missing-n-samples-per-prompt"
NOT_MULTIPLE = "batch-size-not-multiple"
SIZES_MISMATCH = "group-sizes-mismatch"
SIBLING_MISMATCH = "sibling-reward-mismatch"
NON_FINITE_ADVANTAGE = "non-finite-advantage"
for _name in (PARTIAL_GROUP_INDEX, MISSING_N, NOT_MULTIPLE, SIZES_MISMATCH, SIBLING_MISMATCH,
              NON_FINITE_ADVANTAGE):
    assert _name in REASONS, _name


@dataclass
class Row:
    reward: float                 # may be nan/inf (then `problem` is normally set)
    trainable: int                # trainable tokens; also the final loss-mask sum
    group_index: int | None = None
    rollout_id: int | None = None
    index: int | None = None
    problem: str = ""             # row-level bad-input reason from the adapter, "" if fine


@dataclass
class Batch:
    rows: list[Row]               # already in row order
    prompt_group_sizes: list[int] | None = None


@dataclass
class RowResult:
    advantage: float | None       # None when the row is dead-lettered
    mainstream: bool
    prompt_group: int
    rollout_mask_sum: int
    problem: str                  # "" when the row is written
    uniform: bool


def to_float32(x: float) -> float:
    """Round a Python float to the nearest float32 (C cast: overflow gives +-inf)."""
    return ctypes.c_float(x).value


def rollout_key(row: Row, position: int):
    """rollout_id, else index; a row with neither is its own rollout."""
    if row.rollout_id is not None:
        return ("key", row.rollout_id)
    if row.index is not None:
        return ("key", row.index)
    return ("alone", position)


# ---------------------------------------------------------------- which rules apply

def normalizes(config: CoreConfig) -> bool:
    """Any other estimator, or --no-rewards-normalization: advantage = reward value, unchanged."""
    return config.rewards_normalization and config.estimator in STD_ESTIMATORS + CENTRE_ONLY_ESTIMATORS + (RLOO,)


def divides_by_std(config: CoreConfig) -> bool:
    return normalizes(config) and config.std_normalization and config.estimator in STD_ESTIMATORS


def row_units(config: CoreConfig) -> bool:
    return config.semantics in ROW_UNIT_SEMANTICS


def last_row_is_mainstream(config: CoreConfig) -> bool:
    """--mainstream last; most-trainable (the default) and shared take the most-trainable row."""
    return config.mainstream == "last"


def requires_shared_rewards(config: CoreConfig) -> bool:
    """rollout-shared, or --mainstream shared: all rows of one rollout must carry the same reward."""
    return config.semantics == "rollout-shared" or config.mainstream == "shared"


# ---------------------------------------------------------------- grouping

def _slices(n_rows: int, sizes: list[int]) -> list[list[int]]:
    groups = []
    start = 0
    for size in sizes:
        if size == 0:
            continue
        groups.append(list(range(start, start + size)))
        start += size
    return groups


def _by_group_index(rows: list[Row]) -> list[list[int]]:
    groups: dict[int, list[int]] = {}          # insertion order == order of first row
    for i, row in enumerate(rows):
        groups.setdefault(row.group_index, []).append(i)
    return list(groups.values())


def _full_reshape(config: CoreConfig, n_rows: int) -> bool:
    n, b = config.n_samples_per_prompt, config.rollout_batch_size
    return n is not None and b is not None and n_rows == n * b


def group_rows(batch: Batch, config: CoreConfig) -> tuple[list[list[int]], str]:
    """Prompt groups of one batch as lists of row positions, or a batch-level problem."""
    rows = batch.rows
    n_rows = len(rows)
    n = config.n_samples_per_prompt
    have = [row.group_index is not None for row in rows]

    if config.semantics == "legacy-reshape":
        if _full_reshape(config, n_rows):
            return _slices(n_rows, [n] * (n_rows // n)), ""
        return [list(range(n_rows))], ""

    if config.semantics == "group-index":
        if all(have):
            return _by_group_index(rows), ""
        if any(have):
            return [], PARTIAL_GROUP_INDEX
        if n is None:
            return [], MISSING_N
        if n_rows % n != 0:
            return [], NOT_MULTIPLE
        return _slices(n_rows, [n] * (n_rows // n)), ""

    # rollout-mainstream / rollout-shared
    if batch.prompt_group_sizes is not None:
        if sum(batch.prompt_group_sizes) != n_rows:
            return [], SIZES_MISMATCH
        return _slices(n_rows, list(batch.prompt_group_sizes)), ""
    if all(have):
        return _by_group_index(rows), ""
    if _full_reshape(config, n_rows):
        return _slices(n_rows, [n] * (n_rows // n)), ""
    return [list(range(n_rows))], ""


# ---------------------------------------------------------------- statistics

def _mean(values: list[float]) -> float:
    total = 0.0
    for v in values:
        total += v
    return total / len(values)


def _sample_std(values: list[float]) -> float:
    """ddof = 1; nan for a single value, like torch.std."""
    k = len(values)
    if k < 2:
        return math.nan
    mean = _mean(values)
    squares = 0.0
    for v in values:
        squares += (v - mean) * (v - mean)
    return math.sqrt(squares / (k - 1))


def unit_advantages(unit_rewards: list[float], config: CoreConfig) -> list[float]:
    """float64 advantage of each unit of one group (normalizes(config) is assumed)."""
    k = len(unit_rewards)
    uniform = k >= 2 and all(r == unit_rewards[0] for r in unit_rewards)
    if uniform:
        return [0.0] * k
    mean = _mean(unit_rewards)
    centred = [r - mean for r in unit_rewards]
    if config.estimator == RLOO:
        if k == 1:
            return [0.0]
        return [k / (k - 1) * c for c in centred]
    if config.estimator in CENTRE_ONLY_ESTIMATORS or not divides_by_std(config):
        return centred
    assert config.estimator in STD_ESTIMATORS
    if config.semantics == "legacy-reshape":
        std = _sample_std(unit_rewards)          # nan for k == 1: the original's defect
        return [c / (std + STD_EPS) for c in centred]
    if config.semantics == "group-index":
        if k > 1:
            std = _sample_std(unit_rewards)
            return [c / (std + STD_EPS) for c in centred]
        return centred
    # rollout semantics
    if k > 1:
        std = _sample_std(unit_rewards)
        if std > 0:
            return [c / (std + STD_EPS) for c in centred]
    return centred


# ---------------------------------------------------------------- one batch

def _relabel_batch(batch: Batch, config: CoreConfig) -> list[RowResult]:
    rows = batch.rows
    if not rows:
        return []
    groups, batch_problem = group_rows(batch, config)
    if batch_problem:
        return [RowResult(None, False, 0, 0, batch_problem, False) for _ in rows]

    results: list[RowResult | None] = [None] * len(rows)
    for ordinal, members in enumerate(groups):
        # rollouts inside the group (used for rollout_mask_sum under every semantics)
        rollouts: dict[object, list[int]] = {}
        for i in members:
            rollouts.setdefault(rollout_key(rows[i], i), []).append(i)
        mask_sum = {}
        for rollout_rows in rollouts.values():
            total = 0
            for i in rollout_rows:
                total += rows[i].trainable
            for i in rollout_rows:
                mask_sum[i] = total

        # units and their mainstream row
        if row_units(config):
            units = [[i] for i in members]
        else:
            units = list(rollouts.values())
        mainstream_rows = []
        for unit in units:
            if row_units(config):
                chosen = unit[0]
            elif last_row_is_mainstream(config):
                chosen = unit[-1]
            else:  # most-trainable, ties to the earliest row
                chosen = unit[0]
                for i in unit[1:]:
                    if rows[i].trainable > rows[chosen].trainable:
                        chosen = i
            mainstream_rows.append(chosen)
        is_mainstream = set(mainstream_rows)

        # problems, in precedence order
        problem = ""
        for i in members:
            if rows[i].problem:
                problem = rows[i].problem
                break
        if not problem and requires_shared_rewards(config):
            for unit in units:
                first = rows[unit[0]].reward
                if not all(rows[i].reward == first for i in unit):
                    problem = SIBLING_MISMATCH
                    break

        advantages: dict[int, float] = {}
        uniform = False
        if not problem:
            unit_rewards = [rows[m].reward for m in mainstream_rows]
            uniform = len(unit_rewards) >= 2 and all(r == unit_rewards[0] for r in unit_rewards)
            if not normalizes(config):
                for i in members:
                    advantages[i] = to_float32(rows[i].reward)
            else:
                per_unit = unit_advantages(unit_rewards, config)
                for unit, adv in zip(units, per_unit):
                    for i in unit:
                        advantages[i] = to_float32(adv)
            if not all(math.isfinite(a) for a in advantages.values()):
                problem = NON_FINITE_ADVANTAGE
                uniform = False

        for i in members:
            results[i] = RowResult(
                advantage=None if problem else advantages[i],
                mainstream=i in is_mainstream,
                prompt_group=ordinal,
                rollout_mask_sum=mask_sum[i],
                problem=problem,
                uniform=uniform if not problem else False,
            )
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


def reference_relabel(batches: list[Batch], config: CoreConfig) -> list[list[RowResult]]:
    """Relabel each batch independently (a prompt group never spans batches).

    Decisions where SEMANTICS.md is silent:
    - batch-level problems (partial-group-index, missing-n-samples-per-prompt,
      batch-size-not-multiple, group-sizes-mismatch) dead-letter every row of
      the batch; legacy-reshape slices only when n and rollout_batch_size are
      both set and N == n*B (likewise rollout rule c); an empty batch yields
      nothing;
    - prompt_group is the ordinal of the group in its batch by first row;
    - rollout_mask_sum is summed over the row's rollout inside its group under
      every semantics;
    - a row problem kills its whole group with the first bad row's reason;
      precedence: batch problem > row problem > sibling-reward-mismatch >
      non-finite-advantage;
    - pass-through estimators give each row its own reward;
    - advantages are rounded to float32, and any non-finite one kills the group.
    """
    return [_relabel_batch(batch, config) for batch in batches]


def batch_counters(results: list[RowResult]) -> tuple[int, int, int]:
    """(groups, units, uniform_groups) over the live groups of one batch's results."""
    live_groups = set()
    uniform_groups = set()
    units = 0
    for r in results:
        if r.problem:
            continue
        live_groups.add(r.prompt_group)
        if r.uniform:
            uniform_groups.add(r.prompt_group)
        if r.mainstream:      # exactly one mainstream row per unit
            units += 1
    return len(live_groups), units, len(uniform_groups)
