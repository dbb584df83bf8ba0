"""ReadRollouts: input files -> slim per-batch tables keyed by batch, file records, dead letters (shuffle path)."""
import os

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from rollout_relabel.transforms.gather_batches import GatherBatches
from rollout_relabel.transforms.group_advantages import GroupAdvantages
from rollout_relabel.transforms.read_rollouts import ReadRollouts
from tests.conftest import FIXTURES
from tests.matchers import advantages_by_source, dead_reasons
from tests.transforms.stage_inputs import dead_rows, file_read, record, run_settings, write


def slim_part(element):
    """(batch key, (source, slim, sizes)) -> (batch key, file name, row count, first 3 rows, their rewards, sizes);
    a file batch's key shows the file's name only."""
    key, (source, slim, sizes) = element
    kind, _, value = key.partition("=")
    return (f"{kind}={os.path.basename(value)}", os.path.basename(source), slim.num_rows,
            slim.column("row").to_pylist()[:3], slim.column("reward").to_pylist()[:3], sizes)


def test_files_become_slim_parts_keyed_by_batch(test_pipeline, tmp_path):
    stepped = write(tmp_path / "a.parquet", step=[3, 3, 4], reward=[1.0, 2.0, 3.0], tokens=[[1], [2], [3]])
    dump = os.path.join(FIXTURES, "miles_rollout_data", "0.pt")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with test_pipeline as p:
        read = p | beam.Create([record(stepped), record(dump), record(broken)]) | ReadRollouts(run_settings(tmp_path))
        assert_that(read.slim | beam.Map(slim_part), equal_to([
            ("step=3", "a.parquet", 2, [0, 1], [1.0, 2.0], None),
            ("step=4", "a.parquet", 1, [2], [3.0], None),
            # a dump is one batch; its prompt_group_sizes travel with it
            ("file=0.pt", "0.pt", 74, [0, 1, 2], [0.0, 0.0, 0.0], [18, 14, 10, 12, 8, 12]),
        ]))
        assert_that(read.files | "Reads" >> beam.Map(file_read), equal_to([
            ("a.parquet", 3, None, True), ("0.pt", 74, None, True), ("broken.parquet", 0, "unreadable-file", False)]),
            label="FileRecords")
        assert_that(read.dead | "DeadRows" >> beam.FlatMap(dead_rows),
                    equal_to([("broken.parquet", None, "unreadable-file", None)]), label="DeadLetters")


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
