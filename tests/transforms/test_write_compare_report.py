"""WriteCompareReport: CompareLabelings' outputs -> report.json, report.md and the plots; yields the totals."""
import json
import random

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from rollout_relabel.transforms.write_compare_report import SummarizeFn, WriteCompareReport
from tests.transforms.lib.compare_builders import ONE_FILE, A, B, six_steps


def test_the_report_does_not_depend_on_arrival_order():
    results = six_steps()
    fn = SummarizeFn(A.record(), B.record())
    reports = []
    for seed in range(3):
        items = [(kind, item) for r in results for kind, item in
                 [("batches", r.counts)] + [("groups", g) for g in r.groups] + [("points", p) for p in r.points]]
        items += [("files", ONE_FILE)]
        random.Random(seed).shuffle(items)
        halves = [fn.create_accumulator(), fn.create_accumulator()]
        for i, item in enumerate(items):
            fn.add_input(halves[i % 2], item)
        reports.append(json.dumps(fn.extract_output(fn.merge_accumulators(halves)), sort_keys=True))
    assert reports[0] == reports[1] == reports[2]
    report = json.loads(reports[0])
    assert [s["label"] for s in report["steps"]] == ["0", "1", "2", "3", "4", "5"]
    assert report["totals"]["rows"] == 24 and report["totals"]["batches"] == 6


def _totals_summary(totals):
    return (totals["rows"], totals["batches"], totals["files"], totals["compared"], totals["agree"],
            totals["wrong_sign"], totals["groups_differing"])


def test_stage_writes_the_report_and_yields_its_totals(test_pipeline, tmp_path):
    results = six_steps()
    directory = tmp_path / "report"
    with test_pipeline as p:
        outputs = {
            "batches": p | "Batches" >> beam.Create([r.counts for r in results]),
            "files": p | "Files" >> beam.Create([ONE_FILE]),
            "groups": p | "Groups" >> beam.Create([g for r in results for g in r.groups]),
            # emitted by a DoFn, untyped, as CompareLabelings emits them: a sample key is a uint64, above the
            # range of the VarIntCoder that Create would infer for Tuple[int, ...]
            "points": p | "Start" >> beam.Create([None]) | "Points" >> beam.FlatMap(
                lambda _, points: points, [point for r in results for point in r.points]),
        }
        totals = outputs | WriteCompareReport(str(directory), A.record(), B.record())
        assert_that(totals | beam.Map(_totals_summary), equal_to([(24, 6, 1, 24, 24, 0, 0)]))
    assert sorted(f.name for f in directory.iterdir()) == [
        "group_sizes.png", "report.json", "report.md", "scatter.png", "wrong_sign_by_step.png"]
    report = json.loads((directory / "report.json").read_text())
    assert [s["label"] for s in report["steps"]] == ["0", "1", "2", "3", "4", "5"]
    assert (report["a"]["spec"], report["b"]["spec"]) == ("group-index,std=off", "rollout-mainstream,std=off")
    assert report["totals"]["rows_in_files"] == 24
    assert "- **A**: group-index, estimator grpo, std off (`group-index,std=off`)" in (
        directory / "report.md").read_text()
