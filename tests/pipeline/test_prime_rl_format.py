"""`--format prime-rl` on a run laid out as prime-rl's FileMonitor writes it (built by tests/prime_rl_records.py from
the documented record fields): prime-rl's rollout groups and traces as the same partitions of rows, prime-rl's
own GRPO advantages (restated there from prime_rl/orchestrator/algo/grpo.py), no row it never trained on, and
every row it wrote but did not train on filtered as not-trained."""
import glob
import json
from collections import defaultdict

import pyarrow.parquet as pq
import pytest

from tests.conftest import run_cli
from tests.prime_rl_records import RUN, Episode, Trace, append, episode_record, grpo, trace_record, write_run

# (trace id, branch index) of every branch prime-rl trained: the effective/ traces' branches with a trained token
TRAINED = {(t.id, b) for e in RUN for t in e.traces if t.trained_at is not None
           for b in ((0, 1) if t.shape == "fork" else (0,))}
NOT_TRAINED = {("tr2-0", 2): "branch has no trainable token", ("tr3-0", 0): "trace errored: SandboxError",
               ("tr4-1", 0): "frozen agent 'judge'", ("tr5-1", 0): "frozen agent 'judge'",
               ("tr6-0", 0): "not in any effective/ file", ("tr7-0", 0): "not in any effective/ file"}


@pytest.fixture(scope="module")
def relabelled(tmp_path_factory):
    base = tmp_path_factory.mktemp("prime-rl")
    write_run(base / "run")
    run_cli("run", "--input", base / "run", "--output", base / "out", "--format", "prime-rl")
    parts = sorted(glob.glob(str(base / "out" / "part-*.parquet")))
    rows = [row for f in parts for row in pq.read_table(f).to_pylist()]
    filtered = pq.read_table(base / "out" / "_filtered.parquet").to_pylist()
    manifest = json.loads((base / "out" / "_manifest.json").read_text())
    refused = run_cli("export", "--input", base / "out", "--output", base / "dumps", "--to", "slime",
                      check_codes=(2,))
    assert "prime-rl's branches interleave" in refused.stderr and not (base / "dumps").exists()
    return rows, filtered, manifest


def test_advantages_are_prime_rls_own(relabelled):
    rows, _, _ = relabelled
    expected = grpo()
    assert len(rows) == len(TRAINED) == 9
    for row in rows:
        assert row["advantage"] == pytest.approx(expected[row["trace_id"]], abs=1e-5), row["trace_id"]
        assert row["advantage"] == pytest.approx(row["prime_rl_advantage"], abs=1e-5)  # what prime-rl stored
    # g-1 (mean 5/12) is whole although its traces trained at steps 0 and 1
    assert {r["trace_id"]: round(r["advantage"], 6) for r in rows if r["group_index"] == "g-1"} == {
        "tr0-0": 0.583333, "tr1-0": -0.416667, "tr2-0": -0.166667}


def test_groups_and_rollouts_are_prime_rls_partitions(relabelled):
    rows, _, _ = relabelled

    def partition(key):
        parts = defaultdict(set)
        for i, r in enumerate(rows):
            parts[key(r)].add(i)
        return sorted(map(sorted, parts.values()))

    group_of = {t.id: e.group for e in RUN for t in e.traces}
    assert partition(lambda r: (r["step"], r["prompt_group"])) == partition(lambda r: group_of[r["trace_id"]])
    assert partition(lambda r: (r["step"], r["prompt_group"], r["rollout_key"])) == partition(lambda r: r["trace_id"])
    assert len(partition(lambda r: group_of[r["trace_id"]])) == 3  # g-1, g-2, g-4; g-3 never trained


def test_only_trained_rows_and_the_rest_filtered_as_not_trained(relabelled):
    rows, filtered, manifest = relabelled
    assert {(r["trace_id"], r["branch_index"]) for r in rows} == TRAINED
    assert all(r["not_trained"] is None for r in rows)
    assert "tr-eval" not in {r["trace_id"] for r in rows}  # eval/ is not read
    seen = {}
    for f in filtered:
        row = json.loads(f["row_json"])
        assert f["reason"] == "not-trained"
        seen[(row["trace_id"], row["branch_index"])] = row["not_trained"]
        assert row["not_trained"] in f["message"]
    assert seen == NOT_TRAINED
    counts = manifest["counts"]
    assert (counts["rows_in"], counts["rows_out"], counts["rows_dead"], counts["rows_filtered"]) == (15, 9, 0, 6)
    assert manifest["filtered"]["by_reason"] == {"not-trained": 6}


def test_tokens_masks_and_versions_are_kept(relabelled):
    rows, _, _ = relabelled
    fork = sorted((r for r in rows if r["trace_id"] == "tr2-0"), key=lambda r: r["branch_index"])
    assert [r["loss_mask"] for r in fork] == [[0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0, 1]]
    assert [r["token_ids"][-1] for r in fork] == [11, 14]
    assert [(r["policy_start"], r["policy_end"], r["rollouts_step"], r["step"]) for r in fork] == [(0, 0, 1, 0)] * 2


def test_a_bad_line_is_dead_lettered_and_the_rest_labelled(tmp_path):
    episodes = [Episode("g", 0, 0, [Trace({"acc": r}, id=f"t{i}")], id=f"e{i}") for i, r in enumerate((1.0, 0.0))]
    advantages = grpo(episodes)
    for e in episodes:
        path = append(tmp_path / "in", 0, "train", "effective",
                      episode_record(e, [trace_record(e.traces[0], advantages[e.traces[0].id])]))
    with open(path, "a") as handle:
        handle.write("not json\n")
    run_cli("run", "--input", tmp_path / "in", "--output", tmp_path / "out", "--format", "prime-rl",
            check_codes=(3,))
    rows = pq.read_table(tmp_path / "out" / "part-rollouts__step_0__train__effective__traces.parquet").to_pylist()
    assert [(r["trace_id"], r["advantage"]) for r in rows] == [("t0", 0.5), ("t1", -0.5)]
    dead = pq.read_table(tmp_path / "out" / "_dead_letters.parquet").to_pylist()
    assert [(d["row"], d["reason"]) for d in dead] == [(2, "malformed-line")]
    assert f"{path}: line 3 is not a prime-rl episode record (JSON is malformed" in dead[0]["message"]
