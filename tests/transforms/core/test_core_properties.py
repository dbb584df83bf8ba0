"""Property test: the torch core agrees with the plain-Python oracle (tests/reference.py).

Random multi-batch inputs (uneven fan-out, missing rollout keys, full/absent/
partial group_index, right and wrong prompt_group_sizes, ties in trainable
tokens, repeated rewards, occasional row problems) are relabelled by both, for
every semantics x estimator x std flag x mainstream policy x rewards
normalization.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reference import Batch, Row, batch_counters, reference_relabel
from transforms.core.config import CoreConfig
from transforms.core.reasons import REASONS
from transforms.core.relabel import relabel
from transforms.core.types import CoreInput

ESTIMATORS = ("grpo", "gspo", "cispo", "dr_grpo", "reinforce_plus_plus_baseline", "rloo", "ppo")
SEMANTICS = ("legacy-reshape", "group-index", "rollout-mainstream", "rollout-shared")
ROW_PROBLEMS = ("non-finite-reward", "mask-length", "non-numeric-reward", "missing-column",
                "missing-reward-key", "duplicate-row", "negative-length")
ADVANTAGE_TOL = 1e-5


# ---------------------------------------------------------------- adapter: oracle rows -> core tensors

def to_core_input(batches: list[Batch]) -> CoreInput:
    batch_ids, reward, trainable, group_index, has_group_index = [], [], [], [], []
    rollout_key, has_rollout_key, row_problem = [], [], []
    for b, batch in enumerate(batches):
        for row in batch.rows:
            batch_ids.append(b)
            reward.append(row.reward)
            trainable.append(row.trainable)
            group_index.append(0 if row.group_index is None else row.group_index)
            has_group_index.append(row.group_index is not None)
            key = row.rollout_id if row.rollout_id is not None else row.index
            rollout_key.append(0 if key is None else key)
            has_rollout_key.append(key is not None)
            row_problem.append(REASONS.index(row.problem))
    i64 = torch.int64
    return CoreInput(
        batch=torch.tensor(batch_ids, dtype=i64),
        reward=torch.tensor(reward, dtype=torch.float64),
        trainable=torch.tensor(trainable, dtype=i64),
        mask_sum=torch.tensor(trainable, dtype=i64),
        group_index=torch.tensor(group_index, dtype=i64),
        has_group_index=torch.tensor(has_group_index, dtype=torch.bool),
        rollout_key=torch.tensor(rollout_key, dtype=i64),
        has_rollout_key=torch.tensor(has_rollout_key, dtype=torch.bool),
        row_problem=torch.tensor(row_problem, dtype=i64),
        num_batches=len(batches),
        prompt_group_sizes=[None if batch.prompt_group_sizes is None
                            else torch.tensor(batch.prompt_group_sizes, dtype=i64)
                            for batch in batches],
    )


def configs_for(semantics: str, estimator: str, n: int | None, b: int | None):
    policies = [None] if semantics in ("legacy-reshape", "group-index") else [
        None, "most-trainable", "last", "shared"]
    for std, normalize, policy in itertools.product((True, False), (True, False), policies):
        yield CoreConfig(semantics=semantics, estimator=estimator, std_normalization=std,
                         rewards_normalization=normalize, mainstream=policy,
                         n_samples_per_prompt=n, rollout_batch_size=b)


def describe(batches: list[Batch], config: CoreConfig) -> str:
    lines = [repr(config)]
    for k, batch in enumerate(batches):
        lines.append(f"batch {k}: prompt_group_sizes={batch.prompt_group_sizes}")
        lines.extend(f"  {i}: {row}" for i, row in enumerate(batch.rows))
    return "\n".join(lines)


def assert_core_matches_reference(batches: list[Batch], config: CoreConfig,
                                  inp: CoreInput | None = None) -> None:
    expected = reference_relabel(batches, config)
    out = relabel(to_core_input(batches) if inp is None else inp, config)
    try:
        _compare(expected, out)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{describe(batches, config)}") from None


def _compare(expected, out) -> None:
    flat = [r for per_batch in expected for r in per_batch]
    assert out.advantage.shape == (len(flat),)
    assert out.advantage.dtype == torch.float32
    problem = out.problem.tolist()
    advantage = out.advantage.tolist()
    mainstream = out.mainstream.tolist()
    prompt_group = out.prompt_group.tolist()
    mask_sum = out.rollout_mask_sum.tolist()
    uniform = out.uniform.tolist()
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
    counters = [batch_counters(per_batch) for per_batch in expected]
    got = list(zip(out.groups.tolist(), out.units.tolist(), out.uniform_groups.tolist()))
    assert got == counters, f"counters (groups, units, uniform_groups) per batch: core {got}, reference {counters}"


# ---------------------------------------------------------------- strategies

REWARDS = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0]),
    st.sampled_from([0.0, 1.0]),
    st.sampled_from([0.1, 0.2, 0.3, -1.0, 2.0]),
    st.floats(-10, 10, allow_nan=False, allow_infinity=False, allow_subnormal=False),
)


PROBLEM_OR_NOT = st.sampled_from([""] * 24 + list(ROW_PROBLEMS))  # shrinks towards ""
NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])
WRONG_SIZE_DELTAS = (-2, -1, 1, 2)


@st.composite
def rollout_rows(draw, gi_mode: str) -> list[Row]:
    """The rows of one rollout (fan-out 1..5), rewards mostly shared, keys often colliding."""
    fan_out = draw(st.integers(1, 5))
    key_kind = draw(st.sampled_from(["id", "index", "both", "none"]))
    key, other = draw(st.integers(0, 4)), draw(st.integers(0, 4))
    rollout_id = key if key_kind in ("id", "both") else None
    index = key if key_kind == "index" else (other if key_kind == "both" else None)
    shared_reward = draw(st.integers(0, 3)) > 0
    base_reward = draw(REWARDS)
    group = draw(st.integers(0, 3))
    rows = []
    for _ in range(fan_out):
        reward = base_reward if shared_reward else draw(REWARDS)
        if gi_mode == "all":
            group_index = group if draw(st.integers(0, 4)) else draw(st.integers(0, 3))
        elif gi_mode == "partial":
            group_index = draw(st.one_of(st.none(), st.integers(0, 3)))
        else:
            group_index = None
        problem = draw(PROBLEM_OR_NOT)
        if problem == "non-finite-reward":
            reward = draw(NON_FINITE)
        rows.append(Row(reward=reward, trainable=draw(st.integers(0, 3)), group_index=group_index,
                        rollout_id=rollout_id, index=index, problem=problem))
    return rows


@st.composite
def batches_strategy(draw, n: int | None, b: int | None) -> Batch:
    targets = [None]                      # None: whatever the rollouts give
    if n is not None:
        targets += [n, 2 * n, 3 * n]
        if b is not None:
            targets += [n * b, n * b]
    target = draw(st.sampled_from(targets))
    gi_mode = draw(st.sampled_from(["none", "all", "partial"]))
    if target is None:
        rollouts = draw(st.lists(rollout_rows(gi_mode), min_size=1, max_size=5))
    else:                                 # each rollout has >= 1 row: enough rows, then cut
        rollouts = draw(st.lists(rollout_rows(gi_mode), min_size=target, max_size=target))
    rows = [row for rollout in rollouts for row in rollout]
    if target is not None:
        rows = rows[:target]
    if draw(st.integers(0, 3)) == 3:      # interleave rollouts sometimes
        rows = list(draw(st.permutations(rows)))

    sizes_mode = draw(st.sampled_from(["none", "none", "right", "wrong"]))
    group_sizes = None
    if sizes_mode != "none":
        cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=4)))
        bounds = [0] + cuts + [len(rows)]
        group_sizes = [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]
        if sizes_mode == "wrong":
            delta = draw(st.sampled_from(WRONG_SIZE_DELTAS))
            j = draw(st.integers(0, len(group_sizes) - 1))
            group_sizes[j] = max(0, group_sizes[j] + delta)
    return Batch(rows=rows, prompt_group_sizes=group_sizes)


@st.composite
def scenarios(draw):
    n = draw(st.sampled_from([None, 1, 2, 3, 4]))
    b = draw(st.sampled_from([None, 1, 2, 3]))
    batches = draw(st.lists(batches_strategy(n, b), min_size=1, max_size=3))
    return n, b, batches


# ---------------------------------------------------------------- the property

@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("semantics", SEMANTICS)
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario=scenarios())
def test_core_matches_reference(semantics, estimator, scenario):
    n, b, batches = scenario
    inp = to_core_input(batches)
    for config in configs_for(semantics, estimator, n, b):
        assert_core_matches_reference(batches, config, inp)


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


@pytest.mark.parametrize("name", sorted(_worked_examples()))
def test_worked_examples_through_core(name):
    batch, expected = _worked_examples()[name]
    config = CoreConfig(estimator="grpo", std_normalization=False)
    out = relabel(to_core_input([batch]), config)
    assert out.advantage.tolist() == pytest.approx(expected, abs=ADVANTAGE_TOL)
    assert_core_matches_reference([batch], config)


def test_worked_example_2_through_core():
    batch = Batch([Row(0.0, 1, rollout_id=10)] + [Row(1.0, 1, rollout_id=11)] * 3)
    config = CoreConfig(estimator="grpo")
    out = relabel(to_core_input([batch]), config)
    assert out.advantage.tolist() == pytest.approx([-0.7071, 0.7071, 0.7071, 0.7071], abs=1e-4)
    assert_core_matches_reference([batch], config)


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
    # zero-size prompt group entries are skipped
    "zero-sizes": ([Batch([Row(float(r), 1, rollout_id=r) for r in range(4)], prompt_group_sizes=[0, 2, 0, 2])],
                   CoreConfig(std_normalization=False)),
}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_cases_through_core(name):
    batches, config = FIXED[name]
    assert_core_matches_reference(batches, config)
