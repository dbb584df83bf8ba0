"""prime-rl's traces.jsonl reader: branches as rows, the training mask prime-rl trains, all/ read only for the
traces no effective/ file holds, the batch at the dispatch step, and bad lines named by file and line."""
import json
import os

import pytest

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io import formats
from rollout_relabel.transforms.lib.io.formats.prime_rl_format import spread
from rollout_relabel.transforms.lib.io.inputs import expand_inputs
from rollout_relabel.transforms.lib.io.jsonl import malformed_lines, malformed_texts
from tests.prime_rl_records import Episode, Trace, append, episode_record, grpo, trace_record, write_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("prime-rl")
    write_run(root)
    return root


def read(root, step, subset, columns=None):
    table, metadata = formats.read_table(str(root / "rollouts" / f"step_{step}" / "train" / subset / "traces.jsonl"),
                                         columns)
    return table, metadata


def test_effective_rows_are_branches_with_prime_rls_training_mask(run):
    table, metadata = read(run, 1, "effective")
    rows = table.to_pylist()
    fork = [r for r in rows if r["trace_id"] == "tr2-0"]
    assert [r["branch_index"] for r in fork] == [0, 1, 2]
    # leaves in node order: node 3, node 5 (it shares answer node 1, trained in branch 0 only), node 6
    assert [r["token_ids"] for r in fork] == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1, 2, 3, 4, 5, 6, 12, 13, 14],
                                              [1, 2, 3, 15, 16]]
    assert [r["loss_mask"] for r in fork] == [[0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0, 1],
                                              [0, 0, 0, 0, 0]]
    # sampling logprobs on every sampled token (node 1's in branch 1 too: only the mask drops it), 0 elsewhere
    assert fork[1]["logprobs"] == pytest.approx([0, 0, 0, 0, -0.6, -0.61, 0, 0, -1.0])
    assert [r["not_trained"] for r in fork] == [None, None, "branch has no trainable token"]
    assert [r["prime_rl_advantage"] for r in fork] == [pytest.approx(grpo()["tr2-0"])] * 2 + [None]
    # the batch is the dispatch step (g-1 was dispatched at 0 and is split over steps 0 and 1)
    assert [(r["trace_id"], r["step"], r["rollouts_step"]) for r in rows] == [
        ("tr2-0", 0, 1)] * 3 + [("tr8-0", 1, 1), ("tr9-0", 1, 1), ("tr10-0", 1, 1)]
    first = rows[0]
    assert (first["group_index"], first["rollout_id"], first["episode_id"], first["reward"], first["subset"]) == (
        "g-1", "tr2-0", "ep2", 0.25, "effective")
    assert (first["policy_start"], first["policy_end"], first["agent"], first["trainable"], first["ok"]) == (
        0, 0, "solver", True, True)
    assert json.loads(first["messages"])[-1] == {"role": "assistant", "content": "assistant message 3"}
    assert json.loads(first["task"])["data"]["answer"] == "4"
    assert metadata == {"step": None, "prompt_group_sizes": None}


def test_all_is_read_only_for_traces_no_effective_file_holds(run):
    rows = read(run, 0, "all")[0].to_pylist()
    # tr0-0, tr1-0, tr4-0, tr5-0 trained at step 0, tr2-0 at step 1: none of them is read again
    assert [(r["trace_id"], r["not_trained"]) for r in rows] == [
        ("tr3-0", "trace errored: SandboxError"), ("tr4-1", "frozen agent 'judge'"),
        ("tr5-1", "frozen agent 'judge'")]
    assert [r["reward"] for r in rows] == [0.0, 0.0, 1.0]  # a reward that never ran counts nothing
    later = read(run, 1, "all")[0].to_pylist()
    assert [(r["trace_id"], r["not_trained"]) for r in later] == [("tr6-0", "not in any effective/ file"),
                                                                  ("tr7-0", "not in any effective/ file")]


def test_trained_ids_follow_a_rewritten_effective_file(tmp_path):
    episode = Episode("g", 0, 0, [Trace({"acc": 1.0}, id="t1")], id="e1")
    append(tmp_path, 0, "train", "all", episode_record(episode, [trace_record(episode.traces[0])]))
    assert read(tmp_path, 0, "all")[0].column("trace_id").to_pylist() == ["t1"]
    append(tmp_path, 2, "train", "effective", episode_record(episode, [trace_record(episode.traces[0], 0.0)]))
    assert read(tmp_path, 0, "all")[0].num_rows == 0  # trained at a later step: read there


def test_columns_asked_for_and_the_plan_reads_dispatch_steps(run):
    path = str(run / "rollouts" / "step_1" / "train" / "effective" / "traces.jsonl")
    table, _ = formats.read_table(path, ["step", "group_index", "rollout_id", "reward", "not_trained"])
    assert table.column_names == ["step", "group_index", "rollout_id", "reward", "not_trained"]
    assert table.column("not_trained").to_pylist() == [None, None, "branch has no trainable token", None, None, None]
    assert formats.plan(path, os.path.getsize(path), "step", 1 << 30).steps == (0, 1)


def test_listing_leaves_eval_out_and_detects_the_layout(run, tmp_path):
    names = sorted(f.path[len(str(run)):] for f in expand_inputs([str(run / "rollouts")], str(tmp_path / "out")))
    assert names == [f"/rollouts/step_{s}/train/{subset}/traces.jsonl"
                     for s in (0, 1) for subset in ("all", "effective")]
    assert formats.detect("r/step_3/train/all/traces.jsonl").name == "prime-rl"
    assert formats.detect("r/step_3/eval/all/traces.jsonl").name == "jsonl"  # named alone, it is any JSONL file
    assert formats.detect("r/step_3/train/other/traces.jsonl").name == "jsonl"

    assert formats.by_name("prime-rl").preset == ("--semantics=rollout-shared", "--estimator=dr_grpo",
                                                 "--version-column=policy_start")


def test_bad_lines_are_rows_of_their_own_naming_file_and_line(tmp_path):
    good = Episode("g", 3, 3, [Trace({"acc": 1.0}, id="t1")], id="e1")
    lines = [
        json.dumps(episode_record(good, [trace_record(good.traces[0], 0.5)])),
        '{"id": "cut", "traces": [',                                                     # cut mid-write
        json.dumps({**episode_record(good, []), "group": None}),                           # no group
        json.dumps(episode_record(good, [{**trace_record(good.traces[0]), "id": None}])),  # a trace without id
        json.dumps(episode_record(good, [{**trace_record(good.traces[0]), "rewards": {"acc": {"score": "1"}}}])),
        json.dumps(episode_record(good, [{**trace_record(good.traces[0]), "nodes": [{"parent": 0, "token_ids": [1],
                                                                                      "mask": [True]}]}])),
        json.dumps(episode_record(good, [{**trace_record(good.traces[0]), "nodes": [{"token_ids": [1, 2],
                                                                                      "mask": [True]}]}])),
        json.dumps(episode_record(good, [{**trace_record(good.traces[0]), "nodes": [{"token_ids": [1],
                                                                                      "mask": [1]}]}])),
    ]
    path = tmp_path / "rollouts" / "step_3" / "train" / "effective" / "traces.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    table, _ = formats.read_table(str(path))
    assert table.column("trace_id").to_pylist() == ["t1"] + [None] * 7
    assert table.column("token_ids").to_pylist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9]] + [None] * 7
    assert table.column("step").to_pylist() == [3] * 8
    why = {row: text.removeprefix(f"{path}: line ") for row, text in malformed_lines(table).items()}
    assert why == {
        1: "2 is not a prime-rl episode record (Input data was truncated)",
        2: "3: no `group.id` (prime-rl groups every training episode)",
        3: "4 is not a prime-rl episode record (Expected `str`, got `null` - at `$.traces[0].id`)",
        4: "5 is not a prime-rl episode record (Expected `float`, got `str` - at `$.traces[0].rewards[...].score`)",
        5: "6, trace 0, node 0: `parent` 0 is not an earlier node",
        6: "7, trace 0, node 0: 2 `token_ids` but 1 `mask` values",
        7: "8 is not a prime-rl episode record (Expected `bool`, got `int` - at `$.traces[0].nodes[0].mask[0]`)",
    }
    assert malformed_texts(table)[1] == lines[1]



def _one_trace(tmp_path, nodes, spaced=False):
    episode = Episode("g", 3, 3, [Trace({"acc": 1.0}, id="t1")], id="e1")
    record = episode_record(episode, [{**trace_record(episode.traces[0]), "nodes": nodes}])
    path = tmp_path / "rollouts" / "step_3" / "train" / "effective" / "traces.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, separators=(", ", ": ") if spaced else (",", ":")) + "\n")
    return str(path)


@pytest.mark.parametrize("spaced", [False, True])
def test_node_lists_parsed_at_once_keep_every_value(tmp_path, spaced):
    # scattered sampled tokens, fewer logprobs than sampled tokens, a null and an empty list of advantages
    nodes = [{"token_ids": [7, -1, 2**63 - 1], "mask": [False, False, False], "advantages": None},
             {"parent": 0, "sampled": True, "token_ids": [], "mask": [], "logprobs": [], "advantages": []},
             {"parent": 1, "sampled": True, "token_ids": [4, 5, 6, 8], "mask": [True, False, True, True],
              "logprobs": [-0.5, -1.25e-3], "advantages": [0.75, 1e-7, 2]}]
    row = formats.read_table(_one_trace(tmp_path, nodes, spaced))[0].to_pylist()[0]
    assert row["token_ids"] == [7, -1, 2**63 - 1, 4, 5, 6, 8]
    assert row["loss_mask"] == [0, 0, 0, 1, 0, 1, 1]
    assert row["logprobs"] == pytest.approx([0, 0, 0, -0.5, 0, -1.25e-3, 0])
    assert row["prime_rl_advantage"] == 0.75


def test_a_token_id_beyond_int64_fails_the_file_only_where_tokens_are_read(tmp_path):
    path = _one_trace(tmp_path, [{"sampled": True, "token_ids": [2**63], "mask": [True], "logprobs": [-1.0]}])
    with pytest.raises(BadFile) as failed:
        formats.read_table(path)
    assert failed.value.reason == Reason.VALUE_TOO_LARGE and "beyond int64" in str(failed.value)
    assert formats.read_table(path, ["step", "not_trained"])[0].to_pylist() == [{"step": 3, "not_trained": None}]


def test_spread_places_a_nodes_values_on_its_sampled_tokens():
    assert spread([False, True, True], [-1.0, -2.0]) == [0.0, -1.0, -2.0]
    assert spread([False, True, False, True], [-1.0, -2.0]) == [0.0, -1.0, 0.0, -2.0]
    assert spread([False, True, True], [-1.0]) == [0.0, -1.0, 0.0]  # too few values: 0
    assert spread([False, True], []) == [0.0, 0.0]
    assert spread([False, False], [-1.0]) == [0.0, 0.0]
