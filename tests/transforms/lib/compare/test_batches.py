"""The comparison's pure parts: counting one batch, the sample, and the summary of every batch."""
import numpy as np
import pytest

from rollout_relabel.transforms.lib.compare import batches as comparison
from rollout_relabel.transforms.lib.compare.batches import compare_batch, summarize
from tests.transforms.lib.compare_builders import ONE_FILE, A, B, six_steps, slim


def test_one_batch_split_over_two_files_is_counted_per_row():
    # group 0: rollout 1 (r 1, 2 rows), rollout 2 (r 0); group 1: rollouts 3 (r 1), 4 (r 1)
    # row units (A): group 0 mean 2/3 -> [1/3, 1/3, -2/3]; rollouts (B): mean 1/2 -> [1/2, 1/2, -1/2]
    # group 1 is uniform: 0 under both
    parts = [("f1", slim([1.0, 1.0], [0, 0], [1, 1])), ("f2", slim([0.0, 1.0, 1.0], [0, 1, 1], [2, 3, 4]))]
    result = compare_batch("step=3", parts, None, A, B, {"f1": "one", "f2": "two"})
    r = result.counts
    assert (r["step"], r["label"], r["rows"], r["compared"], r["agree"], r["wrong_sign"]) == (3, "3", 5, 5, 2, 0)
    assert (r["nonzero_a"], r["nonzero_b"], r["groups_differing"]) == (3, 3, 1)
    assert r["max_abs_delta"] == pytest.approx(1 / 6, abs=1e-6)
    assert r["sum_abs_delta"] == pytest.approx(3 / 6, abs=1e-6)
    assert r["group_sizes"] == {"3": [1, 1], "2": [1, 0]}
    [group] = result.groups
    assert (group["first_row"], group["rows"], group["rollouts"], group["max_fanout"]) == ("one:0", 3, 2, 2)
    assert sorted((p[1], p[2]) for p in result.points) == [("one", 0), ("one", 1), ("two", 0), ("two", 1), ("two", 2)]


def test_the_sample_is_the_rows_with_the_smallest_keys():
    keys = comparison.sample_keys("f", np.arange(10_000))
    assert len(np.unique(keys)) == 10_000
    rewards = [float(i % 3) for i in range(3000)]
    whole = compare_batch("step=0", [("f", slim(rewards, [i // 6 for i in range(3000)], list(range(3000))))],
                          None, A, B, {"f": "f"})
    assert len(whole.points) == 2000  # README: "at most 2000 compared rows"
    assert [p[0] for p in whole.points] == sorted(p[0] for p in whole.points)
    chosen = set(np.argsort(keys[:3000], kind="stable")[:2000].tolist())
    assert {p[2] for p in whole.points} == chosen


def test_summary_of_six_steps():
    # each step: group 0 = rewards [1, 0] (A = B = [1/2, -1/2]); group 1 = rewards [k, 2]: A = B as well
    # (one row per rollout), uniform at k = 2
    results = six_steps()
    report = summarize([r.counts for r in reversed(results)], [ONE_FILE], [g for r in results for g in r.groups],
                       [p for r in results for p in r.points], A.record(), B.record())
    assert [s["label"] for s in report["steps"]] == ["0", "1", "2", "3", "4", "5"]
    t = report["totals"]
    assert (t["rows"], t["batches"], t["compared"], t["agree"], t["wrong_sign"]) == (24, 6, 24, 24, 0)
    assert (t["groups_differing"], t["files"], t["files_unreadable"]) == (0, 1, 0)
    assert report["definitions"]["agree"] == "|a - b| <= 1e-06 + 1e-05 * |b|"
    assert len(report["scatter_sample"]["points"]) == 24
