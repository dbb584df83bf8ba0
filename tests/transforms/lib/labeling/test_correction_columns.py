"""read_streams / correct_rows: the logprob streams read into slim columns and one batch corrected, on Arrow."""
import math

import numpy as np
import pyarrow as pa
import pytest

from rollout_relabel.transforms.core import rollout_correction as rc
from rollout_relabel.transforms.core.reasons import REASONS
from rollout_relabel.transforms.lib.labeling import correction_columns as cc
from rollout_relabel.transforms.lib.settings import Labeling

NAN, INF = float("nan"), float("inf")
# (loss_mask, old, rollout, the reason its row is dead or "")
ROWS = [
    ([1, 0, 1], [-1.0, NAN, -0.5], [-1.25, 7.0, -0.5], ""),   # NaN where it does not train: never read
    ([1, 1], [-2.0, -3.0], [-2.5, -2.0], ""),
    ([0, 0], [INF, NAN], [0.0, 0.0], ""),                       # nothing trains
    ([1, 1, 1], [-1.0, INF, -1.0], [-1.0, -1.0, -1.0], "non-finite-logprob"),
    ([1, 1], [-1.0, -1.0], None, "logprob-length"),              # a null list
    ([1, 1], [-1.0], [-1.0, -1.0], "logprob-length"),            # one value short
    ([1, 1, 1, 1], [-0.5, -0.25, -1.0, -2.0], [-0.5, -0.5, -0.5, -0.5], ""),
]


def table(kind):
    return pa.table({"loss_mask": pa.array([r[0] for r in ROWS], pa.list_(pa.int32())),
                     "old_log_probs": pa.array([r[1] for r in ROWS], pa.list_(kind)),
                     "rollout_log_probs": pa.array([r[2] for r in ROWS], pa.list_(kind))})


def read(t, block):
    problem, details = np.zeros(t.num_rows, dtype=np.int64), {}
    whole = cc.BLOCK_TOKENS
    try:
        cc.BLOCK_TOKENS = block
        columns = cc.read_streams(t, Labeling(rollout_correction="decoupled_token_is"), problem, details)
    finally:
        cc.BLOCK_TOKENS = whole
    return columns, [REASONS[c] for c in problem], details


@pytest.mark.parametrize("kind", [pa.float32(), pa.float64()])
@pytest.mark.parametrize("block", [1, 2, 3, 1 << 16])
def test_streams_become_log_ratios_and_sums_at_the_trainable_tokens(kind, block):
    columns, reasons, details = read(table(kind), block)
    assert reasons == [r[3] for r in ROWS]
    assert details[3] == "old logprobs 'old_log_probs' has 1 null, NaN or infinite values at trainable tokens"
    assert details[4] == "rollout logprobs 'rollout_log_probs' is null"
    assert details[5] == "old logprobs 'old_log_probs' has 1 values for a loss_mask of 2 tokens"
    ratios = columns[cc.LOG_RATIO].to_pylist()
    olds, rollouts = columns[cc.OLD_SUM].to_pylist(), columns[cc.ROLLOUT_SUM].to_pylist()
    for i, (mask, old, rollout, reason) in enumerate(ROWS):
        assert len(ratios[i]) == sum(mask)  # one per trainable token, dead rows too
        if reason:
            continue
        trained = [t for t, m in enumerate(mask) if m]
        assert ratios[i] == [float(np.float64(old[t]) - np.float64(rollout[t])) for t in trained]
        assert olds[i] == pytest.approx(sum(old[t] for t in trained), rel=1e-15)
        assert rollouts[i] == pytest.approx(sum(rollout[t] for t in trained), rel=1e-15)
    assert columns[cc.MASK].to_pylist() == [r[0] for r in ROWS]


def test_a_missing_stream_kills_every_row_and_names_the_column():
    t = table(pa.float32()).drop_columns(["rollout_log_probs"])
    columns, reasons, details = read(t, 2)
    assert reasons[3] == "non-finite-logprob" and reasons[5] == "logprob-length"  # the old stream's, first
    assert {reasons[i] for i in (0, 1, 2, 4, 6)} == {"missing-column"}
    assert all(math.isnan(x) for x in columns[cc.LOG_RATIO].flatten().to_pylist())


@pytest.mark.parametrize("preset", ["decoupled_token_is", "decoupled_seq_is_rs", "decoupled_k3_rs_token_tis"])
def test_correct_rows_puts_weights_and_masks_at_every_token(preset):
    live = [i for i, r in enumerate(ROWS) if not r[3]]
    columns, _, _ = read(table(pa.float32()), 2)
    slim = pa.table(columns).take(pa.array(live))
    config = rc.resolve(preset)
    got = cc.correct_rows(slim, np.arange(len(live), dtype=np.int64), config)
    masks = [ROWS[i][0] for i in live]
    flat = np.concatenate([np.full(len(m), k) for k, m in enumerate(masks)])
    trains = np.concatenate([np.asarray(m, dtype=bool) for m in masks])
    old = np.concatenate([np.asarray(ROWS[i][1], dtype=np.float32) for i in live]).astype(np.float64)
    rollout = np.concatenate([np.asarray(ROWS[i][2], dtype=np.float32) for i in live]).astype(np.float64)
    want = rc.correct(flat, len(live), trains, old, rollout, config)
    assert np.concatenate(got.mask.to_pylist()).tolist() == want.mask.astype(np.int32).tolist()
    if want.weights is None:
        assert got.weights is None
    else:
        assert np.concatenate(got.weights.to_pylist()).tolist() == want.weights.astype(np.float32).tolist()
    assert got.rejected.tolist() == want.rejected.tolist()
    assert got.summary["metrics"] == pytest.approx(want.metrics, rel=1e-12)
    assert got.summary["trainable_tokens"] == int(trains.sum())
    dropped = [int(np.sum(trains[flat == k] & ~want.mask[flat == k])) for k in range(len(live))]
    assert got.summary["tokens_rejected"] == sum(dropped)
