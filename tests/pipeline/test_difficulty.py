"""`relabel difficulty` end to end: the table against a direct computation over generated runs, runs
combined, an incremental rerun byte-identical to a full one, training rows and Delta tables as inputs,
--keep, and the usage errors."""
import dataclasses
import hashlib
import os
from collections import defaultdict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout_relabel.pipeline.generate import RunSpec, write_parquet_run, write_pt_run
from tests.conftest import run_cli

SPEC = RunSpec(steps=3, prompts_per_step=5, samples_per_prompt=6, seed=41)
TABLE = "part-00000.parquet"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs over the same prompts (one seed) whose rewards differ (the share of unsolved prompts
    falls from run to run); the last one also as miles .pt dumps."""
    root = tmp_path_factory.mktemp("difficulty")
    for name, rate in (("run-1", 0.6), ("run-2", 0.3), ("run-3", 0.1)):
        write_parquet_run(dataclasses.replace(SPEC, zero_reward_group_rate=rate), root / name)
    write_pt_run(dataclasses.replace(SPEC, steps=2), root / "dumps", flavor="miles")
    return root


def table(folder):
    return pq.read_table(os.path.join(folder, TABLE))


def rows_by_key(t):
    return {row["prompt_key"]: row for row in t.to_pylist()}


def direct(folder, threshold=1.0):
    """Units, passes per prompt, computed row by row from the contract's words: rows in (file path,
    position) order; a rollout is the rows of one prompt group (step, group_index) sharing rollout_id,
    else index (neither: a rollout alone); its reward is its row with the most trainable tokens, the
    first on a tie (trainable: 0 if remove_sample, else sum(loss_mask), else response_length); the key is
    the SHA-256 of the prompt text's UTF-8 bytes."""
    rows = []
    for name in sorted(os.listdir(folder)):
        rows += pq.read_table(os.path.join(folder, name)).to_pylist()
    rollouts = {}
    for position, row in enumerate(rows):
        key = row["rollout_id"] if row["rollout_id"] is not None else row["index"]
        rollout = (row["step"], row["group_index"], key if key is not None else ("alone", position))
        trainable = 0 if row["remove_sample"] else (
            sum(row["loss_mask"]) if row["loss_mask"] is not None else row["response_length"])
        best = rollouts.get(rollout)
        if best is None or trainable > best[0]:
            rollouts[rollout] = (trainable, row["reward"], row["prompt"])
    counts = defaultdict(lambda: [0, 0])
    for _, reward, prompt in rollouts.values():
        found = counts[hashlib.sha256(prompt.encode("utf-8")).hexdigest()]
        found[0] += 1
        found[1] += reward >= threshold
    return {key: (n, c, c / n) for key, (n, c) in counts.items()}


def test_rollouts_passes_and_pass_rate_equal_a_direct_computation(runs, tmp_path):
    run_cli("difficulty", "--input", runs / "run-2", "--output", tmp_path / "t")
    got = {k: (r["rollouts"], r["passes"], r["pass_rate"]) for k, r in rows_by_key(table(tmp_path / "t")).items()}
    assert got == direct(runs / "run-2")
    run_cli("difficulty", "--input", runs / "run-2", "--output", tmp_path / "half", "--pass-threshold", "0.5")
    got = {k: (r["rollouts"], r["passes"], r["pass_rate"]) for k, r in rows_by_key(table(tmp_path / "half")).items()}
    assert got == direct(runs / "run-2", threshold=0.5)


def test_two_runs_combined_add_up_per_prompt(runs, tmp_path):
    for name in ("run-1", "run-2"):
        run_cli("difficulty", "--input", runs / name, "--output", tmp_path / name, "--k", "4")
    run_cli("difficulty", "--input", runs / "run-1", runs / "run-2", "--output", tmp_path / "both", "--k", "4")
    one, two, both = (rows_by_key(table(tmp_path / n)) for n in ("run-1", "run-2", "both"))
    assert set(both) == set(one) | set(two) and set(one) == set(two)  # one seed: the same prompts
    for key, row in both.items():
        a, b = one[key], two[key]
        assert row["rollouts"] == a["rollouts"] + b["rollouts"]
        assert row["passes"] == a["passes"] + b["passes"]
        assert row["pass_rate"] == row["passes"] / row["rollouts"]
        assert row["mean_reward"] == (a["mean_reward"] * a["rollouts"] + b["mean_reward"] * b["rollouts"]) / (
            row["rollouts"])
        assert row["runs"] == 2
        assert (row["first_step"], row["last_step"]) == (min(a["first_step"], b["first_step"]),
                                                         max(a["last_step"], b["last_step"]))
    assert {r["runs"] for r in one.values()} == {1}


def test_an_incremental_rerun_equals_a_full_run_byte_for_byte(runs, tmp_path):
    options = ("--k", "1,4", "--by", "run")
    everything = [runs / "run-1", runs / "run-2", runs / "run-3"]
    run_cli("difficulty", "--input", *everything, "--output", tmp_path / "full", *options)
    run_cli("difficulty", "--input", runs / "run-1", "--output", tmp_path / "inc", *options)
    out = run_cli("difficulty", "--input", *everything, "--output", tmp_path / "inc", *options).stdout
    assert "2 added (run-2, run-3), 1 already in the table" in out
    assert (tmp_path / "inc" / TABLE).read_bytes() == (tmp_path / "full" / TABLE).read_bytes()
    # the same again: nothing to add, nothing rewritten
    before = os.stat(tmp_path / "inc" / TABLE).st_mtime_ns
    out = run_cli("difficulty", "--input", *everything, "--output", tmp_path / "inc", *options).stdout
    assert "already complete" in out and os.stat(tmp_path / "inc" / TABLE).st_mtime_ns == before
    assert sorted(os.listdir(tmp_path / "inc")) == [TABLE]


def test_the_same_inputs_give_the_same_bytes(runs, tmp_path):
    for name in ("a", "b"):
        run_cli("difficulty", "--input", runs / "run-3", runs / "dumps", "--output", tmp_path / name, "--by", "step")
    assert (tmp_path / "a" / TABLE).read_bytes() == (tmp_path / "b" / TABLE).read_bytes()


def test_runs_groups_are_packed_into_elements_and_the_table_does_not_depend_on_the_packing(runs, tmp_path,
                                                                                           monkeypatch):
    from rollout_relabel.pipeline import difficulty as command
    from rollout_relabel.transforms.lib.difficulty.difficulty_settings import DifficultySettings

    one, two = command.resolve_runs(DifficultySettings((str(runs / "run-1"), str(runs / "run-2")), str(tmp_path / "t")))
    groups = command.plan(one)
    assert len(groups) == SPEC.steps
    ((work, other),) = command.packs([one, two])  # small runs: one element, a work a run
    assert work.entries == tuple(f for g in groups for f in g) and work.group_sizes == tuple(map(len, groups))
    assert (work.run, other.run) == ("run-1", "run-2") and other.group_sizes == tuple(map(len, command.plan(two)))
    inputs = (runs / "run-1", runs / "run-2", runs / "dumps")
    run_cli("difficulty", "--input", *inputs, "--output", tmp_path / "packed", "--by", "step")
    monkeypatch.setattr(command, "PACK_BYTES", 1)  # every group an element of its own
    assert [[w.group_sizes for w in pack] for pack in command.packs([one])] == [[(len(g),)] for g in groups]
    run_cli("difficulty", "--input", *inputs, "--output", tmp_path / "apart", "--by", "step")
    assert (tmp_path / "packed" / TABLE).read_bytes() == (tmp_path / "apart" / TABLE).read_bytes()


def test_a_run_whose_input_changed_is_refused_and_overwrite_rebuilds(runs, tmp_path):
    import shutil
    run = tmp_path / "run-1"
    shutil.copytree(runs / "run-1", run)
    run_cli("difficulty", "--input", run, "--output", tmp_path / "t")
    first = sorted(os.listdir(run))[0]
    pq.write_table(pq.read_table(run / first).slice(0, 10), run / first)
    proc = run_cli("difficulty", "--input", run, "--output", tmp_path / "t", check_codes=(2,))
    assert "run run-1" in proc.stderr and "changed since the table counted it" in proc.stderr
    assert "--overwrite" in proc.stderr
    run_cli("difficulty", "--input", run, "--output", tmp_path / "t", "--overwrite")
    run_cli("difficulty", "--input", run, "--output", tmp_path / "fresh")
    assert (tmp_path / "t" / TABLE).read_bytes() == (tmp_path / "fresh" / TABLE).read_bytes()


def test_runs_that_share_a_file_or_a_name_are_refused(runs, tmp_path):
    proc = run_cli("difficulty", "--input", runs, runs / "run-1", "--output", tmp_path / "t", check_codes=(2,))
    assert "a file belongs to one run" in proc.stderr
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "run-1").symlink_to(runs / "run-2")
    proc = run_cli("difficulty", "--input", runs / "run-1", tmp_path / "other" / "run-1", "--output", tmp_path / "t",
                   check_codes=(2,))
    assert "are both named run 'run-1'" in proc.stderr


def test_other_table_options_are_refused(runs, tmp_path):
    run_cli("difficulty", "--input", runs / "run-1", "--output", tmp_path / "t")
    proc = run_cli("difficulty", "--input", runs / "run-2", "--output", tmp_path / "t", "--pass-threshold", "0.5",
                   check_codes=(2,))
    assert "made with other options" in proc.stderr


def test_keep_writes_the_keys_and_prompts_passing_the_expression(runs, tmp_path):
    run_cli("difficulty", "--input", runs / "run-1", runs / "run-2", "--output", tmp_path / "t", "--k", "4",
            "--keep", "0 < pass_rate < 1 and (pass_at_k_4 >= 0.5 or runs > 5)")
    full = table(tmp_path / "t").to_pylist()
    expected = [{"prompt_key": r["prompt_key"], "prompt": r["prompt"]} for r in full
                if 0 < r["pass_rate"] < 1 and r["pass_at_k_4"] >= 0.5]
    assert expected and len(expected) < len(full)
    assert pq.read_table(tmp_path / "t" / "kept.parquet").to_pylist() == expected


def test_a_bad_keep_expression_is_a_usage_error_naming_its_position_and_writes_nothing(runs, tmp_path):
    proc = run_cli("difficulty", "--input", runs / "run-1", "--output", tmp_path / "t", "--keep",
                   "0 < pass_rate <> 1", check_codes=(2,))
    assert "at position 16" in proc.stderr and proc.stderr.startswith("relabel: error: --keep")
    assert not (tmp_path / "t").exists()
    proc = run_cli("difficulty", "--input", runs / "run-1", "--output", tmp_path / "t", "--keep",
                   "pass_at_k_8 > 0", check_codes=(2,))
    assert "unknown column 'pass_at_k_8'" in proc.stderr and "at position 1" in proc.stderr


def test_training_rows_count_what_the_rollouts_count(runs, tmp_path):
    run_cli("run", "--input", runs / "run-2", "--output", tmp_path / "rows" / "run-2")
    (tmp_path / "rows" / "run-2" / "dead_letters.parquet").write_bytes(b"not read")  # only part files are
    run_cli("difficulty", "--input", tmp_path / "rows" / "run-2", "--output", tmp_path / "from-rows")
    run_cli("difficulty", "--input", runs / "run-2", "--output", tmp_path / "from-rollouts")
    drop = ["prompt"]
    assert table(tmp_path / "from-rows").drop_columns(drop) == table(tmp_path / "from-rollouts").drop_columns(drop)


def test_delta_output_and_delta_input(runs, tmp_path):
    deltalake = pytest.importorskip("deltalake")
    run_cli("run", "--input", runs / "run-3", "--output", tmp_path / "rows", "--output-format", "delta",
            "--run-name", "run-3")
    run_cli("difficulty", "--input", runs / "run-1", "--output", tmp_path / "d", "--output-format", "delta")
    run_cli("difficulty", "--input", runs / "run-1", tmp_path / "rows", "--output", tmp_path / "d",
            "--output-format", "delta")
    delta = deltalake.DeltaTable(str(tmp_path / "d"))
    assert delta.version() == 1  # one commit a rerun
    run_cli("difficulty", "--input", runs / "run-1", runs / "run-3", "--output", tmp_path / "p")
    got = pa.table(delta.to_pyarrow_table()).sort_by("prompt_key")
    assert got.replace_schema_metadata(None) == table(tmp_path / "p").replace_schema_metadata(None)


def test_fan_out_rollouts_of_pt_dumps_count_once(runs, tmp_path):
    run_cli("difficulty", "--input", runs / "dumps", "--output", tmp_path / "t")
    rows = table(tmp_path / "t").to_pylist()
    assert {r["rollouts"] for r in rows} == {SPEC.samples_per_prompt}  # rollouts, not their rows
    assert len(rows) == 2 * SPEC.prompts_per_step


def test_the_plot_is_written(runs, tmp_path):
    run_cli("difficulty", "--input", runs / "run-1", runs / "run-3", "--output", tmp_path / "t", "--by", "run",
            "--plot", tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_format_preset_reads_a_frameworks_dump(tmp_path):
    """verl's generation dumps (--format verl): rewards in `score`, groups by uid, the prompt in `input`;
    a null score kills its group (dead rows, exit 3)."""
    from tests.pipeline.test_formats import write_verl
    write_verl(tmp_path / "run-a", 1, [[1.0, 0.0, 1.0], [0.0, 1.0], [None, 1.0]])
    write_verl(tmp_path / "run-a", 2, [[1.0, 1.0, 0.5]])
    proc = run_cli("difficulty", "--format", "verl", "--input", tmp_path / "run-a", "--output", tmp_path / "t",
                   "--k", "2", check_codes=(3,))
    assert "2 dead (not counted)" in proc.stdout
    rows = {r["prompt"]: r for r in table(tmp_path / "t").to_pylist()}
    assert {p: (r["rollouts"], r["passes"], r["pass_at_k_2"], r["first_step"], r["last_step"])
            for p, r in rows.items()} == {"prompt 0": (6, 4, 14 / 15, 1, 2), "prompt 1": (2, 1, 1.0, 1, 1)}
    assert rows["prompt 0"]["prompt_key"] == hashlib.sha256(b"prompt 0").hexdigest()
    assert rows["prompt 0"]["mean_reward"] == 4.5 / 6


def test_a_run_without_any_countable_unit_writes_an_empty_table_and_says_why(tmp_path):
    """No file of the run can be keyed (no prompt column): nothing is counted, yet the table is written,
    empty, and the summary counts the files it could not use (exit 3)."""
    (tmp_path / "run-a").mkdir()
    pq.write_table(pa.table({"step": [1, 1], "group_index": [0, 0], "rollout_id": [0, 1], "reward": [1.0, 0.0],
                             "response_length": [2, 2]}), tmp_path / "run-a" / "a.parquet")
    proc = run_cli("difficulty", "--input", tmp_path / "run-a", "--output", tmp_path / "t", check_codes=(3,))
    assert "1 read (1 unreadable)" in proc.stdout and "table       0 rows" in proc.stdout
    assert table(tmp_path / "t").num_rows == 0
