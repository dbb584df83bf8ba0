"""Checks of the plain-Python oracle itself, from docs/semantics.md's worked examples and rules."""
from __future__ import annotations

import math

import pytest

from rollout_relabel.transforms.core.config import CoreConfig
from tests.reference import Batch, Row, batch_counters, reference_relabel, to_float32


def advantages(results):
    return [r.advantage for r in results]


def approx(values, tol=1e-5):
    return pytest.approx(values, abs=tol)


def example_1_batch():
    rows = [
        Row(0.0, 1, rollout_id=10),
        Row(1.0, 1, rollout_id=11), Row(1.0, 1, rollout_id=11), Row(1.0, 1, rollout_id=11),
        Row(2.0, 1, rollout_id=20), Row(2.0, 1, rollout_id=20),
        Row(4.0, 1, rollout_id=21),
    ]
    return Batch(rows, prompt_group_sizes=[4, 3])


@pytest.mark.parametrize("semantics", ["rollout-mainstream", "rollout-shared"])
def test_example_1_unequal_fan_out_no_std(semantics):
    config = CoreConfig(semantics=semantics, estimator="grpo", std_normalization=False)
    [out] = reference_relabel([example_1_batch()], config)
    assert advantages(out) == approx([-0.5, 0.5, 0.5, 0.5, -1, -1, 1])
    assert [r.prompt_group for r in out] == [0, 0, 0, 0, 1, 1, 1]
    assert [r.rollout_mask_sum for r in out] == [1, 3, 3, 3, 2, 2, 1]
    assert [r.mainstream for r in out] == [True, True, False, False, True, False, True]
    assert batch_counters(out) == (2, 4, 0)


def test_example_1_by_group_index():
    batch = example_1_batch()
    for row, g in zip(batch.rows, [7, 7, 7, 7, 3, 3, 3]):
        row.group_index = g
    batch.prompt_group_sizes = None
    config = CoreConfig(estimator="grpo", std_normalization=False)
    [out] = reference_relabel([batch], config)
    assert advantages(out) == approx([-0.5, 0.5, 0.5, 0.5, -1, -1, 1])
    assert [r.prompt_group for r in out] == [0, 0, 0, 0, 1, 1, 1]


def test_example_2_std():
    rows = [Row(0.0, 1, rollout_id=10)] + [Row(1.0, 1, rollout_id=11) for _ in range(3)]
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="grpo"))
    assert advantages(out) == approx([-0.7071, 0.7071, 0.7071, 0.7071], tol=1e-4)
    exact = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert advantages(out) == [to_float32(-exact)] + [to_float32(exact)] * 3


def test_example_3_mainstream_choice():
    rows = [Row(0.0, 1, rollout_id=10), Row(2.0, 1, rollout_id=11), Row(6.0, 3, rollout_id=11)]
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="grpo", std_normalization=False))
    assert advantages(out) == [-3.0, 3.0, 3.0]
    assert [r.mainstream for r in out] == [True, False, True]
    assert [r.rollout_mask_sum for r in out] == [1, 4, 4]
    # mainstream=last picks the same row here; shared refuses the differing siblings
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="grpo", std_normalization=False,
                                                        mainstream="last"))
    assert advantages(out) == [-3.0, 3.0, 3.0]
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="grpo", mainstream="shared"))
    assert {r.problem for r in out} == {"sibling-reward-mismatch"}
    assert advantages(out) == [None, None, None]


def test_example_4_ties_go_to_earliest():
    rows = [Row(2.0, 0, rollout_id=10), Row(8.0, 0, rollout_id=10), Row(6.0, 2, rollout_id=11)]
    config = CoreConfig(estimator="grpo", std_normalization=False)
    [out] = reference_relabel([Batch(rows)], config)
    assert advantages(out) == [-2.0, -2.0, 2.0]
    assert [r.mainstream for r in out] == [True, False, True]
    # the `last` policy takes the reward-8 row instead: mean 7
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="grpo", std_normalization=False,
                                                        mainstream="last"))
    assert advantages(out) == [1.0, 1.0, -1.0]
    assert [r.mainstream for r in out] == [False, True, True]


def test_example_5_remove_sample():
    rows = [Row(100.0, 0, rollout_id=10), Row(2.0, 4, rollout_id=10), Row(6.0, 2, rollout_id=11)]
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="grpo", std_normalization=False))
    assert advantages(out) == [-2.0, -2.0, 2.0]
    assert [r.rollout_mask_sum for r in out] == [4, 4, 2]


def test_legacy_reshape_whole_batch_when_sizes_do_not_match():
    rows = [Row(float(r), 1) for r in [0, 1, 2, 3, 4]]
    config = CoreConfig(semantics="legacy-reshape", std_normalization=False,
                        n_samples_per_prompt=2, rollout_batch_size=2)
    [out] = reference_relabel([Batch(rows)], config)
    assert advantages(out) == [-2.0, -1.0, 0.0, 1.0, 2.0]
    assert {r.prompt_group for r in out} == {0}
    # N == n*B: slices
    [out] = reference_relabel([Batch(rows[:4])], config)
    assert advantages(out) == [-0.5, 0.5, -0.5, 0.5]
    assert [r.prompt_group for r in out] == [0, 0, 1, 1]


def test_legacy_reshape_one_row_group_with_std_is_dead():
    config = CoreConfig(semantics="legacy-reshape", n_samples_per_prompt=1, rollout_batch_size=2)
    [out] = reference_relabel([Batch([Row(1.0, 1), Row(2.0, 1)])], config)
    assert [r.problem for r in out] == ["non-finite-advantage"] * 2
    assert batch_counters(out) == (0, 0, 0)
    # without std the centred value is 0
    config = CoreConfig(semantics="legacy-reshape", std_normalization=False,
                        n_samples_per_prompt=1, rollout_batch_size=2)
    [out] = reference_relabel([Batch([Row(1.0, 1), Row(2.0, 1)])], config)
    assert advantages(out) == [0.0, 0.0]


def test_legacy_reshape_has_no_rollout_dedup():
    rows = [Row(0.0, 1, rollout_id=1), Row(0.0, 1, rollout_id=1), Row(3.0, 1, rollout_id=2)]
    config = CoreConfig(semantics="legacy-reshape", std_normalization=False)
    [out] = reference_relabel([Batch(rows)], config)
    assert advantages(out) == [-1.0, -1.0, 2.0]
    assert all(r.mainstream for r in out)
    assert [r.rollout_mask_sum for r in out] == [2, 2, 1]


def test_group_index_one_row_group_is_zero_not_nan():
    rows = [Row(5.0, 1, group_index=0), Row(1.0, 1, group_index=1), Row(3.0, 1, group_index=1)]
    [out] = reference_relabel([Batch(rows)], CoreConfig(semantics="group-index"))
    assert out[0].advantage == 0.0
    assert out[1].advantage == pytest.approx(-1 / (math.sqrt(2) + 1e-6))
    assert [r.prompt_group for r in out] == [0, 1, 1]


def test_group_index_batch_problems():
    partial = Batch([Row(1.0, 1, group_index=0), Row(1.0, 1)])
    [out] = reference_relabel([partial], CoreConfig(semantics="group-index", n_samples_per_prompt=2))
    assert [r.problem for r in out] == ["partial-group-index"] * 2
    plain = Batch([Row(1.0, 1), Row(2.0, 1), Row(3.0, 1)])
    [out] = reference_relabel([plain], CoreConfig(semantics="group-index"))
    assert [r.problem for r in out] == ["missing-n-samples-per-prompt"] * 3
    [out] = reference_relabel([plain], CoreConfig(semantics="group-index", n_samples_per_prompt=2))
    assert [r.problem for r in out] == ["batch-size-not-multiple"] * 3
    [out] = reference_relabel([plain], CoreConfig(semantics="group-index", n_samples_per_prompt=3,
                                                  std_normalization=False))
    assert advantages(out) == [-1.0, 0.0, 1.0]


def test_group_index_groups_need_not_be_contiguous():
    rows = [Row(1.0, 1, group_index=9), Row(4.0, 1, group_index=2), Row(3.0, 1, group_index=9)]
    config = CoreConfig(semantics="group-index", std_normalization=False)
    [out] = reference_relabel([Batch(rows)], config)
    assert advantages(out) == [-1.0, 0.0, 1.0]
    assert [r.prompt_group for r in out] == [0, 1, 0]


def test_rollout_group_sizes_mismatch_and_zero_sizes():
    rows = [Row(float(r), 1, rollout_id=r) for r in range(4)]
    config = CoreConfig(std_normalization=False)
    [out] = reference_relabel([Batch(rows, prompt_group_sizes=[2, 1])], config)
    assert [r.problem for r in out] == ["group-sizes-mismatch"] * 4
    [out] = reference_relabel([Batch(rows, prompt_group_sizes=[0, 2, 0, 2])], config)
    assert advantages(out) == [-0.5, 0.5, -0.5, 0.5]
    assert [r.prompt_group for r in out] == [0, 0, 1, 1]


def test_rollout_rule_c_and_partial_group_index_is_not_a_problem():
    rows = [Row(float(r), 1, rollout_id=r, group_index=0 if r else None) for r in range(4)]
    config = CoreConfig(std_normalization=False, n_samples_per_prompt=2, rollout_batch_size=2)
    [out] = reference_relabel([Batch(rows)], config)
    assert advantages(out) == [-0.5, 0.5, -0.5, 0.5]
    config = CoreConfig(std_normalization=False, n_samples_per_prompt=2)
    [out] = reference_relabel([Batch(rows)], config)
    assert advantages(out) == [-1.5, -0.5, 0.5, 1.5]


def test_uniform_fractional_rewards_are_exactly_zero():
    rows = [Row(0.1, 1, rollout_id=r) for r in range(3)] + [Row(0.3, 1, rollout_id=9)]
    config = CoreConfig()
    [out] = reference_relabel([Batch(rows, prompt_group_sizes=[3, 1])], config)
    assert advantages(out) == [0.0, 0.0, 0.0, 0.0]
    assert [r.uniform for r in out] == [True, True, True, False]
    assert batch_counters(out) == (2, 4, 1)


def test_rollout_std_skipped_for_single_rollout():
    rows = [Row(1.0, 1, rollout_id=1), Row(3.0, 2, rollout_id=1)]
    [out] = reference_relabel([Batch(rows)], CoreConfig())
    assert advantages(out) == [0.0, 0.0]
    assert [r.uniform for r in out] == [False, False]
    assert batch_counters(out) == (1, 1, 0)


def test_rloo():
    rows = [Row(float(r), 1, rollout_id=r) for r in [0, 1, 5]]
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="rloo"))
    # r_i minus the mean of the others
    assert advantages(out) == approx([0 - 3, 1 - 2.5, 5 - 0.5])
    [out] = reference_relabel([Batch(rows[:1])], CoreConfig(estimator="rloo"))
    assert advantages(out) == [0.0]


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus_baseline", "dr_grpo"])
def test_centre_only_ignores_std(estimator):
    rows = [Row(float(r), 1, rollout_id=r) for r in [0, 4]]
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator=estimator, std_normalization=True))
    assert advantages(out) == [-2.0, 2.0]


def test_pass_through_gives_each_row_its_own_reward():
    rows = [Row(0.1, 1, rollout_id=1), Row(7.0, 5, rollout_id=1), Row(0.5, 1, rollout_id=2)]
    for config in (CoreConfig(estimator="ppo"), CoreConfig(rewards_normalization=False)):
        [out] = reference_relabel([Batch(rows)], config)
        assert advantages(out) == [to_float32(0.1), 7.0, 0.5]
        assert [r.mainstream for r in out] == [False, True, True]


def test_row_problem_kills_its_group_with_first_reason():
    rows = [Row(1.0, 1, rollout_id=1), Row(math.nan, 1, rollout_id=2, problem="non-finite-reward"),
            Row(2.0, 1, rollout_id=3, problem="mask-length"),
            Row(2.0, 1, rollout_id=4), Row(4.0, 1, rollout_id=5)]
    config = CoreConfig(std_normalization=False)
    [out] = reference_relabel([Batch(rows, prompt_group_sizes=[3, 2])], config)
    assert [r.problem for r in out] == ["non-finite-reward"] * 3 + ["", ""]
    assert advantages(out) == [None, None, None, -1.0, 1.0]
    assert batch_counters(out) == (1, 2, 0)


def test_row_problem_beats_sibling_mismatch():
    rows = [Row(1.0, 1, rollout_id=1), Row(2.0, 1, rollout_id=1, problem="mask-length")]
    [out] = reference_relabel([Batch(rows)], CoreConfig(semantics="rollout-shared"))
    assert [r.problem for r in out] == ["mask-length", "mask-length"]


def test_batch_problem_beats_row_problem_and_batches_are_independent():
    bad = Batch([Row(1.0, 1, problem="mask-length"), Row(1.0, 1)], prompt_group_sizes=[3])
    good = Batch([Row(1.0, 1, rollout_id=0), Row(3.0, 1, rollout_id=1)])
    out = reference_relabel([bad, Batch([]), good], CoreConfig(std_normalization=False))
    assert [r.problem for r in out[0]] == ["group-sizes-mismatch"] * 2
    assert out[1] == []
    assert advantages(out[2]) == [-1.0, 1.0]


def test_rollout_keys_are_per_group_and_fall_back_to_index():
    rows = [Row(0.0, 1, rollout_id=None, index=5), Row(0.0, 2, rollout_id=5),
            Row(2.0, 1), Row(2.0, 1),
            Row(9.0, 3, rollout_id=5)]
    config = CoreConfig(std_normalization=False)
    [out] = reference_relabel([Batch(rows, prompt_group_sizes=[4, 1])], config)
    # group 0: rollout 5 (two rows, reward 0) and two keyless rows (reward 2 each): mean 4/3
    assert advantages(out)[:4] == approx([-4 / 3, -4 / 3, 2 / 3, 2 / 3])
    assert [r.rollout_mask_sum for r in out] == [3, 3, 1, 1, 3]
    assert [r.mainstream for r in out] == [False, True, True, True, True]
    assert batch_counters(out) == (2, 4, 0)


def test_float32_overflow_is_non_finite():
    rows = [Row(3e38, 1, rollout_id=1), Row(-3e38, 1, rollout_id=2)]
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="rloo"))
    assert [r.problem for r in out] == ["non-finite-advantage"] * 2


# ---------------------------------------------------------------- version 2: estimators from the wider field

STD_1_EPS = 1 / (1 + 1e-6)


def wider_batch():
    """group 0: rewards [1, 0, 2] with 3, 1, 2 tokens; group 1: one row, reward 3."""
    return Batch([Row(1.0, 3, group_index=0), Row(0.0, 1, group_index=0), Row(2.0, 2, group_index=0),
                  Row(3.0, 1, group_index=1)])


@pytest.mark.parametrize("estimator,singletons,expected", [
    ("grpo", "zero", [0.0, -STD_1_EPS, STD_1_EPS, 0.0]),
    ("grpo", "raw", [0.0, -STD_1_EPS, STD_1_EPS, 3 * STD_1_EPS]),
    ("grpo", "raw-no-std", [0.0, -1.0, 1.0, 3.0]),
    ("reinforce_plus_plus_baseline", "raw", [0.0, -1.0, 1.0, 3.0]),
    ("rloo", "zero", [0.0, -1.5, 1.5, 0.0]),
    ("rloo", "raw", [0.0, -1.5, 1.5, 3.0]),
    ("opo", "zero", [-1 / 6, -7 / 6, 5 / 6, 0.0]),
    ("opo", "raw", [-1 / 6, -7 / 6, 5 / 6, 3.0]),
    ("gpg", "zero", [0.0, -4 / 3, 4 / 3, 0.0]),
    ("gpg", "raw", [0.0, -4 / 3, 4 / 3, 4.0]),
])
def test_wider_estimators_one_unit_rule(estimator, singletons, expected):
    std = singletons != "raw-no-std"
    config = CoreConfig(semantics="group-index", estimator=estimator, std_normalization=std,
                        singleton_groups=singletons.removesuffix("-no-std"))
    [out] = reference_relabel([wider_batch()], config)
    assert advantages(out) == approx(expected)


def test_singleton_raw_under_rollout_semantics():
    rows = [Row(2.0, 1, rollout_id=1), Row(2.0, 5, rollout_id=1)]     # one rollout of two rows
    [out] = reference_relabel([Batch(rows)], CoreConfig(singleton_groups="raw"))
    assert advantages(out) == [to_float32(2 / (1 + 1e-6))] * 2


def test_grpo_passk_ties_and_singletons():
    def run(rewards, std=True):
        rows = [Row(r, 1, group_index=0) for r in rewards]
        [out] = reference_relabel([Batch(rows)], CoreConfig(semantics="group-index", estimator="grpo_passk",
                                                            std_normalization=std))
        return out
    assert advantages(run([1.0, 0.0, 2.0])) == approx([0, 0, STD_1_EPS])
    assert advantages(run([1.0, 0.0, 2.0], std=False)) == [0.0, 0.0, 1.0]
    assert advantages(run([5.0, 1.0, 1.0])) == approx([4 / (math.sqrt(16 / 3) + 1e-6), 0, 0])
    assert advantages(run([2.0, 0.0, 2.0, 1.0])) == [0.0] * 4         # tie at the top
    assert [r.problem for r in run([4.0])] == ["passk-singleton-group"]


def test_opo_gpg_details():
    no_tokens = Batch([Row(1.0, 0, group_index=0), Row(0.0, 0, group_index=0)])
    [out] = reference_relabel([no_tokens], CoreConfig(semantics="group-index", estimator="opo"))
    assert advantages(out) == [0.0, 0.0]
    # gpg: alpha counts the units of live groups only
    rows = [Row(1.0, 1, group_index=0), Row(0.0, 1, group_index=0), Row(0.0, 1, group_index=1),
            Row(0.0, 1, group_index=1), Row(5.0, 1, group_index=2, problem="mask-length")]
    [out] = reference_relabel([Batch(rows)], CoreConfig(semantics="group-index", estimator="gpg"))
    assert advantages(out) == [2.0, -2.0, 0.0, 0.0, None]


def test_remax():
    rows = [Row(1.0, 1, rollout_id=1, baseline=0.5), Row(0.0, 1, rollout_id=2, baseline=0.5),
            Row(2.0, 1, rollout_id=3, baseline=0.25), Row(2.0, 0, rollout_id=3, baseline=None)]
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="remax"))
    assert advantages(out) == [0.5, -0.5, 1.75, 1.75]
    rows[2].baseline = math.inf
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="remax"))
    assert [r.problem for r in out] == ["missing-baseline"] * 4


def gdpo_batch():
    return Batch([Row(1.0, 3, group_index=0, parts=[1.0, 0.0]), Row(0.0, 1, group_index=0, parts=[0.0, 0.0]),
                  Row(2.0, 2, group_index=0, parts=[1.0, 1.0])])


@pytest.mark.parametrize("weights,expected", [
    (None, [-0.221404, -1.549826, 1.107019]),          # docs/semantics.md's worked example
    ((2.0, -1.0), [0.816497, -1.632993, -0.408248]),
])
def test_gdpo_worked_example(weights, expected):
    config = CoreConfig(semantics="group-index", estimator="gdpo", reward_keys=("a", "b"), reward_weights=weights)
    [out] = reference_relabel([gdpo_batch()], config)
    assert advantages(out) == approx(expected, tol=1e-6)


def test_gdpo_batch_level_rules():
    config = CoreConfig(semantics="group-index", estimator="gdpo", reward_keys=("a",))
    few = Batch([Row(1.0, 1, group_index=0, parts=[1.0]), Row(0.0, 0, group_index=0, parts=[0.0])])
    [out] = reference_relabel([few], config)
    assert [r.problem for r in out] == ["gdpo-too-few-tokens"] * 2
    # a uniform group is whitened with the rest, unless it is filtered: then it is out of mu and sigma
    batch = Batch(gdpo_batch().rows[:2] + [Row(0.0, 5, group_index=1, parts=[1.0]),
                                           Row(0.0, 5, group_index=1, parts=[1.0])])
    [kept] = reference_relabel([batch], config)
    [dropped] = reference_relabel([batch], config, drop_uniform_groups=True)
    assert [r.uniform for r in kept] == [False, False, True, True]
    assert advantages(kept)[2] != 0.0
    # filtered: only rows 0, 1 are written (S = +-0.707106, m = 3, 1)
    assert advantages(dropped)[:2] != advantages(kept)[:2]
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    mu = (3 * s - s) / (4 + 1e-8)
    var = (3 * (s - mu) ** 2 + (-s - mu) ** 2) / (4 + 1e-8) * 4 / 3
    assert advantages(dropped)[:2] == approx([(s - mu) / math.sqrt(var + 1e-8), (-s - mu) / math.sqrt(var + 1e-8)])


# ---- version 3 of the contract, hand-computed

def test_remax_is_per_unit():
    rows = [Row(1.0, 1, rollout_id=1, baseline=0.0), Row(1.0, 1, rollout_id=2, baseline=0.5)]
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="remax"))
    assert advantages(out) == [1.0, 0.5]  # equal rewards, different baselines: not 0
    [out] = reference_relabel([Batch(rows[:1])], CoreConfig(estimator="remax", singleton_groups="raw"))
    assert advantages(out) == [1.0]


def test_grpo_loo():
    rows = [Row(float(r), 1, rollout_id=i) for i, r in enumerate([1, 0, 0])]
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="grpo_loo"))
    # the 1: others (0, 0), s = 0, A = 1; a 0: others (1, 0), b = 0.5, s = 0.707107, A = -0.5 / (s + 1e-6)
    assert advantages(out) == approx([1.0, -0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6)])
    [out] = reference_relabel([Batch(rows)], CoreConfig(estimator="grpo_loo", std_normalization=False))
    assert advantages(out) == [1.0, -0.5, -0.5]
    [out] = reference_relabel([Batch(rows[:2])], CoreConfig(estimator="grpo_loo"))
    assert advantages(out) == [1.0, -1.0]  # k = 2: s = 0
    [out] = reference_relabel([Batch(rows[:1])], CoreConfig(estimator="grpo_loo", singleton_groups="raw"))
    assert advantages(out) == [0.0]


def test_staleness_and_filters():
    rows = [Row(1.0, 1, rollout_id=1, version=5), Row(0.0, 1, rollout_id=2, version=3),
            Row(1.0, 1, rollout_id=3, version=4), Row(0.0, 0, rollout_id=4, version=5)]
    config = CoreConfig(std_normalization=False, max_staleness=1)
    [out] = reference_relabel([Batch(rows)], config)
    assert advantages(out) == [0.5, -0.5, 0.5, -0.5] and [r.filtered for r in out] == ["", "stale", "", ""]
    [out] = reference_relabel([Batch(rows)], CoreConfig(std_normalization=False, max_staleness=1, stale_rows="drop",
                                                        zero_mask_units="exclude"))
    assert advantages(out) == [0.0, 0.0, 0.0, 0.0]  # the stats hold (1, 1): uniform
    assert [r.uniform for r in out] == [True] * 4
    [out] = reference_relabel([Batch(rows)], CoreConfig(std_normalization=False, keep_band="0.6:1"))
    assert [r.filtered for r in out] == ["metric-band"] * 4  # mean reward 0.5
