"""GatherBatches: the slim parts of one batch, from any number of files, brought together in source order."""
import apache_beam as beam
import pyarrow as pa
from apache_beam.testing.util import assert_that, equal_to

from rollout_relabel.transforms.gather_batches import GatherBatches


def part(rows):
    return pa.table({"row": pa.array(rows, pa.int64())})


def gathered(element):
    """(batch key, ([(source, slim)], sizes)) -> (batch key, [(source, rows)], sizes)."""
    key, (parts, sizes) = element
    return key, [(source, slim.column("row").to_pylist()) for source, slim in parts], sizes


def test_parts_of_a_batch_meet_sorted_by_source_with_their_sizes(test_pipeline):
    keyed = [("step=0", ("c.parquet", part([4]), None)),
             ("step=0", ("a.parquet", part([0, 1]), None)),
             ("step=1", ("a.parquet", part([2]), None)),
             ("step=0", ("b.pt", part([0, 1, 2]), [2, 1])),   # a dump's prompt_group_sizes
             ("file=d.parquet", ("d.parquet", part([0]), None))]
    with test_pipeline as p:
        batches = p | beam.Create(keyed) | GatherBatches()
        assert_that(batches | beam.Map(gathered), equal_to([
            ("step=0", [("a.parquet", [0, 1]), ("b.pt", [0, 1, 2]), ("c.parquet", [4])], [2, 1]),
            ("step=1", [("a.parquet", [2])], None),
            ("file=d.parquet", [("d.parquet", [0])], None),
        ]))
