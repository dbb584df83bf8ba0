"""--format presets on fixtures written field for field as the frameworks write them (docs/formats.md).

Expected advantages and dead letters come from the plain-Python oracle (tests/reference.py), fed the rows
grouped as each framework groups them (its key, or positional slices) and configured with the preset's own
flags (parsed by the CLI): no hand-written mean/std here.
"""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.run import parse_run
from tests.conftest import run_cli
from tests.reference import Batch, Row, reference_relabel

MALFORMED = "malformed"  # a line that is not a JSON object


def preset_config(name, *flags):
    """The CoreConfig the preset (and any extra flags) stands for, as the CLI parses it."""
    return parse_run(["--format", name, *flags, "--input", "in", "--output", "out"])[1].core


def reference(files, config, keyed=True):
    """files: [(source, [(group key, reward)])] of one batch, in path order; reward None: missing,
    MALFORMED: a malformed line. -> {source: {row: (advantage or None, problem or "")}}.

    A malformed line's row is a prompt group of its own when groups are keyed; with positional slices it is
    left out of the batch (docs/formats.md)."""
    rows, where, out = [], [], {}
    for source, lines in files:
        out[source] = {}
        for i, (key, reward) in enumerate(lines):
            if reward == MALFORMED:
                out[source][i] = (None, "malformed-line")
                if not keyed:
                    continue
                rows.append(Row(0.0, 0, group_index=("malformed", source, i), problem="malformed-line"))
            elif reward is None:
                rows.append(Row(0.0, 0, group_index=key if keyed else None, problem="non-numeric-reward"))
            else:
                rows.append(Row(reward, 0, group_index=key if keyed else None))
            where.append((source, i))
    for (source, i), result in zip(where, reference_relabel([Batch(rows)], config)[0]):
        out[source][i] = (result.advantage, result.problem)
    return out


def check(output, part, source, expected):
    """The part file's advantages are the oracle's live rows; the dead letters of `source` are exactly its
    dead rows."""
    written = pq.read_table(output / part).column("advantage").to_pylist()
    live = [adv for _, (adv, problem) in sorted(expected.items()) if not problem]
    assert written == pytest.approx(live, abs=1e-5)
    dead_path = output / "dead_letters.parquet"
    dead = pq.read_table(dead_path).to_pylist() if dead_path.exists() else []
    assert sorted((d["row"], d["reason"]) for d in dead if d["source"] == str(source)) == [
        (i, problem) for i, (_, problem) in sorted(expected.items()) if problem]


def write_verl(folder, step, groups, bad_line_after=None):
    """verl's `_write_generations` (verl/trainer/ppo/v1/trainer_base.py, verl-project/verl@1dda039b):
    `{step}.jsonl`, one line per response with input, output, gts, score, step and (v1) uid =
    `{uid}_{session_id}_{index}`, sorted by (uid, session, index)."""
    lines = []
    for g, rewards in enumerate(groups):
        for session, reward in enumerate(rewards):
            lines.append(json.dumps({"input": f"prompt {g}", "output": f"answer {session}", "gts": "42",
                                     "score": reward, "step": step, "uid": f"4f2c-{g:04d}-9a_{session}_0"}))
            if bad_line_after == len(lines):
                lines.append('{"input": "prompt", "score": 0.')
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{step}.jsonl"), "w") as handle:
        handle.write("\n".join(lines) + "\n")


def test_verl(tmp_path):
    groups = [[1.0, 0.0, 1.0], [0.0, 1.0], [1.0, 1.0, 0.0, 0.5], [None, 1.0], [0.7]]
    write_verl(tmp_path / "in", 1, groups, bad_line_after=4)
    run_cli("run", "--format", "verl", "--input", tmp_path / "in", "--output", tmp_path / "out", check_codes=(3,))
    rows = pq.read_table(tmp_path / "out" / "part-1.parquet").to_pylist()
    assert rows[0]["uid"] == "4f2c-0000-9a_0_0"  # the input's columns kept
    lines = [(f"4f2c-{g:04d}-9a", r) for g, rewards in enumerate(groups) for r in rewards]  # verl-uid: {uid}
    lines.insert(4, (None, MALFORMED))
    expected = reference([("1.jsonl", lines)], preset_config("verl"))["1.jsonl"]
    check(tmp_path / "out", "part-1.parquet", tmp_path / "in" / "1.jsonl", expected)
    assert sorted(i for i, (_, p) in expected.items() if p) == [4, 10, 11]  # the bad line, the group it kills


def write_areal(root, version, tasks, bad_line=None):
    """AReaL's `WorkflowExecutor._dump_trajectory` (areal/infra/workflow_executor.py,
    inclusionAI/AReaL@4aef98d8): `{...}/rollout/{tail_version}/{task_id}.jsonl`, one line per trajectory row
    with task_id, sample_idx, seqlen, prompt_len, head_version, tail_version, reward, prompt, completion.
    bad_line: (task_id, position) of a truncated line written there. -> {source: [(task_id, reward)]}."""
    folder = os.path.join(root, "rollout", str(version))
    os.makedirs(folder, exist_ok=True)
    written = {}
    for task_id, rewards in tasks.items():
        path = os.path.join(folder, f"{task_id}.jsonl")
        lines = [json.dumps({"task_id": task_id, "sample_idx": i, "seqlen": 30 + i, "prompt_len": 20,
                             "head_version": version - 1, "tail_version": version, "reward": reward,
                             "prompt": "<|im_start|>user q", "completion": "a"}) for i, reward in enumerate(rewards)]
        expected = [(task_id, r) for r in rewards]
        if bad_line is not None and bad_line[0] == task_id:
            lines.insert(bad_line[1], '{"task_id": "%s", "sample_idx": 9, "rew' % task_id)
            expected.insert(bad_line[1], (task_id, MALFORMED))
        with open(path, "w") as handle:
            handle.write("\n".join(lines) + "\n")
        written[path] = expected
    return written


def test_areal(tmp_path):
    # task ids are strings (uuid-like); uneven groups, a singleton, a missing reward, a truncated line
    one = write_areal(tmp_path / "in", 1, {"1f0c-a": [1.0, 0.0, 0.5], "3b9e-b": [0.0, 1.0], "77aa-c": [0.25],
                                           "9d01-d": [1.0, None, 0.0]}, bad_line=("3b9e-b", 1))
    two = write_areal(tmp_path / "in", 2, {"c4d2-e": [1.0, 0.2, 0.3, 0.0, 0.9]})
    run_cli("run", "--format", "areal", "--input", tmp_path / "in", "--output", tmp_path / "out", check_codes=(3,))
    config = preset_config("areal")
    for version in (one, two):  # a folder (one weight version) is one batch
        expected = reference(sorted(version.items()), config)
        for source, rows in expected.items():
            part = "part-rollout__{}__{}.parquet".format(*source.split(os.sep)[-2:]).replace(".jsonl", "")
            check(tmp_path / "out", part, source, rows)
    dead = pq.read_table(tmp_path / "out" / "dead_letters.parquet").to_pylist()
    assert sorted((os.path.basename(d["source"]), d["row"], d["reason"]) for d in dead) == [
        ("3b9e-b.jsonl", 1, "malformed-line"), ("9d01-d.jsonl", 0, "non-numeric-reward"),
        ("9d01-d.jsonl", 1, "non-numeric-reward"), ("9d01-d.jsonl", 2, "non-numeric-reward")]


def write_trl(folder, step, groups, reward_name="accuracy_reward"):
    """TRL's `GRPOTrainer.log` (trl/trainer/grpo_trainer.py, huggingface/trl@f2cd5771):
    `completions/completions_{step:05d}.parquet` with step, prompt, completion, one column per reward function
    and advantage; groups are consecutive slices of num_generations."""
    rows = [{"step": step, "prompt": f"p{g}", "completion": "c", reward_name: r, "advantage": a}
            for g, rewards in enumerate(groups) for r, a in zip(rewards, grpo(rewards))]
    os.makedirs(folder, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(folder, f"completions_{step:05d}.parquet"))


def test_trl(tmp_path):
    groups = [[1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 1.0, 0.0], [0.2] * 4 + [1.0] * 4]
    write_trl(tmp_path / "in", 10, groups)
    run_cli("run", "--format", "trl", "--column", "reward=accuracy_reward", "--input", tmp_path / "in",
            "--output", tmp_path / "out")
    rows = pq.read_table(tmp_path / "out" / "part-completions_00010.parquet")
    assert rows.column("advantage").to_pylist() == pytest.approx(rows.column("advantage").to_pylist())
    assert rows.column("advantage").to_pylist() == pytest.approx([a for g in groups for a in grpo(g)], abs=1e-5)


def write_nemo_rl(folder, step, groups):
    """NeMo-RL's `grpo_train` dump through `log_batched_dict_as_jsonl` (nemo_rl/algorithms/grpo.py,
    nemo_rl/utils/logger.py, NVIDIA-NeMo/RL@7ea279ab): `train_data_step{N}.jsonl`, every value wrapped in a
    1-element list, plus `idx`; the advantage expanded over every token position."""
    lines, idx = [], 0
    for g, rewards in enumerate(groups):
        for r in rewards:
            others = [x for x in rewards if x is not r]
            adv = r - sum(others) / len(others)
            lines.append(json.dumps({"content": [[f"q{g}", "a"]], "rewards": [r], "input_lengths": [5],
                                     "token_ids": [[1, 2, 3, 4, 5]], "token_loss_mask": [[0, 0, 1, 1, 1]],
                                     "sample_loss_mask": [1.0], "advantages": [[adv] * 5],
                                     "generation_logprobs": [[0.0] * 5], "prev_logprobs": [[0.0] * 5], "idx": idx}))
            idx += 1
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"train_data_step{step}.jsonl"), "w") as handle:
        handle.write("\n".join(lines) + "\n")


def test_nemo_rl(tmp_path):
    groups = [[1.0, 0.0], [0.5, 0.25]]  # n = 2: NeMo-RL's LOO std is 0, so adv = r_i - r_j, unscaled
    write_nemo_rl(tmp_path / "in", 1, groups)
    run_cli("run", "--format", "nemo-rl", "--n-samples-per-prompt", "2", "--input", tmp_path / "in",
            "--output", tmp_path / "out")
    rows = pq.read_table(tmp_path / "out" / "part-train_data_step1.parquet").to_pylist()
    assert [r["advantage"] for r in rows] == pytest.approx([r["advantages"][0][0] for r in rows], abs=1e-6)
