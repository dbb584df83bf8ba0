"""Row-unit parity: group-index with --singleton-groups raw against a loop written from docs/semantics.md.

Each estimator's per-row formula, as docs/estimators.md states it for
rows grouped by a key (the way verl groups rows by uid), with float32 inputs; the core must agree
within 1e-5 on random batches, on numpy and on torch. This loop is written for this test only: it
shares nothing with the core or with tests/reference.py.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from rollout_relabel.transforms.core.config import CoreConfig
from tests.transforms.core.builders import DEVICES, core_input, relabel_on

EPS, WHITEN = 1e-6, 1e-8
TOL = 1e-5


def _groups(keys):
    groups = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _std(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def loop_advantages(estimator, keys, rewards, tokens, std_on=True, parts=None, weights=None):
    """Per row, float64; None for a row whose group is bad input (grpo_passk's one-row groups)."""
    out = [None] * len(keys)
    groups = _groups(keys)
    if estimator == "gpg":
        alpha = len(rewards) / max(1, sum(1 for r in rewards if r != 0))
    for rows in groups:
        r = [rewards[i] for i in rows]
        k = len(rows)
        equal = k >= 2 and len(set(r)) == 1
        for pos, i in enumerate(rows):
            if estimator == "grpo_passk" and k == 1:
                continue
            if equal:
                out[i] = 0.0
                continue
            mean = sum(r) / k if k > 1 else 0.0                      # raw: a one-row group's mean is 0
            std = _std(r) if k > 1 else 1.0                            # ... and its std 1
            if estimator == "grpo":
                out[i] = (r[pos] - mean) / (std + EPS) if std_on else r[pos] - mean
            elif estimator == "rloo":
                out[i] = r[pos] - (sum(r) - r[pos]) / (k - 1) if k > 1 else r[pos]
            elif estimator == "opo":
                lengths = [tokens[j] for j in rows]
                if k == 1:
                    out[i] = r[pos]
                elif sum(lengths) == 0:
                    out[i] = 0.0
                else:
                    out[i] = r[pos] - sum(length * v for length, v in zip(lengths, r)) / sum(lengths)
            elif estimator == "gpg":
                out[i] = alpha * (r[pos] - mean)
            elif estimator == "grpo_passk":
                ranked = sorted(r, reverse=True)
                best = min(p for p in range(k) if r[p] == ranked[0])
                gap = ranked[0] - ranked[1]
                out[i] = (gap / (_std(r) + EPS) if std_on else gap) if pos == best else 0.0
    if estimator == "gdpo":
        n_keys = parts.shape[1]
        score = [0.0] * len(keys)
        for j in range(n_keys):
            per_key = loop_advantages("grpo", keys, [float(v) for v in parts[:, j]], tokens, std_on)
            for i in range(len(keys)):
                score[i] += weights[j] * per_key[i]
        total = float(sum(tokens))
        mean = sum(m * s for m, s in zip(tokens, score)) / (total + WHITEN)
        var = sum(m * (s - mean) ** 2 for m, s in zip(tokens, score)) / (total + WHITEN) * total / (total - 1)
        out = [(s - mean) / math.sqrt(var + WHITEN) for s in score]
    return out


def random_batch(rng, n_keys):
    n = int(rng.integers(2, 40))
    keys = rng.integers(0, max(1, n // 3), n).tolist()  # groups of 1..many rows, in any order
    kind = rng.integers(3)
    if kind == 0:
        rewards = rng.choice([0.0, 1.0], n)
    elif kind == 1:
        rewards = rng.choice([0.1, 0.2, 0.5, -1.0], n)
    else:
        rewards = rng.normal(0, 3, n)
    rewards = rewards.astype(np.float32).astype(np.float64)  # float32 inputs, as stored
    tokens = rng.integers(0, 6, n)
    tokens[0] = max(tokens[0], 2)                           # GDPO's whitening needs 2 tokens
    parts = rng.choice([0.0, 0.5, 1.0, 2.0], (n, n_keys)).astype(np.float32).astype(np.float64)
    return keys, rewards, tokens, parts


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("estimator", ["grpo", "rloo", "opo", "gpg", "grpo_passk", "gdpo"])
def test_row_units_match_the_per_row_formulas(estimator, device):
    rng = np.random.default_rng(16)
    for trial in range(30):
        n_keys = int(rng.integers(1, 4))
        keys, rewards, tokens, parts = random_batch(rng, n_keys)
        weights = tuple(float(w) for w in rng.choice([1.0, 0.5, 2.0, -1.0], n_keys))
        for std_on in (True, False):
            extra = dict(reward_keys=tuple("abc"[:n_keys]), reward_weights=weights) if estimator == "gdpo" else {}
            config = CoreConfig(semantics="group-index", estimator=estimator, singleton_groups="raw",
                                std_normalization=std_on, **extra)
            rows = [dict(reward=float(r), group_index=g, trainable=int(t), parts=list(p))
                    for r, g, t, p in zip(rewards, keys, tokens, parts)]
            out = relabel_on(core_input(rows), config, device)
            expected = loop_advantages(estimator, keys, rewards.tolist(), tokens.tolist(), std_on, parts,
                                       weights)
            got = out.advantage.tolist()
            for i, want in enumerate(expected):
                where = f"trial {trial}, std {std_on}, row {i}: expected {want}, got {got[i]}"
                if want is None:
                    assert out.problem[i] != 0, where
                else:
                    assert out.problem[i] == 0 and abs(got[i] - want) <= TOL, where
