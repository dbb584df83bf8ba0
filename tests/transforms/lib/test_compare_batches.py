"""The comparison's pure parts: counting one batch, merging batches in any order, the report's files."""
import io
import json
import random

import numpy as np
import pyarrow as pa
import pytest

from transforms.lib import compare_batches as comparison
from transforms.lib import compare_report as comparison_report
from transforms.lib.compare_batches import compare_batch, summarize
from transforms.lib.settings import Labeling, Side
from transforms.core.config import CoreConfig
from transforms.write_compare_report import SummarizeFn


def slim(rewards, groups, rollouts, rows=None):
    n = len(rewards)
    return pa.table({"row": pa.array(rows if rows is not None else list(range(n)), pa.int64()),
                     "reward": pa.array(rewards, pa.float64()), "trainable": pa.array([1] * n, pa.int64()),
                     "group_index": pa.array(groups, pa.int64()), "rollout_key": pa.array(rollouts, pa.int64()),
                     "problem": pa.array([0] * n, pa.int64()), "detail": pa.nulls(n, pa.string())})


A = Side(Labeling(CoreConfig("group-index", std_normalization=False)), spec="group-index,std=off")
B = Side(Labeling(CoreConfig("rollout-mainstream", std_normalization=False)), spec="rollout-mainstream,std=off")


def test_one_batch_split_over_two_files_is_counted_per_row():
    # group 0: rollout 1 (r 1, 2 rows), rollout 2 (r 0); group 1: rollouts 3 (r 1), 4 (r 1)
    # row units (A): group 0 mean 2/3 -> [1/3, 1/3, -2/3]; rollouts (B): mean 1/2 -> [1/2, 1/2, -1/2]
    # group 1 is uniform: 0 under both
    parts = [("f1", slim([1.0, 1.0], [0, 0], [1, 1])), ("f2", slim([0.0, 1.0, 1.0], [0, 1, 1], [2, 3, 4]))]
    result = compare_batch("step=3", parts, None, A, B, {"f1": "one", "f2": "two"})
    r = result.record
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
    assert len(whole.points) == comparison.SAMPLE_POINTS
    assert [p[0] for p in whole.points] == sorted(p[0] for p in whole.points)
    chosen = set(np.argsort(keys[:3000], kind="stable")[:comparison.SAMPLE_POINTS].tolist())
    assert {p[2] for p in whole.points} == chosen


def _records():
    parts = {k: [("f", slim([1.0, 0.0, float(k), 2.0], [0, 0, 1, 1], [1, 2, 3, 4]))] for k in range(6)}
    return [compare_batch(f"step={k}", parts[k], None, A, B, {"f": f"file{k}"}) for k in range(6)]


def test_the_report_does_not_depend_on_arrival_order():
    results = _records()
    fn = SummarizeFn(A.record(), B.record())
    reports = []
    for seed in range(3):
        items = [(kind, item) for r in results for kind, item in
                 [("batches", r.record)] + [("groups", g) for g in r.groups] + [("points", p) for p in r.points]]
        items += [("files", {"name": "f", "rows": 24, "reason": None, "message": None})]
        random.Random(seed).shuffle(items)
        halves = [fn.create_accumulator(), fn.create_accumulator()]
        for i, item in enumerate(items):
            fn.add_input(halves[i % 2], item)
        reports.append(json.dumps(fn.extract_output(fn.merge_accumulators(halves)), sort_keys=True))
    assert reports[0] == reports[1] == reports[2]
    report = json.loads(reports[0])
    assert [s["label"] for s in report["steps"]] == ["0", "1", "2", "3", "4", "5"]
    assert report["totals"]["rows"] == 24 and report["totals"]["batches"] == 6


def _report():
    results = _records()
    return summarize([r.record for r in results], [{"name": "f", "rows": 24, "reason": None, "message": None}],
                     [g for r in results for g in r.groups], [p for r in results for p in r.points],
                     A.record(), B.record())


def _pixel_std(png: bytes) -> float:
    import matplotlib.image

    return float(np.std(matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3]))


def test_render_writes_every_file_and_plots_are_not_blank():
    files = comparison_report.render(_report())
    assert set(files) == {"report.json", "report.md", *comparison_report.PLOTS}
    for name in comparison_report.PLOTS:
        assert files[name].startswith(b"\x89PNG") and _pixel_std(files[name]) > 0.05, name
    md = files["report.md"].decode()
    assert "- **A**: group-index, estimator grpo, std off (`group-index,std=off`)" in md
    assert md.count("\n| 5 | 4 | 4 |") == 1  # the step table lists step 5
    assert comparison_report.render(_report()) == files  # same report, same bytes (PNGs included)


def test_an_empty_comparison_still_renders():
    report = summarize([], [{"name": "bad", "rows": 0, "reason": "unreadable-file", "message": "bad: not Parquet"}],
                       [], [], A.record(), B.record())
    assert report["totals"]["files_unreadable"] == 1
    assert report["totals"]["dead_a_by_reason"] == {"unreadable-file (file)": 1}
    files = comparison_report.render(report)
    assert "- bad: unreadable-file: bad: not Parquet" in files["report.md"].decode()
    assert _pixel_std(files["scatter.png"]) > 0.05
