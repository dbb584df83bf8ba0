"""`--format skyrl` on SkyRL's dumped training batches, built here from SkyRL's documented fields
(tests/skyrl_batches.py): SkyRL's prompt groups (policy_prompt_boundaries) and rollouts (one a row) as the
same partitions of the training rows, SkyRL's own advantages passed through, and its padding rows never
trained on (written to _filtered.parquet as not-trained)."""
import glob
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from rollout_relabel.transforms.lib.errors import ExitCode
from tests.conftest import run_cli
from tests.skyrl_batches import Rollout, batch_state, write_batch

# step -> (the prompt groups' rewards, each rollout's loss mask, pad_size); uneven groups, as step-wise SkyRL has
STEPS = {
    3: ([[1.0, 0.0, 1.0], [0.2, 0.9]], [[1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1], [0, 0, 1]], 3),
    4: ([[0.0, 1.0, 1.0, 0.0]], [[1, 1, 1], [1, 0, 1], [1, 1, 1], [0, 0, 0]], 0),
}


def grpo(rewards):
    """SkyRL's default GRPO (skyrl/backends/skyrl_train/utils/ppo_utils.py): (r - mean) / (std + 1e-6),
    torch's sample std, in float32: the values its batch stores."""
    r = np.array(rewards, dtype=np.float32)
    return ((r - r.mean()) / (r.std(ddof=1) + np.float32(1e-6))).astype(np.float32)


def groups_of(step):
    rewards, masks, _ = STEPS[step]
    out, k = [], 0
    for group in rewards:
        values = grpo(group)
        out.append([Rollout([7, 8, step], [10 + k + i, 20, 30], masks[k + i], [float(values[i])] * 3)
                     for i in range(len(group))])
        k += len(group)
    return out


@pytest.fixture(scope="module")
def relabelled(tmp_path_factory):
    base = tmp_path_factory.mktemp("skyrl")
    for step, (_, _, pad) in STEPS.items():
        write_batch(base / "export", step, batch_state(groups_of(step), pad_size=pad))
    proc = run_cli("run", "--input", base / "export", "--output", base / "out", "--format", "skyrl")
    files = sorted(glob.glob(str(base / "out" / "part-*.parquet")))
    rows = [row for f in files for row in pq.read_table(f).to_pylist()]
    filtered = pq.read_table(base / "out" / "_filtered.parquet").to_pylist()
    manifest = json.loads((base / "out" / "_manifest.json").read_text())
    return rows, filtered, manifest, proc.stdout, base / "out"


def test_advantages_are_skyrls_own(relabelled):
    rows = relabelled[0]
    for step in STEPS:
        got = [r["advantage"] for r in sorted((r for r in rows if r["step"] == step), key=lambda r: r["row_index"])]
        expected = [float(v) for group in STEPS[step][0] for v in grpo(group)]
        assert got == pytest.approx(expected, abs=1e-5)


def test_groups_and_rollouts_are_skyrls_partitions(relabelled):
    rows = relabelled[0]
    for step, (rewards, _, _) in STEPS.items():
        mine = sorted((r for r in rows if r["step"] == step), key=lambda r: r["row_index"])
        assert [r["row_index"] for r in mine] == list(range(sum(map(len, rewards))))  # no padding row trained
        assert all(r["global_step"] == step for r in mine)
        groups = [r["prompt_group"] for r in mine]
        sizes = [len(g) for g in rewards]
        starts = np.repeat(np.cumsum([0, *sizes[:-1]]), sizes).tolist()
        assert [groups.index(g) for g in groups] == starts  # the same partition as the boundaries
        assert len(set(groups)) == len(sizes)
        assert len({r["rollout_key"] for r in mine}) == len(mine)  # each row its own rollout
        assert [r["tokens"][3] for r in mine] == [10 + i for i in range(len(mine))]  # rows kept in SkyRL's order


def test_padding_rows_are_filtered_not_trained(relabelled):
    rows, filtered, manifest = relabelled[:3]
    assert sorted((f["reason"], json.loads(f["row_json"])["row_index"]) for f in filtered) == [
        ("not-trained", 5), ("not-trained", 6), ("not-trained", 7)]
    assert all(f["message"].endswith("never trained on this row (padding row (pad_size 3))") for f in filtered)
    counts = manifest["counts"]
    assert counts["rows_in"] == 12 == counts["rows_out"] + counts["rows_dead"] + counts["rows_filtered"]
    assert (counts["rows_out"], counts["rows_dead"], counts["rows_filtered"]) == (9, 0, 3)
    assert len(rows) == 9


def test_the_summary_says_the_advantages_pass_through(relabelled):
    assert "estimator none (each row's advantage is its skyrl_advantage, passed through)" in relabelled[3]


def test_rescoring_is_refused(tmp_path):
    write_batch(tmp_path / "export", 1, batch_state(groups_of(4)))
    proc = run_cli("run", "--input", tmp_path / "export", "--output", tmp_path / "out", "--format", "skyrl",
                   "--reward-fn", "tests.fixtures:anything", check_codes=(ExitCode.USAGE,))
    assert "--format skyrl cannot take --reward-fn" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_rows_export_to_slime_with_skyrls_tokens_and_advantages(relabelled, tmp_path):
    import torch

    run_cli("export", "--input", relabelled[4], "--output", tmp_path / "dumps", "--to", "slime")
    dump = torch.load(tmp_path / "dumps" / "3.pt", weights_only=True)
    samples = dump["samples"]
    assert len(samples) == 5  # the padding rows are not exported
    assert [s["tokens"][3] for s in samples] == [10, 11, 12, 13, 14]
    assert [s["loss_mask"] for s in samples] == STEPS[3][1]
    assert [s["reward"] for s in samples] == pytest.approx([float(v) for g in STEPS[3][0] for v in grpo(g)], abs=1e-6)


def test_row_weights_apply_one_rollout_a_row(tmp_path):
    write_batch(tmp_path / "export", 3, batch_state(groups_of(3), pad_size=3))
    run_cli("run", "--input", tmp_path / "export", "--output", tmp_path / "out", "--format", "skyrl",
            "--row-weight", "rollout")
    rows = pq.read_table(glob.glob(str(tmp_path / "out" / "part-*.parquet"))[0]).to_pylist()
    assert [r["loss_weight"] for r in rows] == [1.0] * 5  # each row its own rollout, the padding rows not counted
