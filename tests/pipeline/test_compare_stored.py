"""`relabel compare --a column:NAME`: a framework's own stored advantages against ours (B computed as usual);
`--format trl` / `--format nemo-rl` make the stored column side A when --a is not given."""
import json
import statistics

import numpy as np
import pytest

from rollout_relabel.transforms.lib.compare.batches import AGREE_ABS, AGREE_REL, ZERO_TOL
from tests.conftest import run_cli
from tests.pipeline.test_formats import NEMO_GROUPS, nemo_rl_grpo, write_nemo_rl, write_trl

# rewards on a scale of tens: TRL's eps (1e-4) against ours (1e-6) moves an advantage by about 1e-4 / std,
# well inside the report's relative tolerance (1e-5) once the std is in the tens
GROUPS = [[100.0, 0.0, 100.0, 0.0, 50.0, 50.0, 100.0, 0.0], [20.0] * 4 + [100.0] * 4, [30.0] * 8]


def grpo(rewards):
    """Ours, by hand: group mean and sample std (ddof 1), eps 1e-6 (docs/semantics.md)."""
    if len(rewards) == 1:
        return [0.0]
    m, s = statistics.mean(rewards), statistics.stdev(rewards)
    return [(r - m) / (s + 1e-6) if s > 0 else r - m for r in rewards]


def trl_grpo(rewards):
    """TRL's default scale_rewards="group": (r - group mean) / (group std (ddof 1) + 1e-4)."""
    m, s = statistics.mean(rewards), statistics.stdev(rewards)
    return [(r - m) / (s + 1e-4) for r in rewards]


def compare(tmp_path, *flags, codes=(0,)):
    report = tmp_path / "report"
    run_cli("compare", *flags, "--input", tmp_path / "in", "--report", report, check_codes=codes)
    return json.loads((report / "report.json").read_text())


def test_trl_stored_advantages_agree_with_ours(tmp_path):
    stored = [a for g in GROUPS for a in trl_grpo(g)]
    ours = [a for g in GROUPS for a in grpo(g)]
    assert max(abs(a - b) for a, b in zip(stored, ours)) > 0  # not bit for bit: the eps differ
    write_trl(tmp_path / "in", 10, GROUPS, advantages=stored)
    report = compare(tmp_path, "--format", "trl", "--column", "reward=accuracy_reward", "--b", "group-index")
    assert report["a"] == {"stored_column": "advantage", "spec": "column:advantage"}  # the preset's default --a
    t = report["totals"]
    assert (t["rows"], t["compared"], t["dead_a"], t["dead_b"]) == (24, 24, 0, 0)
    assert t["agree_fraction"] == 1.0 and t["wrong_sign"] == 0
    assert 0 < t["max_abs_delta"] < 1e-5
    assert (t["groups_a"], t["groups_b"], t["uniform_groups_a"], t["uniform_groups_b"]) == (3, 3, 1, 1)


def test_trl_stored_batch_mean_advantages_disagree(tmp_path):
    """Advantages stored as r - the batch's mean (no groups), one of them null and one NaN: the last
    group's 60s are below their group's mean (ours < 0) but above the batch's (stored > 0)."""
    groups = GROUPS + [[60.0, 70.0] * 4]
    rewards = [r for g in groups for r in g]
    stored = [r - statistics.mean(rewards) for r in rewards]
    stored[1], stored[9] = None, float("nan")
    write_trl(tmp_path / "in", 10, groups, advantages=stored)
    report = compare(tmp_path, "--format", "trl", "--column", "reward=accuracy_reward",
                     "--a", "column:advantage", "--b", "group-index", codes=(3,))
    a = np.array([np.nan if x is None else x for x in stored])
    b = np.array([x for g in groups for x in grpo(g)], dtype=np.float32).astype(np.float64)
    live = np.isfinite(a)
    agree = live & (np.abs(a - b) <= AGREE_ABS + AGREE_REL * np.abs(b))
    wrong = live & (np.abs(a) > ZERO_TOL) & (np.abs(b) > ZERO_TOL) & (np.sign(a) != np.sign(b))
    t = report["totals"]
    assert t["dead_a_by_reason"] == {"stored-advantage-missing": 1, "stored-advantage-non-finite": 1}
    assert (t["compared"], t["dead_a"], t["dead_b"]) == (30, 2, 0)
    assert (t["agree"], t["wrong_sign"]) == (int(agree.sum()), int(wrong.sum()))
    assert t["wrong_sign"] == 4 and t["agree"] < t["compared"]
    assert t["zero_to_nonzero"] == int((live & (np.abs(a) <= ZERO_TOL) & (np.abs(b) > ZERO_TOL)).sum())
    assert t["nonzero_to_zero"] == int((live & (np.abs(a) > ZERO_TOL) & (np.abs(b) <= ZERO_TOL)).sum())


def test_nemo_rl_stored_advantages_at_a_dotted_path(tmp_path):
    groups = [[1.0, 0.0], [0.5, 0.25], [0.0, 1.0]]  # n = 2: NeMo-RL's advantage is r_i - r_j, unscaled
    write_nemo_rl(tmp_path / "in", 1, groups)
    report = compare(tmp_path, "--format", "nemo-rl", "--n-samples-per-prompt", "2", "--b", "group-index")
    assert report["a"]["stored_column"] == "advantages.0.0"
    t = report["totals"]
    assert (t["compared"], t["agree"], t["wrong_sign"]) == (6, 6, 0)


def test_a_missing_stored_column_is_dead_under_a_only(tmp_path):
    write_trl(tmp_path / "in", 3, GROUPS[:1])
    report = compare(tmp_path, "--format", "trl", "--column", "reward=accuracy_reward", "--a", "column:metrics.adv",
                     "--b", "group-index", codes=(3,))
    t = report["totals"]
    assert t["dead_a_by_reason"] == {"stored-advantage-missing": 8}
    assert (t["dead_a"], t["dead_b"], t["compared"]) == (8, 0, 0)


@pytest.mark.parametrize("flags", [("--a", "group-index", "--b", "column:advantage"),
                                   ("--a", "column:", "--b", "group-index")])
def test_stored_side_usage_errors(tmp_path, flags):
    write_trl(tmp_path / "in", 3, GROUPS[:1])
    out = run_cli("compare", *flags, "--input", tmp_path / "in", "--report", tmp_path / "r", check_codes=(2,))
    assert "column:" in out.stderr


def test_nemo_rl_default_grpo_agrees_where_float32_allows(tmp_path):
    """`relabel compare --format nemo-rl`: A is NeMo-RL's own stored advantage (its default GRPO, float32), B the
    preset's grpo_loo (float64). They agree, except where NeMo-RL's float32 E[x^2] - E[x]^2 leaves a residue
    for others that are all equal (0.45, 0.45, 0.45 beside 0.95): there NeMo-RL divides by that residue (its
    #4158), where ours takes s = 0."""
    groups = NEMO_GROUPS[:4] + NEMO_GROUPS[5:] + [[0.45, 0.45, 0.45, 0.95]]
    write_nemo_rl(tmp_path / "in", 1, groups, advantages=lambda g: nemo_rl_grpo(g)[0])
    report = compare(tmp_path, "--format", "nemo-rl", "--n-samples-per-prompt", "4", "--b", "group-index")
    _, stds = nemo_rl_grpo(groups[-1])
    residue = [i for i, s in enumerate(stds) if 0 < s < 1e-3]  # NeMo-RL's float32 std over three equal 0.45s
    assert residue == [3]
    t = report["totals"]
    assert (t["compared"], t["agree"], t["wrong_sign"]) == (24, 23, 0)
    assert report["b"]["estimator"] == "grpo_loo"
    assert nemo_rl_grpo(groups[-1])[0][3] > 1000  # NeMo-RL's own value there; ours is 0.95 - 0.45 = 0.5
