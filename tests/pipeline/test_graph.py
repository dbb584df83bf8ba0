"""Each stage and the whole graph on TestPipeline, checked with assert_that."""
import json
import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.testing.util import assert_that

from pipeline.graph import build
from transforms.lib.inputs import expand_inputs
from transforms.lib.settings import Labeling, RunSettings
from tests.matchers import advantages_by_source, dead_reasons, manifest_counts
from transforms.core.config import CoreConfig
from transforms.gather_batches import GatherBatches
from transforms.group_advantages import GroupAdvantages
from transforms.read_rollouts import ReadRollouts


def write(path, **columns):
    pq.write_table(pa.table(columns), path)
    return str(path)


def run_settings(tmp_path, core=None, **changes):
    return RunSettings(inputs=(str(tmp_path),), output=str(tmp_path / "out"), labeling=Labeling(core or CoreConfig()),
                       device="cpu", **changes)


def record(path):
    return {"path": path, "output": "part-x.parquet", "size": 0, "mtime": 0.0}


def test_read_gather_and_group_advantages(test_pipeline, tmp_path):
    # one step spread over two files: worked example 1 of SEMANTICS.md
    a = write(tmp_path / "a.parquet", step=[0, 0, 0], group_index=[0, 0, 1], rollout_id=[10, 11, 20],
              reward=[0.0, 1.0, 2.0])
    b = write(tmp_path / "b.parquet", step=[0, 0, 0, 0], group_index=[0, 0, 1, 1], rollout_id=[11, 11, 20, 21],
              reward=[1.0, 1.0, 2.0, 4.0])
    with test_pipeline as p:
        read = p | beam.Create([record(a), record(b)]) | ReadRollouts(run_settings(tmp_path))
        computed = (read.slim | GatherBatches()
                    | GroupAdvantages(run_settings(tmp_path, CoreConfig(std_normalization=False))))
        assert_that(computed.results, advantages_by_source({a: [-0.5, 0.5, -1.0], b: [0.5, 0.5, -1.0, 1.0]}))
        assert_that(computed.dead, dead_reasons({}), label="NoDeadLetters")


def test_bad_file_and_bad_rows_are_dead_lettered(test_pipeline, tmp_path):
    good = write(tmp_path / "good.parquet", group_index=[0, 0, 1, 1], rollout_id=[1, 2, 3, 4],
                 reward=[1.0, float("nan"), 0.0, 1.0])
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with test_pipeline as p:
        read = p | beam.Create([record(good), record(str(broken))]) | ReadRollouts(run_settings(tmp_path))
        computed = read.slim | GatherBatches() | GroupAdvantages(run_settings(tmp_path))
        dead = (read.dead, computed.dead) | beam.Flatten()
        assert_that(dead, dead_reasons({"non-finite-reward": 2, "unreadable-file": 1}))
        assert_that(computed.results, advantages_by_source({good: [-0.7071063, 0.7071063]}), label="GoodGroup")


def test_whole_graph_writes_outputs_and_manifest(test_pipeline, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    write(src / "0.parquet", group_index=[0, 0, 0, 0], rollout_id=[10, 11, 11, 11], reward=[0.0, 1.0, 1.0, 1.0])
    write(src / "1.parquet", group_index=[0, 0], rollout_id=[1, 1], reward=[3.0, float("inf")])
    out = tmp_path / "out"
    out.mkdir()
    settings = RunSettings(inputs=(str(src),), output=str(out),
                           labeling=Labeling(CoreConfig(std_normalization=False)), device="cpu")
    files = expand_inputs(settings.inputs, settings.output)
    with test_pipeline as p:
        manifest = build(p, settings, files)
        assert_that(manifest, manifest_counts(rows_in=6, rows_out=4, rows_dead=2, groups=1, rollouts=2, batches=2))
    written = json.loads((out / "_manifest.json").read_text())
    assert written["dead_letters"]["by_reason"] == {"non-finite-reward": 2}
    assert pq.read_table(out / "part-0.parquet").column("advantage").to_pylist() == [-0.5, 0.5, 0.5, 0.5]
    assert pq.read_table(out / "part-1.parquet").num_rows == 0
    assert pq.read_table(out / "dead_letters.parquet").column("row").to_pylist() == [0, 1]


def test_shuffle_path_and_one_pass_path_write_identical_files(tmp_path, monkeypatch):
    from apache_beam.testing.test_pipeline import TestPipeline

    import pipeline.graph as graph
    from pipeline.generate import RunSpec, write_pt_run, write_parquet_run

    src = tmp_path / "in"
    write_parquet_run(RunSpec(steps=2, prompts_per_step=3, seed=5), src / "pq")
    write_pt_run(RunSpec(steps=1, prompts_per_step=3, seed=5), src / "pt", flavor="miles")
    (src / "pq" / "x.parquet").write_bytes(b"junk")
    pq.write_table(pa.table({"reward": [1.0, float("nan"), 0.0], "rollout_id": [1, 2, 3]}), src / "pq" / "y.parquet")
    outputs = {}
    for path, split in (("one_pass", lambda files: ([files], [])), ("shuffle", lambda files: ([], files))):
        monkeypatch.setattr(graph, "group_by_batch_sharing", split)
        out = tmp_path / path
        out.mkdir()
        settings = RunSettings(inputs=(str(src),), output=str(out), device="cpu",
                               labeling=Labeling(CoreConfig(), drop_uniform_groups=True))
        with TestPipeline(runner="FnApiRunner") as p:
            build(p, settings, expand_inputs(settings.inputs, settings.output))
        outputs[path] = {n: (out / n).read_bytes() for n in sorted(os.listdir(out))}
    assert "dead_letters.parquet" in outputs["one_pass"] and "filtered.parquet" in outputs["one_pass"]
    assert outputs["one_pass"] == outputs["shuffle"]
