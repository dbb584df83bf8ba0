"""TallyDifficulty on TestPipeline: works of two runs -> one combined Tally per prompt, and the counts."""
import functools
import hashlib
import itertools
import math

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.testing.util import assert_that, equal_to

from rollout_relabel.transforms.lib.difficulty.difficulty_settings import EXISTING, ROLLOUTS, DifficultySettings
from rollout_relabel.transforms.lib.difficulty.table import build
from rollout_relabel.transforms.lib.difficulty.tally import Tally, exact_parts
from rollout_relabel.transforms.lib.difficulty.units import Work
from rollout_relabel.transforms.lib.io.inputs import expand_inputs
from rollout_relabel.transforms.lib.settings import Labeling
from rollout_relabel.transforms.tally_difficulty import (
    COUNTS,
    DifficultyCombineFn,
    TallyDifficulty,
    bucket_of,
)


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def run_files(folder, step, rewards):
    """One step: prompt "a" with rollouts of `rewards`, prompt "b" with one rollout of reward 1."""
    folder.mkdir(parents=True)
    n = len(rewards)
    pq.write_table(pa.table({"step": [step] * (n + 1), "group_index": [0] * n + [1],
                             "rollout_id": list(range(n + 1)), "reward": [*rewards, 1.0],
                             "prompt": ["a"] * n + ["b"]}), folder / "s.parquet")
    return tuple(expand_inputs([str(folder)], str(folder.parent / "out")))


def test_tally_difficulty_combines_every_group_of_every_run(tmp_path, test_pipeline):
    settings = DifficultySettings(("x",), "out")
    existing = tmp_path / "table.parquet"
    # a table written before: prompt "a" seen in one run, 4 units, 1 pass, steps 0..0
    pq.write_table(build([((sha("a"),), Tally(4, 1, [1.0], (), 1, 0, 0, "a"))], None, ()), existing)
    existing_entry = expand_inputs([str(existing)], str(tmp_path / "out"))[0]
    # two packs: the table's rows, then both runs in one (one read-ahead thread across them)
    packs = [(Work("", EXISTING, Labeling(), (existing_entry,)),),
             (Work("r1", ROLLOUTS, Labeling(), run_files(tmp_path / "r1", 5, [1.0, 0.0, 0.5])),
              Work("r2", ROLLOUTS, Labeling(), run_files(tmp_path / "r2", 9, [1.0, 1.0])))]
    outputs = test_pipeline | beam.Create(packs) | TallyDifficulty(settings)
    shown = outputs["tallies"] | beam.FlatMapTuple(
        lambda bucket, rows: [(key[0], *row, bucket == bucket_of(key)) for key, row in rows])
    assert_that(shown, equal_to([(sha("a"), 9, 4, (4.5,), 3, 0, 9, "a", True),
                                (sha("b"), 2, 2, (2.0,), 2, 5, 9, "b", True)]))
    units = outputs[COUNTS] | beam.Map(lambda c: (c["files"], c["units"], c["rows_dead"]))
    assert_that(units, equal_to([(1, 4, 0), (1, 3, 0)]), label="counts")
    test_pipeline.run().wait_until_finish()



def test_combine_fn_merges_batches_key_by_key_in_any_split_and_order():
    def state(*args):
        return Tally(*args).state_args()

    batches = [[(("a",), state(2, 1, [0.1], ("r1",), 0, 3, 3, "a2")),
                (("b",), state(1, 1, [1.0], ("r1",), 0, 3, 3, "b"))],
               [(("a",), state(1, 0, [0.2], ("r2",), 0, 1, 1, "a1"))],
               [(("a",), state(3, 3, [0.3, 1e-20], (), 2, None, None, None)),
                (("c",), state(1, 0, [], ("r2",), 0, 7, 7, None))]]
    fn = DifficultyCombineFn()

    def combined(order, split):
        inputs = [batches[i] for i in order]
        parts = [functools.reduce(fn.add_input, inputs[:split], fn.create_accumulator()),
                 functools.reduce(fn.add_input, inputs[split:], fn.create_accumulator())]
        return sorted(fn.extract_output(fn.merge_accumulators(parts)))

    whole = combined([0, 1, 2], 3)
    exact = tuple(exact_parts([0.1, 0.2, 0.3, 1e-20]))  # the exact sum, canonical: a pure function of it
    assert exact[0] == math.fsum([0.1, 0.2, 0.3, 1e-20]) and len(exact) == 3
    assert whole == [(("a",), (6, 4, exact, 4, 1, 3, "a1")),
                     (("b",), (1, 1, (1.0,), 1, 3, 3, "b")),
                     (("c",), (1, 0, (), 1, 7, 7, None))]
    for order in itertools.permutations(range(3)):
        for split in range(4):
            assert combined(order, split) == whole
