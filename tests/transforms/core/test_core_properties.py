"""Property test: the core, on numpy and on torch, agrees with the plain-Python oracle (tests/reference.py).

Random multi-batch inputs (uneven fan-out, missing rollout keys, full/absent/
partial group_index, right and wrong prompt_group_sizes, ties in trainable
tokens, repeated rewards, occasional row problems) are relabelled by both, for
every semantics x estimator x std flag x mainstream policy x rewards
normalization x one-unit rule (version 2: grpo_passk, opo, gpg, remax, gdpo, with
per-key rewards, unequal weights, missing baselines and --drop-uniform-groups; version 3: grpo_loo and
the off-policy options: staleness with both --stale-rows, --zero-mask-units exclude, a metric band over
a metric column or the unit values, and a uniform tolerance).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rollout_relabel.transforms.core.config import CoreConfig
from rollout_relabel.transforms.core.reasons import REASONS
from rollout_relabel.transforms.core.types import CoreInput
from tests.reference import Batch, Row, batch_counters, reference_relabel
from tests.transforms.core.builders import DEVICES, relabel_on

ESTIMATORS = ("grpo", "gspo", "cispo", "dr_grpo", "reinforce_plus_plus_baseline", "rloo", "ppo",
              "grpo_passk", "opo", "gpg", "remax", "gdpo", "grpo_loo")
KEY_NAMES = ("a", "b", "c")
UNEQUAL_WEIGHTS = (1.0, 0.5, -2.0)
ROW_PROBLEMS = ("non-finite-reward", "mask-length", "non-numeric-reward", "missing-column",
                "missing-reward-key", "duplicate-row", "negative-length")
ADVANTAGE_TOL = 1e-5


# ---------------------------------------------------------------- adapter: oracle rows -> core tensors

def to_core_input(batches: list[Batch], metric: bool = False) -> CoreInput:
    """metric: the rows carry --filter-metric values (else the core reads no metric column)."""
    batch_ids, reward, trainable, group_index, has_group_index = [], [], [], [], []
    rollout_key, has_rollout_key, row_problem, parts, baseline = [], [], [], [], []
    version, metrics = [], []
    for b, batch in enumerate(batches):
        for row in batch.rows:
            version.append(math.nan if row.version is None else row.version)
            metrics.append(math.nan if row.metric is None else row.metric)
            parts.append(row.parts)
            baseline.append(math.nan if row.baseline is None else row.baseline)
            batch_ids.append(b)
            reward.append(row.reward)
            trainable.append(row.trainable)
            group_index.append(0 if row.group_index is None else row.group_index)
            has_group_index.append(row.group_index is not None)
            key = row.rollout_id if row.rollout_id is not None else row.index
            rollout_key.append(0 if key is None else key)
            has_rollout_key.append(key is not None)
            row_problem.append(REASONS.index(row.problem))
    i64 = np.int64
    width = max((len(p) for p in parts if p is not None), default=0)
    reward_parts = (np.ascontiguousarray(np.array([p if p is not None else [0.0] * width for p in parts],
                                                  dtype=np.float64).reshape(len(parts), width).T)
                    if width else None)
    return CoreInput(
        batch=np.array(batch_ids, dtype=i64),
        reward=np.array(reward, dtype=np.float64),
        trainable=np.array(trainable, dtype=i64),
        mask_sum=np.array(trainable, dtype=i64),
        group_index=np.array(group_index, dtype=i64),
        has_group_index=np.array(has_group_index, dtype=bool),
        rollout_key=np.array(rollout_key, dtype=i64),
        has_rollout_key=np.array(has_rollout_key, dtype=bool),
        row_problem=np.array(row_problem, dtype=i64),
        num_batches=len(batches),
        prompt_group_sizes=[None if batch.prompt_group_sizes is None
                            else np.array(batch.prompt_group_sizes, dtype=i64)
                            for batch in batches],
        reward_parts=reward_parts,
        baseline=np.array(baseline, dtype=np.float64),
        version=np.array(version, dtype=np.float64),
        metric=np.array(metrics, dtype=np.float64) if metric else None,
    )


def configs_for(semantics: str, estimator: str, n: int | None, b: int | None, n_keys: int = 0):
    """Every option combination (with --drop-uniform-groups, which only gdpo's whitening reads)."""
    policies = [None] if semantics in ("legacy-reshape", "group-index") else [
        None, "most-trainable", "last", "shared"]
    singletons = ("zero",) if semantics == "legacy-reshape" else ("zero", "raw")
    weightings = [(None, None)]
    if n_keys:
        keys = KEY_NAMES[:n_keys]
        weightings = [(keys, None), (keys, UNEQUAL_WEIGHTS[:n_keys])] if estimator == "gdpo" else [(keys, None)]
    drops = (False, True) if estimator == "gdpo" else (False,)
    for std, normalize, policy, singleton, (keys, weights), drop in itertools.product(
            (True, False), (True, False), policies, singletons, weightings, drops):
        if estimator == "gdpo" and keys is None:
            continue
        config = CoreConfig(semantics=semantics, estimator=estimator, std_normalization=std,
                            rewards_normalization=normalize, mainstream=policy,
                            n_samples_per_prompt=n, rollout_batch_size=b, singleton_groups=singleton,
                            reward_keys=keys, reward_weights=weights)
        yield config, drop


def describe(batches: list[Batch], config: CoreConfig, drop_uniform_groups: bool = False) -> str:
    lines = [repr(config) + (" with drop_uniform_groups" if drop_uniform_groups else "")]
    for k, batch in enumerate(batches):
        lines.append(f"batch {k}: prompt_group_sizes={batch.prompt_group_sizes}")
        lines.extend(f"  {i}: {row}" for i, row in enumerate(batch.rows))
    return "\n".join(lines)


def assert_core_matches_reference(batches: list[Batch], config: CoreConfig, device: str,
                                  inp: CoreInput | None = None, drop_uniform_groups: bool = False,
                                  metric: bool = False) -> None:
    expected = reference_relabel(batches, config, drop_uniform_groups, metric)
    out = relabel_on(to_core_input(batches, metric) if inp is None else inp, config, device, drop_uniform_groups)
    try:
        _compare(expected, out)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{describe(batches, config, drop_uniform_groups)}") from None


def _compare(expected, out) -> None:
    flat = [r for per_batch in expected for r in per_batch]
    assert out.advantage.shape == (len(flat),)
    assert out.advantage.dtype == np.float32
    problem = out.problem.tolist()
    advantage = out.advantage.tolist()
    mainstream = out.mainstream.tolist()
    prompt_group = out.prompt_group.tolist()
    mask_sum = out.rollout_mask_sum.tolist()
    uniform = out.uniform.tolist()
    filtered = out.filtered.tolist()
    for i, ref in enumerate(flat):
        where = f"row {i} (flat): expected {ref}"
        assert REASONS[problem[i]] == ref.problem, f"problem {REASONS[problem[i]]!r}; {where}"
        if ref.problem:
            continue
        got = advantage[i]
        assert math.isfinite(got) and abs(got - ref.advantage) <= ADVANTAGE_TOL, f"advantage {got}; {where}"
        assert mainstream[i] == ref.mainstream, f"mainstream {mainstream[i]}; {where}"
        assert prompt_group[i] == ref.prompt_group, f"prompt_group {prompt_group[i]}; {where}"
        assert mask_sum[i] == ref.rollout_mask_sum, f"rollout_mask_sum {mask_sum[i]}; {where}"
        assert uniform[i] == ref.uniform, f"uniform {uniform[i]}; {where}"
        assert REASONS[filtered[i]] == ref.filtered, f"filtered {REASONS[filtered[i]]!r}; {where}"
    counters = [batch_counters(per_batch) for per_batch in expected]
    got = list(zip(out.groups.tolist(), out.units.tolist(), out.uniform_groups.tolist()))
    assert got == counters, f"counters (groups, units, uniform_groups) per batch: core {got}, reference {counters}"


# ---------------------------------------------------------------- strategies
#
# Hypothesis draws the structure of each batch (size, group_index mode,
# prompt_group_sizes mode, interleaving); the per-row details come from a
# seeded random.Random, because a few hundred hypothesis draws per example cost
# more than the comparisons themselves. Everything stays deterministic.

SMALL_REWARDS = (0.0, 0.5, 1.0)
BINARY_REWARDS = (0.0, 1.0)
FRACTIONAL_REWARDS = (0.1, 0.2, 0.3, -1.0, 2.0)
NON_FINITE = (math.nan, math.inf, -math.inf)
WRONG_SIZE_DELTAS = (-2, -1, 1, 2)


def _reward(rng) -> float:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.choice(SMALL_REWARDS)
    if kind == 1:
        return rng.choice(BINARY_REWARDS)
    if kind == 2:
        return rng.choice(FRACTIONAL_REWARDS)
    return rng.uniform(-10, 10)


def _rollout_rows(rng, gi_mode: str, problem_rate: float, extra=None, n_keys: int = 0) -> list[Row]:
    """The rows of one rollout (fan-out 1..5), rewards mostly shared, keys often colliding.

    `extra` (a second random.Random, so that the draws above stay as they were) gives each row its
    per-key values (mostly shared by the rollout) and a baseline (sometimes missing or non-finite).
    """
    fan_out = rng.choice((1, 1, 2, 2, 3, 4, 5))
    key_kind = rng.choice(("id", "index", "both", "none"))
    key, other = rng.randrange(5), rng.randrange(5)
    rollout_id = key if key_kind in ("id", "both") else None
    index = key if key_kind == "index" else (other if key_kind == "both" else None)
    shared_reward = rng.random() < 0.75
    base_reward = _reward(rng)
    group = rng.randrange(4)
    rows = []
    for _ in range(fan_out):
        reward = base_reward if shared_reward else _reward(rng)
        if gi_mode == "all":
            group_index = group if rng.random() < 0.8 else rng.randrange(4)
        elif gi_mode == "partial":
            group_index = rng.choice((None, rng.randrange(4)))
        else:
            group_index = None
        problem = ""
        if rng.random() < problem_rate:
            problem = rng.choice(ROW_PROBLEMS)
            if problem == "non-finite-reward":
                reward = rng.choice(NON_FINITE)
        rows.append(Row(reward=reward, trainable=rng.randrange(4), group_index=group_index,
                        rollout_id=rollout_id, index=index, problem=problem))
    if extra is not None:
        shared_parts = [_reward(extra) for _ in range(n_keys)]
        for row in rows:
            row.parts = shared_parts if extra.random() < 0.75 else [_reward(extra) for _ in range(n_keys)]
            if row.problem == "non-finite-reward" and n_keys:
                row.parts = [extra.choice(NON_FINITE)] + row.parts[1:]
            kind = extra.randrange(20)
            row.baseline = None if kind == 0 else (extra.choice(NON_FINITE) if kind == 1 else _reward(extra))
    return rows


def _off_policy_fields(rows: list[Row], rng) -> None:
    """Version 3: each row's weight version (mostly shared by its rollout, sometimes missing) and metric
    (0/1 or a fraction, sometimes missing); some rows lose every trainable token."""
    version, metric = rng.randrange(6), rng.choice((0.0, 1.0, 0.5))
    for row in rows:
        if rng.random() < 0.3:
            version, metric = rng.randrange(6), rng.choice((0.0, 1.0, 0.25, True, False))
        kind = rng.randrange(30)
        row.version = None if kind == 0 else (math.nan if kind == 1 else float(version))
        row.metric = None if kind == 2 else float(metric)
        if rng.random() < 0.15:
            row.trainable = 0


def build_batch(knobs: dict, n: int | None, b: int | None, n_keys: int = 1) -> Batch:
    """One batch from a few drawn knobs and a seed (rows carry n_keys per-key values and a baseline)."""
    targets = [None]                      # None: whatever 1..5 rollouts give
    if n is not None:
        targets += [n, 2 * n, 3 * n]
        if b is not None:
            targets += [n * b, n * b]
    target = targets[knobs["target"] % len(targets)]
    rng = random.Random(knobs["seed"])
    extra = random.Random(knobs["seed"] + 1)

    rows: list[Row] = []
    n_rollouts = rng.randint(1, 5) if target is None else target
    for _ in range(n_rollouts):          # each rollout has >= 1 row: enough rows, then cut
        rows.extend(_rollout_rows(rng, knobs["group_index"], knobs["problem_rate"], extra, n_keys))
    if target is not None:
        rows = rows[:target]
    _off_policy_fields(rows, random.Random(knobs["seed"] + 2))
    if knobs["interleave"]:
        rng.shuffle(rows)

    group_sizes = None
    if knobs["sizes"] != "none":
        cuts = sorted(rng.randint(0, len(rows)) for _ in range(rng.randint(0, 4)))
        bounds = [0] + cuts + [len(rows)]
        group_sizes = [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]
        if knobs["sizes"] == "wrong":
            j = rng.randrange(len(group_sizes))
            group_sizes[j] = max(0, group_sizes[j] + rng.choice(WRONG_SIZE_DELTAS))
    return Batch(rows=rows, prompt_group_sizes=group_sizes)


BATCH_KNOBS = st.fixed_dictionaries({
    "target": st.integers(0, 5),
    "group_index": st.sampled_from(("none", "all", "partial")),
    "sizes": st.sampled_from(("none", "none", "right", "wrong")),
    "interleave": st.integers(0, 3).map(lambda x: x == 3),
    "problem_rate": st.sampled_from((0.0, 0.0, 0.05, 0.2)),
    "seed": st.integers(0, 2**32 - 1),
})


def _scenario(drawn):
    n, b, n_keys, knobs = drawn
    return n, b, [build_batch(k, n, b, n_keys) for k in knobs], n_keys


# (n_samples_per_prompt, rollout_batch_size, batches, number of reward keys)
SCENARIOS = st.tuples(st.sampled_from((None, 1, 2, 3, 4)), st.sampled_from((None, 1, 2, 3)),
                      st.sampled_from((1, 2, 3)),
                      st.lists(BATCH_KNOBS, min_size=1, max_size=8)).map(_scenario)


# ---------------------------------------------------------------- the property

# No shrink phase: shrinking these nested multi-batch inputs can take minutes per
# failing case; the failure message already prints the config and every row.
# RELABEL_PROPERTY_SCALE=20 (say) multiplies the example counts for a deeper local run.
SCALE = max(1.0, float(os.environ.get("RELABEL_PROPERTY_SCALE", "1")))
PROPERTY_SETTINGS = dict(deadline=None, derandomize=True, database=None, report_multiple_bugs=False,
                         phases=(Phase.explicit, Phase.generate),
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check_scenario(semantics, estimator, scenario, device):
    n, b, batches, n_keys = scenario
    inp = to_core_input(batches)
    # the per-key rewards reach only gdpo; the other estimators read each row's reward value
    keys = n_keys if estimator == "gdpo" else 0
    for config, drop in configs_for(semantics, estimator, n, b, keys):
        assert_core_matches_reference(batches, config, device, inp, drop)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("semantics", ["legacy-reshape", "group-index"])
@settings(max_examples=int(20 * SCALE), **PROPERTY_SETTINGS)
@given(scenario=SCENARIOS)
def test_core_matches_reference_row_units(semantics, estimator, device, scenario):
    _check_scenario(semantics, estimator, scenario, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("semantics", ["rollout-mainstream", "rollout-shared"])
@settings(max_examples=int(10 * SCALE), **PROPERTY_SETTINGS)
@given(scenario=SCENARIOS)
def test_core_matches_reference_rollouts(semantics, estimator, device, scenario):
    _check_scenario(semantics, estimator, scenario, device)


# ---------------------------------------------------------------- version 3: the off-policy options

OFF_POLICY_OPTIONS = list(itertools.product(
    ((None, None, "baseline-only"), (0, None, "baseline-only"), (1, None, "drop"), (0, 3, "drop"),
     (1, 4, "baseline-only")),                     # (max_staleness, current_version, stale_rows)
    ("baseline", "exclude"),                        # zero_mask_units
    ((None, False), ("0.2:0.8", False), ("0.3:1.0", True), ("-1.0:0.5", True)),  # (keep_band, metric column)
    (0.0, 0.15),                                    # uniform_tolerance
    (False, True),                                  # drop_uniform_groups
))
OFF_POLICY_PER_SCENARIO = 6


def _check_off_policy(semantics, estimator, scenario, device):
    n, b, batches, n_keys = scenario
    keys = KEY_NAMES[:n_keys] if estimator == "gdpo" else None
    pick = random.Random(len(batches) * 1009 + sum(len(batch.rows) for batch in batches))
    inputs = {}
    for (staleness, current, stale_rows), zero_mask, (band, metric), tolerance, drop in pick.sample(
            OFF_POLICY_OPTIONS, OFF_POLICY_PER_SCENARIO):
        for std in (True, False):
            config = CoreConfig(semantics=semantics, estimator=estimator, std_normalization=std,
                                n_samples_per_prompt=n, rollout_batch_size=b, reward_keys=keys,
                                max_staleness=staleness, current_version=current, stale_rows=stale_rows,
                                zero_mask_units=zero_mask, keep_band=band, uniform_tolerance=tolerance)
            if metric not in inputs:
                inputs[metric] = to_core_input(batches, metric)
            assert_core_matches_reference(batches, config, device, inputs[metric], drop, metric)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("semantics", ["group-index", "rollout-mainstream"])
@settings(max_examples=int(10 * SCALE), **PROPERTY_SETTINGS)
@given(scenario=SCENARIOS)
def test_off_policy_options_match_reference(semantics, estimator, device, scenario):
    _check_off_policy(semantics, estimator, scenario, device)


# ---------------------------------------------------------------- fixed cases through the core

def _worked_examples():
    ex1 = Batch([Row(0.0, 1, rollout_id=10)] + [Row(1.0, 1, rollout_id=11)] * 3
                + [Row(2.0, 1, rollout_id=20)] * 2 + [Row(4.0, 1, rollout_id=21)],
                prompt_group_sizes=[4, 3])
    ex3 = Batch([Row(0.0, 1, rollout_id=10), Row(2.0, 1, rollout_id=11), Row(6.0, 3, rollout_id=11)])
    ex4 = Batch([Row(2.0, 0, rollout_id=10), Row(8.0, 0, rollout_id=10), Row(6.0, 2, rollout_id=11)])
    ex5 = Batch([Row(100.0, 0, rollout_id=10), Row(2.0, 4, rollout_id=10), Row(6.0, 2, rollout_id=11)])
    return {"example-1": (ex1, [-0.5, 0.5, 0.5, 0.5, -1, -1, 1]),
            "example-3": (ex3, [-3, 3, 3]),
            "example-4": (ex4, [-2, -2, 2]),
            "example-5": (ex5, [-2, -2, 2])}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(_worked_examples()))
def test_worked_examples_through_core(name, device):
    batch, expected = _worked_examples()[name]
    config = CoreConfig(estimator="grpo", std_normalization=False)
    out = relabel_on(to_core_input([batch]), config, device)
    assert out.advantage.tolist() == pytest.approx(expected, abs=ADVANTAGE_TOL)
    assert_core_matches_reference([batch], config, device)


@pytest.mark.parametrize("device", DEVICES)
def test_worked_example_2_through_core(device):
    batch = Batch([Row(0.0, 1, rollout_id=10)] + [Row(1.0, 1, rollout_id=11)] * 3)
    config = CoreConfig(estimator="grpo")
    out = relabel_on(to_core_input([batch]), config, device)
    assert out.advantage.tolist() == pytest.approx([-0.7071, 0.7071, 0.7071, 0.7071], abs=1e-4)
    assert_core_matches_reference([batch], config, device)


FIXED = {
    # float32 overflow of an rloo advantage must be refused, not written as inf
    "float32-overflow": ([Batch([Row(3e38, 1, rollout_id=1), Row(-3e38, 1, rollout_id=2)])],
                         CoreConfig(estimator="rloo")),
    # a one-row legacy group with std normalization is non-finite
    "legacy-one-row": ([Batch([Row(1.0, 1), Row(2.0, 1)])],
                       CoreConfig(semantics="legacy-reshape", n_samples_per_prompt=1, rollout_batch_size=2)),
    # uniform fractional rewards: exactly 0, no std blow-up
    "uniform-fractional": ([Batch([Row(0.1, 1, rollout_id=r) for r in range(3)])], CoreConfig()),
    # an empty batch between two others contributes nothing
    "empty-batch-between": ([Batch([Row(1.0, 1, rollout_id=0), Row(3.0, 1, rollout_id=1)]), Batch([]),
                             Batch([Row(0.0, 2, rollout_id=0), Row(2.0, 1, rollout_id=1)])],
                            CoreConfig(std_normalization=False)),
    # rollout_id of one row equals index of another: same rollout
    "id-equals-index": ([Batch([Row(0.0, 1, index=5), Row(0.0, 2, rollout_id=5), Row(2.0, 1), Row(2.0, 1)])],
                        CoreConfig(std_normalization=False)),
    # a batch whose prompt_group_sizes overshoot its size is dead; the next batch's explicit
    # slices must not move (batches are independent)
    "sizes-overshoot-then-sizes": ([Batch([Row(0.0, 1, rollout_id=0)], prompt_group_sizes=[2]),
                                    Batch([Row(0.0, 1, rollout_id=0), Row(1.0, 1, rollout_id=1),
                                           Row(3.0, 1, rollout_id=1)], prompt_group_sizes=[3])],
                                   CoreConfig(std_normalization=False)),
    # zero-size prompt group entries are skipped
    "zero-sizes": ([Batch([Row(float(r), 1, rollout_id=r) for r in range(4)], prompt_group_sizes=[0, 2, 0, 2])],
                   CoreConfig(std_normalization=False)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_cases_through_core(name, device):
    batches, config = FIXED[name]
    assert_core_matches_reference(batches, config, device)


# ---------------------------------------------------------------- sparse keys take the sorting path

SPREAD = 10**12  # keys this far apart overflow the dense key tables: ids come from sorting instead


def _spread_keys(inp: CoreInput) -> CoreInput:
    """The same input with group_index and rollout keys spread apart, their order kept."""
    return dataclasses.replace(inp, group_index=inp.group_index * SPREAD + 7, rollout_key=inp.rollout_key * SPREAD - 3)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=int(20 * SCALE), **PROPERTY_SETTINGS)
@given(scenario=SCENARIOS)
def test_sparse_keys_relabel_like_compact_keys(device, scenario):
    _, _, batches, _ = scenario
    inp = to_core_input(batches)
    for config in (CoreConfig(), CoreConfig(semantics="group-index")):
        compact, sparse = relabel_on(inp, config, device), relabel_on(_spread_keys(inp), config, device)
        for field in dataclasses.fields(compact):
            assert np.asarray(getattr(sparse, field.name)).tolist() == np.asarray(
                getattr(compact, field.name)).tolist(), field.name
