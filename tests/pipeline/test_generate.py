"""The seeded rollout generator: determinism, realism, fixture-identical .pt structure."""
from __future__ import annotations

import collections
import hashlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rollout_relabel.pipeline.generate import (
    MILES_SAMPLE_KEYS,
    SCHEMA,
    SLIME_SAMPLE_KEYS,
    RunSpec,
    generate_rows,
    spec_for_rows,
    write_parquet_run,
    write_pt_run,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE_DIRS = {
    "slime": "slime_rollout_data",
    "miles": "miles_rollout_data",
    "miles-reward-dict": "miles_reward_dict",
}
# big enough that every kind of row shows up, small enough to stay fast
MEDIUM = RunSpec(steps=2, prompts_per_step=200, seed=7)


def _digest(paths):
    return [(os.path.basename(p), hashlib.sha256(Path(p).read_bytes()).hexdigest()) for p in paths]


@pytest.fixture(scope="module")
def medium_rows() -> pa.Table:
    return generate_rows(MEDIUM)


def test_parquet_is_byte_identical_for_a_seed(tmp_path):
    spec = RunSpec(steps=2, prompts_per_step=6, files_per_step=2, seed=3)
    a = write_parquet_run(spec, tmp_path / "a", row_group_size=16)
    b = write_parquet_run(spec, tmp_path / "b", row_group_size=16)
    assert [os.path.basename(p) for p in a] == [
        "step-000000-part-00.parquet", "step-000000-part-01.parquet",
        "step-000001-part-00.parquet", "step-000001-part-01.parquet",
    ]
    assert _digest(a) == _digest(b)
    c = write_parquet_run(RunSpec(steps=2, prompts_per_step=6, files_per_step=2, seed=4), tmp_path / "c")
    assert _digest(a) != _digest(c)


def test_parquet_files_hold_one_step_each_and_the_whole_run(tmp_path):
    spec = RunSpec(steps=3, prompts_per_step=6, files_per_step=2, seed=1)
    paths = write_parquet_run(spec, tmp_path, row_group_size=10)
    tables = []
    for p in paths:
        t = pq.read_table(p)
        assert t.schema.equals(SCHEMA)
        step = int(os.path.basename(p).split("-")[1])
        assert set(t["step"].to_pylist()) == {step}
        assert pq.ParquetFile(p).metadata.row_group(0).num_rows <= 10
        tables.append(t)
    assert pa.concat_tables(tables).equals(generate_rows(spec))


def test_schema_and_row_invariants(medium_rows):
    t = medium_rows
    assert t.schema.equals(SCHEMA)
    d = t.to_pydict()
    for length, mask, tokens, logp in zip(d["response_length"], d["loss_mask"], d["tokens"],
                                          d["rollout_log_probs"]):
        assert length >= 1
        assert mask is None or len(mask) == length
        assert len(tokens) > length
        assert len(logp) == length
    assert set(d["status"]) == {"completed", "truncated", "aborted"}
    assert all(np.isfinite(d["reward"]))
    # rollout_id, when present, is the rollout's index (key spaces never collide)
    assert all(r is None or r == i for r, i in zip(d["rollout_id"], d["index"]))
    # nulls and rare flags all occur
    assert 0 < sum(r is None for r in d["rollout_id"]) < len(d["step"]) / 4
    assert 0 < sum(m is None for m in d["loss_mask"]) < len(d["step"]) / 4
    assert 0 < sum(d["remove_sample"]) < len(d["step"]) / 20
    assert sum(i is None for i in d["index"]) < len(d["step"]) / 100
    # zero spans (tool tokens) in some masks
    assert any(m is not None and 0 in m and 1 in m for m in d["loss_mask"])
    # all rows of one prompt share the prompt text and the prompt token prefix
    prefix = {}
    for g, prompt, tokens, length in zip(d["group_index"], d["prompt"], d["tokens"], d["response_length"]):
        assert prefix.setdefault(g, (prompt, tokens[:-length])) == (prompt, tokens[:-length])


def test_fan_out_is_uneven_and_group_sizes_vary(medium_rows):
    d = medium_rows.to_pydict()
    S = MEDIUM.samples_per_prompt
    per_rollout = collections.Counter(
        (s, i) for s, i in zip(d["step"], d["index"]) if i is not None)
    fan = collections.Counter(per_rollout.values())
    assert fan[1] > sum(n for k, n in fan.items() if k > 1)  # mostly one row
    assert any(2 <= k <= 5 for k in fan)
    assert max(fan) >= 15  # the rare big fan-out
    rollouts_per_group = collections.defaultdict(set)
    for g, i, s in zip(d["group_index"], d["index"], d["step"]):
        rollouts_per_group[g].add((s, i))
    sizes = collections.Counter(d["group_index"])
    assert min(sizes.values()) >= S
    assert len(set(sizes.values())) >= 5
    assert max(sizes.values()) >= 20
    assert len(sizes) == MEDIUM.steps * MEDIUM.prompts_per_step
    # some siblings disagree on reward; ~30% of groups are all zero
    rewards = collections.defaultdict(set)
    for s, i, r in zip(d["step"], d["index"], d["reward"]):
        if i is not None:
            rewards[(s, i)].add(r)
    assert any(len(v) > 1 for v in rewards.values())
    group_max = collections.defaultdict(float)
    for g, r in zip(d["group_index"], d["reward"]):
        group_max[g] = max(group_max[g], r)
    zero = np.mean([m == 0 for m in group_max.values()])
    assert 0.2 < zero < 0.4


def test_parquet_rows_are_shuffled_within_a_step(medium_rows):
    steps = medium_rows["step"].to_numpy()
    assert np.all(np.diff(steps) >= 0)  # steps in order
    groups = medium_rows["group_index"].to_numpy()[steps == 0]
    runs = 1 + int(np.count_nonzero(np.diff(groups)))
    assert runs > 5 * len(np.unique(groups))  # group_index is far from contiguous
    unshuffled = generate_rows(RunSpec(steps=1, prompts_per_step=20, shuffle=False))
    g = unshuffled["group_index"].to_numpy()
    assert np.all(np.diff(g) >= 0)


def test_steps_do_not_depend_on_run_length():
    a = generate_rows(RunSpec(steps=1, prompts_per_step=5, seed=11))
    b = generate_rows(RunSpec(steps=3, prompts_per_step=5, seed=11))
    assert b.slice(0, a.num_rows).equals(a)


def test_spec_for_rows_hits_the_target_roughly():
    spec = spec_for_rows(20_000, steps=4, seed=2)
    n = generate_rows(spec).num_rows
    assert 0.9 * 20_000 < n < 1.1 * 20_000


@pytest.mark.parametrize("bad", [dict(steps=0), dict(prompts_per_step=-1), dict(mean_response_tokens=0.5),
                                 dict(null_loss_mask_rate=1.5)])
def test_bad_specs_are_refused(bad):
    with pytest.raises(ValueError):
        RunSpec(**bad)


@pytest.mark.parametrize("flavor", ["slime", "miles", "miles-reward-dict"])
def test_pt_dumps_match_the_fixtures_structure(tmp_path, flavor):
    spec = RunSpec(steps=2, prompts_per_step=6, seed=5)
    paths = write_pt_run(spec, tmp_path, flavor=flavor)
    assert [os.path.basename(p) for p in paths] == ["0.pt", "1.pt"]
    fixture = torch.load(FIXTURES / FIXTURE_DIRS[flavor] / "0.pt", weights_only=True)
    fixture_keys = list(fixture["samples"][0])
    assert fixture_keys == list(SLIME_SAMPLE_KEYS if flavor == "slime" else MILES_SAMPLE_KEYS)
    for step, path in enumerate(paths):
        dump = torch.load(path, weights_only=True)
        assert list(dump) == list(fixture)
        assert dump["rollout_id"] == step
        samples = dump["samples"]
        assert all(list(s) == fixture_keys for s in samples)
        # every field has one of the types the fixture uses for it
        for key in fixture_keys:
            want = {type(s[key]) for s in fixture["samples"]}
            got = {type(s[key]) for s in samples}
            assert got <= want | {type(None)} if key in ("rollout_id", "loss_mask", "index") else got <= want, key
        for s in samples:
            assert s["status"] in ("completed", "truncated", "aborted")
            assert s["loss_mask"] is None or len(s["loss_mask"]) == s["response_length"]
            assert len(s["rollout_log_probs"]) == s["response_length"]
        # prompt order: group_index never decreases
        gi = [s["group_index"] for s in samples]
        assert gi == sorted(gi)
        if flavor == "miles":
            sizes = dump["metadata"]["prompt_group_sizes"]
            assert sum(sizes) == len(samples)
            assert sizes == [n for _, n in sorted(collections.Counter(gi).items())]
        if flavor == "miles-reward-dict":
            assert dump["metadata"] == {}
            for s in samples:
                assert set(s["reward"]) == {"acc", "format", "len_penalty"}
                experts = s["rollout_routed_experts"]
                assert isinstance(experts, torch.Tensor) and experts.dtype == torch.int32
                assert experts.shape[0] == len(s["tokens"]) - 1
    assert any(s["rollout_id"] is None for s in samples)
    assert any(s["loss_mask"] is None for s in samples)


def test_pt_dump_holds_the_same_rows_as_parquet(tmp_path):
    spec = RunSpec(steps=1, prompts_per_step=6, seed=9)
    (path,) = write_pt_run(spec, tmp_path, flavor="miles")
    samples = torch.load(path, weights_only=True)["samples"]
    table = generate_rows(spec).to_pydict()
    fields = ("group_index", "index", "rollout_id", "reward", "response_length", "loss_mask",
              "remove_sample", "status", "tokens")

    def key(row):
        return tuple(repr(row[f]) for f in fields)

    from_pt = sorted(key(s) for s in samples)
    from_pq = sorted(key({f: table[f][i] for f in fields}) for i in range(len(table["step"])))
    assert from_pt == from_pq
    prompts = {g: p for g, p in zip(table["group_index"], table["prompt"])}
    assert all(s["prompt"][-1]["content"] == prompts[s["group_index"]] for s in samples)


def test_unknown_flavor_is_refused(tmp_path):
    with pytest.raises(ValueError):
        write_pt_run(RunSpec(), tmp_path, flavor="verl")
