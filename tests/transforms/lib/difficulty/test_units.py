"""A run's files -> one Tally per prompt: units as the semantics define them, rewards, steps, keys."""
import dataclasses
import hashlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout_relabel.transforms.core.config import CoreConfig
from rollout_relabel.transforms.lib.difficulty.difficulty_settings import ROLLOUTS, DifficultySettings
from rollout_relabel.transforms.lib.difficulty.units import Work, tally_pack, tally_states, tally_work
from rollout_relabel.transforms.lib.io.inputs import expand_inputs
from rollout_relabel.transforms.lib.settings import Labeling


def sha(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_fanned_out_run(folder):
    """Prompt "p0": rollout 10 stored as three rows (a fan-out) whose rewards disagree: its most-trainable
    row (5 tokens) has 0.0, its last row 1.0; rollout 11 one row, 1.0. Prompt "p1" at step 4: two rollouts,
    rewards 0.5 and 1.0. A null-reward row kills its prompt group ("p2")."""
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "step": [3, 3, 3, 3, 4, 4, 4, 4],
        "group_index": [0, 0, 0, 0, 1, 1, 2, 2],
        "rollout_id": [10, 10, 11, 10, 20, 21, 30, 31],
        "reward": [0.0, 0.0, 1.0, 1.0, 0.5, 1.0, None, 1.0],
        "response_length": [5, 1, 3, 2, 4, 4, 4, 4],
        "prompt": ["p0", "p0", "p0", "p0", "p1", "p1", "p2", "p2"],
    }), folder / "rollouts.parquet")
    return expand_inputs([str(folder)], str(folder.parent / "out"))


def tallies(entries, labeling=Labeling(), **options):
    settings = DifficultySettings(("in",), "out", labeling=labeling, **options)
    found = list(tally_work(Work("run-a", ROLLOUTS, labeling, tuple(entries)), settings))
    counts = found.pop()
    return {key: tally for key, tally in found}, counts


def test_a_fanned_out_rollout_counts_once_with_its_mainstream_rows_reward(tmp_path):
    found, counts = tallies(write_fanned_out_run(tmp_path / "run-a"))
    p0, p1 = found[(sha("p0"),)], found[(sha("p1"),)]
    assert (p0.units, p0.passes, p0.reward_sum) == (2, 1, 1.0)  # rollout 10 through its 5-token row: 0.0
    assert (p1.units, p1.passes, p1.reward_sum) == (2, 1, 1.5)
    assert (p0.first_step, p0.last_step, p1.first_step) == (3, 3, 4)
    assert (sha("p2"),) not in found  # its group is dead: a null reward
    assert counts == {"files": 1, "files_unreadable": 0, "rows_in": 8, "rows_dead": 2, "units": 4,
                      "units_without_key": 0}


def test_the_mainstream_policy_and_the_row_semantics_decide_the_unit(tmp_path):
    entries = write_fanned_out_run(tmp_path / "run-a")
    last = Labeling(CoreConfig(mainstream="last"))
    assert found_counts(tallies(entries, last)[0], "p0") == (2, 2)   # rollout 10's last row has 1.0
    rows = Labeling(CoreConfig("group-index"))
    assert found_counts(tallies(entries, rows)[0], "p0") == (4, 2)   # every row a unit


def found_counts(found, prompt):
    tally = found[(sha(prompt),)]
    return tally.units, tally.passes


def test_the_threshold_by_step_and_a_key_column(tmp_path):
    entries = write_fanned_out_run(tmp_path / "run-a")
    found, _ = tallies(entries, pass_threshold=0.5)
    assert found_counts(found, "p1") == (2, 2)
    by_step, _ = tallies(entries, by="step")
    assert set(by_step) == {(sha("p0"), 3), (sha("p1"), 4)}
    by_run, _ = tallies(entries, by="run")
    assert set(by_run) == {(sha("p0"), "run-a"), (sha("p1"), "run-a")}
    keyed, _ = tallies(entries, prompt_key="group_index")
    assert set(keyed) == {(0,), (1,)} and keyed[(0,)].prompt == "p0"


def test_prompts_given_by_tokens_are_keyed_by_their_int64_bytes(tmp_path):
    folder = tmp_path / "tokens"
    folder.mkdir()
    pq.write_table(pa.table({"group_index": [0, 0], "rollout_id": [1, 2], "reward": [1.0, 0.0],
                             "tokens": [[7, 8, 9, 100], [7, 8, 9, 200, 201]], "response_length": [1, 2]}),
                   folder / "r.parquet")
    found, _ = tallies(expand_inputs([str(folder)], str(tmp_path / "out")))
    key = hashlib.sha256((7).to_bytes(8, "little") + (8).to_bytes(8, "little") + (9).to_bytes(8, "little"))
    assert set(found) == {(key.hexdigest(),)}
    assert found[(key.hexdigest(),)].prompt == "[7,8,9]"


def test_a_file_without_any_prompt_is_left_out_and_counted(tmp_path):
    folder = tmp_path / "bare"
    folder.mkdir()
    pq.write_table(pa.table({"group_index": [0, 0], "reward": [1.0, 0.0]}), folder / "r.parquet")
    found, counts = tallies(expand_inputs([str(folder)], str(tmp_path / "out")))
    assert found == {} and counts["files_unreadable"] == 1


def write_step_files(folder, rows):
    """One Parquet file a row dict: each at step 3, prompt group 0, rollout 1, prompt "p"."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, row in rows.items():
        pq.write_table(pa.table({"step": [3], "group_index": [0], "rollout_id": [1], "prompt": ["p"], **row}),
                       folder / name)
    return tuple(expand_inputs([str(folder)], str(folder.parent / "out")))


def test_a_works_groups_are_labelled_alone_each_in_its_own_batches(tmp_path):
    # both files hold step 3: as one group they are one batch, where rollout 1 of group 0 is one unit (its
    # most trainable row: b's, reward 0); as two groups, each file is a batch of its own with a unit each
    entries = write_step_files(tmp_path / "run", {"a.parquet": {"reward": [1.0], "response_length": [2]},
                                                  "b.parquet": {"reward": [0.0], "response_length": [5]}})
    settings = DifficultySettings(("in",), "out")

    def p_counts(work):
        found = list(tally_work(work, settings))
        counts = found.pop()
        return found_counts(dict(found), "p"), counts["files"], counts["units"]

    assert p_counts(Work("run", ROLLOUTS, Labeling(), entries)) == ((1, 0), 2, 1)
    assert p_counts(Work("run", ROLLOUTS, Labeling(), entries, (2,))) == ((1, 0), 2, 1)
    assert p_counts(Work("run", ROLLOUTS, Labeling(), entries, (1, 1))) == ((2, 1), 2, 2)
    with pytest.raises(ValueError, match="do not add up"):
        Work("run", ROLLOUTS, Labeling(), entries, (1,)).groups()


def test_files_are_read_ahead_in_order_and_an_unreadable_one_between_is_counted(tmp_path):
    entries = write_step_files(tmp_path / "run", {"a.parquet": {"reward": [1.0]}, "c.parquet": {"reward": [0.0]}})
    (tmp_path / "run" / "b.parquet").write_bytes(b"not parquet")
    entries = tuple(expand_inputs([str(tmp_path / "run")], str(tmp_path / "out")))
    assert [e.path.rsplit("/", 1)[-1] for e in entries] == ["a.parquet", "b.parquet", "c.parquet"]
    settings = DifficultySettings(("in",), "out")
    found = list(tally_work(Work("run", ROLLOUTS, Labeling(), entries, (1, 1, 1)), settings))
    counts = found.pop()
    assert found_counts(dict(found), "p") == (2, 1)
    assert (counts["files"], counts["files_unreadable"], counts["rows_in"]) == (3, 1, 2)


def test_a_pack_tallies_each_work_alone_through_one_read_ahead(tmp_path):
    """Two runs' works in one pack: each gives its own tally batch (its run) and counts, in order, as each
    alone does; an unreadable file at the start of the second is counted there."""
    first = write_step_files(tmp_path / "run-a", {"a.parquet": {"reward": [1.0]}})
    write_step_files(tmp_path / "run-b", {"c.parquet": {"reward": [0.0]}})
    (tmp_path / "run-b" / "b.parquet").write_bytes(b"not parquet")
    second = tuple(expand_inputs([str(tmp_path / "run-b")], str(tmp_path / "out")))
    settings = DifficultySettings(("in",), "out")
    works = (Work("run-a", ROLLOUTS, Labeling(), first), Work("run-b", ROLLOUTS, Labeling(), second, (1, 1)))
    found = list(tally_pack(works, settings))
    assert [type(item) for item in found] == [pa.Table, dict, pa.Table, dict]
    assert [batch.column("seen_in").to_pylist() for batch in found[::2]] == [["run-a"], ["run-b"]]
    assert [(c["files"], c["files_unreadable"], c["units"]) for c in found[1::2]] == [(1, 0, 1), (2, 1, 1)]
    alone = [item for work in works for item in tally_states(work, settings)]
    assert all(a.equals(b) if isinstance(a, pa.Table) else a == b for a, b in zip(found, alone, strict=True))


def test_settings_refuse_filters_and_bad_values():
    with pytest.raises(ValueError, match="--drop-uniform-groups"):
        DifficultySettings(("in",), "out", labeling=dataclasses.replace(Labeling(), drop_uniform_groups=True))
    with pytest.raises(ValueError, match="--k must be 1 or more"):
        DifficultySettings(("in",), "out", ks=(0,))


def test_prompts_read_dictionary_encoded_key_as_plain_text_does_across_row_groups_and_nulls(tmp_path):
    folder = tmp_path / "run-a"
    folder.mkdir()
    prompts = ["p1", "p0", None, "p1", "p2", "p0"]
    pq.write_table(pa.table({"step": [1] * 6, "group_index": [0, 1, 2, 0, 3, 1], "rollout_id": list(range(6)),
                             "reward": [1.0, 0.0, 1.0, 0.5, 1.0, 1.0], "response_length": [2] * 6,
                             "prompt": prompts}), folder / "rows.parquet", row_group_size=2)
    found, counts = tallies(expand_inputs([str(folder)], str(tmp_path / "out")))
    assert {key[0]: (t.units, t.passes, t.reward_sum, t.prompt) for key, t in found.items()} == {
        sha("p0"): (2, 1, 1.0, "p0"), sha("p1"): (2, 1, 1.5, "p1"), sha("p2"): (1, 1, 1.0, "p2")}
    assert counts["units_without_key"] == 1  # the null prompt's row
    # a --column source keeps its values: grouped by the prompt's text, the groups are the prompts
    by_prompt = Labeling(columns=("group_index=prompt",))
    assert {key[0]: t.units for key, t in tallies(expand_inputs([str(folder)], str(tmp_path / "out")),
                                                  by_prompt)[0].items()} == {sha("p0"): 2, sha("p1"): 2, sha("p2"): 1}
