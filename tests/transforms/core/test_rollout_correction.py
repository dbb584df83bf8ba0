"""Rollout correction in the core: every preset on hand-made rows, against the loop oracle, numpy and torch."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_relabel.transforms.core import rollout_correction as rc
from rollout_relabel.transforms.core.arrays import TORCH_CPU, to_device
from tests.reference import reference_rollout_correction

DEVICES = ["cpu", TORCH_CPU]
NAN = float("nan")
# Row 0: a partial mask (its third token is never read: NaN there); row 1: a token 28 nats apart, past the
# +-20 bound; row 2: nothing trains (wild values everywhere).
ROWS = [
    ([1, 1, 0], [-1.0, -0.5, NAN], [-1.2, -0.5, 0.0]),
    ([1, 1], [-30.0, -1.0], [-2.0, -1.0]),
    ([0, 0], [0.0, NAN], [5.0, math.inf]),
]


def _flat(rows, device):
    row = np.concatenate([np.full(len(m), i, dtype=np.int64) for i, (m, _, _) in enumerate(rows)])
    mask = np.concatenate([np.asarray(m, dtype=bool) for m, _, _ in rows])
    old = np.concatenate([np.asarray(o, dtype=np.float64) for _, o, _ in rows])
    rollout = np.concatenate([np.asarray(r, dtype=np.float64) for _, _, r in rows])
    return [to_device(x, device) for x in (row, mask, old, rollout)]


def _np(x):
    return None if x is None else (x if isinstance(x, np.ndarray) else x.cpu().numpy())


def _oracle(rows, config):
    lower = config.is_lower if config.icepop else None
    rs = [(o.name, o.lower, o.upper) for o in config.rs]
    return reference_rollout_correction(rows, config.rollout_is, config.is_upper, lower,
                                        config.rollout_is_batch_normalize, rs)


def _check(rows, config, device):
    row, mask, old, rollout = _flat(rows, device)
    got = rc.correct(row, len(rows), mask, old, rollout, config)
    weights, masks, rejected, metrics = _oracle(rows, config)
    assert _np(got.mask).tolist() == [m for ms in masks for m in ms]
    assert _np(got.rejected).tolist() == rejected
    if weights is None:
        assert got.weights is None
    else:
        np.testing.assert_allclose(_np(got.weights), [w for ws in weights for w in ws], rtol=1e-12, atol=1e-15)
    if metrics is None:
        assert got.metrics is None
        return got
    assert set(got.metrics) == {f"rollout_corr/{k}" for k in metrics}
    for name, value in metrics.items():
        mine = got.metrics[f"rollout_corr/{name}"]
        if not math.isfinite(value):
            assert mine is None, name
        elif name.endswith("_std") and not name.endswith("seq_std"):
            # verl's one-pass std (E[c^2] - E[c]^2) of values equal up to rounding is rounding residue whose
            # size depends on the order of summation: ~1e-8 either way
            assert mine == pytest.approx(value, rel=1e-9, abs=3e-8), name
        else:
            assert mine == pytest.approx(value, rel=1e-9, abs=1e-12), name
    return got


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("preset", list(rc.PRESETS))
def test_each_preset_on_hand_made_rows(preset, device):
    config = rc.resolve(preset)
    got = _check(ROWS, config, device)
    # verl's key sets per preset
    counts = {"disabled": 13, "decoupled_token_is": 27, "decoupled_seq_is": 27, "decoupled_token_icepop": 28,
              "decoupled_k3_rs": 29, "decoupled_geo_rs": 30, "decoupled_seq_is_rs": 44,
              "decoupled_geo_rs_seq_tis": 44, "decoupled_geo_rs_token_tis": 44, "decoupled_k3_rs_seq_tis": 43,
              "decoupled_k3_rs_token_tis": 43}
    assert len(got.metrics) == counts[preset]


@pytest.mark.parametrize("device", DEVICES)
def test_token_weights_and_metrics_by_hand(device):
    got = rc.correct(*_flat(ROWS, device)[:1], 3, *_flat(ROWS, device)[1:], rc.resolve("decoupled_token_is"))
    # row 0: exp(0.2), exp(0); row 1: exp(-20) (clamped from -28), exp(0); untrainable tokens weigh 0
    assert _np(got.weights).tolist() == pytest.approx([math.exp(0.2), 1.0, 0, math.exp(-20), 1.0, 0, 0])
    m = got.metrics
    # per-row mean old logprobs: -0.75, -15.5 and 0 for the row with no trainable token
    assert m["rollout_corr/training_ppl"] == pytest.approx((math.exp(0.75) + math.exp(15.5) + 1) / 3)
    assert m["rollout_corr/kl"] == pytest.approx((-0.2 + 0 + 28 + 0) / 4)
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 4)  # exp(-20) < 1/2
    assert m["rollout_corr/rollout_is_seq_min"] == 0.0  # the untrainable row counts, as in verl
    # raw row means: (exp(0.2) + 1) / 2, (exp(-20) + 1) / 2 (just above 1/2) and 0: only the empty row is low
    assert m["rollout_corr/rollout_is_seq_fraction_low"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("device", DEVICES)
def test_geometric_rejection_drops_the_far_row(device):
    got = rc.correct(*_flat(ROWS, device)[:1], 3, *_flat(ROWS, device)[1:], rc.resolve("decoupled_geo_rs"))
    # row 1's mean k1 is 10 nats: outside log(0.999)..log(1.001); row 0's is -0.1: outside too
    assert _np(got.rejected).tolist() == [True, True, False]
    assert not _np(got.mask).any()
    assert got.metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_with_no_trainable_token(device):
    rows = [([0, 0], [1.0, 2.0], [3.0, NAN]), ([0], [NAN], [NAN])]
    got = _check(rows, rc.resolve("decoupled_k3_rs_token_tis"), device)
    assert got.metrics is None
    assert _np(got.weights).tolist() == [0, 0, 0]
    assert _np(got.rejected).tolist() == [False, False]


@pytest.mark.parametrize("device", DEVICES)
def test_batch_normalisation(device):
    for preset in ("decoupled_token_is", "decoupled_seq_is"):
        config = rc.resolve(preset, rollout_is_batch_normalize=True)
        got = _check(ROWS, config, device)
        assert "rollout_corr/rollout_is_batch_norm_factor" in got.metrics


def test_presets_resolve_to_verls_fields():
    config = rc.resolve("decoupled_token_icepop", rollout_is_threshold="0.7_3.0")
    assert (config.rollout_is, config.icepop, config.is_lower, config.is_upper) == ("token", True, 0.7, 3.0)
    config = rc.resolve("decoupled_k3_rs_token_tis")
    assert config.record()["rollout_rs"] == "seq_mean_k3" and config.rollout_rs_threshold == "0.01"
    assert rc.resolve("decoupled_geo_rs", rollout_rs="none") is not None  # the preset still asks for metrics
    assert rc.resolve() is None
    assert rc.resolve(rollout_rs="token_k3,token_k3", rollout_rs_threshold="0.5").rs[0].name == "token_k3"
    k1 = rc.resolve(rollout_rs="token_k1", rollout_rs_threshold="2").rs[0]
    assert (k1.lower, k1.upper) == (0.5, 2.0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(preset="bypass_pg_is"), "cannot be computed offline"),
    (dict(preset="Decoupled_token_is"), "choose one of"),
    (dict(preset="decoupled_k1_rs"), "choose one of"),
    (dict(rollout_is="token", rollout_is_threshold="2_1"), "above upper"),
    (dict(rollout_is="token", rollout_is_threshold=""), "a number U or L_U"),
    (dict(rollout_is="token", rollout_is_threshold="-1"), "> 0"),
    (dict(rollout_rs="seq_mean_k3"), "needs --rollout-rs-threshold"),
    (dict(rollout_rs="seq_mean_k3", rollout_rs_threshold="0.1_1"), "single upper bound"),
    (dict(rollout_rs="seq_mean_k3,token_k1", rollout_rs_threshold="1,2,3"), "one per option"),
    (dict(rollout_rs="seq_mean_k4", rollout_rs_threshold="1"), "choose from"),
    (dict(rollout_is_threshold="3"), "needs --rollout-is"),
    (dict(preset="decoupled_geo_rs", rollout_is_batch_normalize=True), "needs --rollout-is"),
])
def test_usage_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rc.resolve(**kwargs)


@st.composite
def batches(draw):
    rows = []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 8))
        mask = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
        old = draw(st.lists(st.floats(-8, 0), min_size=n, max_size=n))
        delta = draw(st.lists(st.sampled_from([0.0, 1e-3, -0.05, 0.7, -2.0, 25.0, -30.0]) | st.floats(-3, 3),
                              min_size=n, max_size=n))
        rows.append((mask, old, [o - d for o, d in zip(old, delta)]))
    return rows


@settings(max_examples=120, deadline=None)
@given(batches(), st.sampled_from(list(rc.PRESETS)), st.booleans(),
       st.sampled_from([None, "token_k2,seq_max_k3", "token_k1,seq_sum_k2"]))
def test_random_batches_agree_with_the_oracle(rows, preset, normalize, extra_rs):
    options = {}
    if normalize and rc.PRESETS[preset].get("rollout_is"):
        options["rollout_is_batch_normalize"] = True
    if extra_rs:
        options.update(rollout_rs=extra_rs, rollout_rs_threshold="1.5")
    config = rc.resolve(preset, **options)
    for device in DEVICES:
        _check(rows, config, device)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(list(rc.PRESETS)), st.booleans(), st.integers(1, 5))
def test_runs_of_a_few_tokens_agree_with_the_oracle(rows, preset, normalize, block):
    # the per-token pass works a run of rows at a time: runs this short put every row boundary case
    # (a run of one row, a row longer than a run, rows without a trainable token) in small batches
    options = {"rollout_is_batch_normalize": True} if normalize and rc.PRESETS[preset].get("rollout_is") else {}
    config = rc.resolve(preset, **options)
    whole = rc.BLOCK_TOKENS
    try:
        rc.BLOCK_TOKENS = block
        got = _check(rows, config, "cpu")
    finally:
        rc.BLOCK_TOKENS = whole
    once = rc.correct(*_flat(rows, "cpu")[:1], len(rows), *_flat(rows, "cpu")[1:], config)
    assert _np(got.mask).tolist() == _np(once.mask).tolist()
    if once.weights is not None:
        np.testing.assert_allclose(_np(got.weights), _np(once.weights), rtol=1e-15, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_float32_weights_are_the_float64_weights_rounded(device):
    row, mask, old, rollout = _flat(ROWS, device)
    xp_rows = rc.arrays_for(row)
    for preset in ("decoupled_token_is", "decoupled_seq_is", "decoupled_token_icepop"):
        config = rc.resolve(preset, rollout_is_batch_normalize=True)
        segments = xp_rows.segments(xp_rows.count(row[mask], len(ROWS)))
        args = (segments, old[mask] - rollout[mask], segments.sum(old[mask]), segments.sum(rollout[mask]), config)
        wide = rc.correct_trainable(*args)
        narrow = rc.correct_trainable(*args, weights_dtype="float32")
        assert str(narrow.weights.dtype).endswith("float32")
        assert _np(narrow.weights).tolist() == _np(wide.weights).astype(np.float32).tolist()
        assert narrow.metrics == wide.metrics
