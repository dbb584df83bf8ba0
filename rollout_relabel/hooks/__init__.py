"""Reward hooks for a live slime / miles run: the project's advantages, computed in the trainer's process.

    --custom-reward-post-process-path rollout_relabel.hooks.slime.post_process_rewards
    --custom-reward-post-process-path rollout_relabel.hooks.miles.post_process_rewards

The trainer calls `post_process_rewards(args, samples)` once a step with the
step's flat list of Sample objects and uses what it returns, `(raw_rewards,
rewards)`, in place of its own reward normalization: `rewards` (one float a
sample, in order) is the scalar its advantage estimator consumes, `raw_rewards`
what it logs. The hook runs the numeric core of `relabel run` on the samples,
so `rewards` equals the `advantage` column `relabel run` writes for the same
samples saved as a dump (docs/training.md says where the two can differ).

Options come from the trainer's args where it has them (advantage_estimator,
rewards_normalization, grpo_std_normalization, n_samples_per_prompt,
rollout_batch_size, reward_key) and from the environment for the project's own:

    ROLLOUT_RELABEL_SEMANTICS        legacy-reshape | group-index | rollout-mainstream (default) | rollout-shared
    ROLLOUT_RELABEL_MAINSTREAM       most-trainable | last | shared (rollout semantics; default: the semantics')
    ROLLOUT_RELABEL_ESTIMATOR        overrides args.advantage_estimator for the rewards (e.g. dr_grpo, rloo)
    ROLLOUT_RELABEL_ZERO_BAD_GROUPS  1: a bad prompt group gets rewards 0 (counted in a warning) instead of
                                     raising BadRollouts

Imports numpy and the project's numeric core only: no Beam, no pyarrow.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from rollout_relabel.transforms.core.advantages import compute_advantages
from rollout_relabel.transforms.core.config import CoreConfig
from rollout_relabel.transforms.core.reasons import REASONS
from rollout_relabel.transforms.lib.hooks.sample_core import rows_from_samples
from rollout_relabel.transforms.lib.labeling.dead_messages import BatchRows, dead_messages

SEMANTICS_ENV = "ROLLOUT_RELABEL_SEMANTICS"
MAINSTREAM_ENV = "ROLLOUT_RELABEL_MAINSTREAM"
ESTIMATOR_ENV = "ROLLOUT_RELABEL_ESTIMATOR"
ZERO_BAD_GROUPS_ENV = "ROLLOUT_RELABEL_ZERO_BAD_GROUPS"
# the source a dead-letter message names: `relabel run` names the dump's path, the hook has none
SOURCE = "<samples>"
BATCH = f"file={SOURCE}"

log = logging.getLogger("rollout_relabel.hooks")


class BadRollouts(ValueError):
    """Samples `relabel run` would dead-letter. str(): the message it writes for the first bad row;
    reason: its reason code; records: (row, reason, message) for every row that would be dead-lettered."""

    def __init__(self, records: list[tuple[int, str, str]]):
        row, reason, message = records[0]
        groups = "" if len(records) == 1 else f" (and {len(records) - 1} more row(s) of this step)"
        super().__init__(message + groups)
        self.reason, self.message, self.records = reason, message, records


def config_from(args) -> CoreConfig:
    """The core's options from the trainer's args and the ROLLOUT_RELABEL_* variables."""
    try:
        return CoreConfig(
            semantics=os.environ.get(SEMANTICS_ENV) or "rollout-mainstream",
            estimator=os.environ.get(ESTIMATOR_ENV) or getattr(args, "advantage_estimator", "grpo"),
            std_normalization=bool(getattr(args, "grpo_std_normalization", True)),
            rewards_normalization=bool(getattr(args, "rewards_normalization", True)),
            mainstream=os.environ.get(MAINSTREAM_ENV) or None,
            n_samples_per_prompt=getattr(args, "n_samples_per_prompt", None),
            rollout_batch_size=getattr(args, "rollout_batch_size", None),
        )
    except ValueError as error:
        raise ValueError(f"rollout_relabel hook: {error} (from args and {SEMANTICS_ENV} / {MAINSTREAM_ENV} / "
                         f"{ESTIMATOR_ENV})") from error


def relabel_rewards(args, samples) -> tuple[list, list[float]]:
    """(raw_rewards, rewards) for one step's samples: the project's advantages as the rewards."""
    config = config_from(args)
    rows = rows_from_samples(samples, getattr(args, "reward_key", None))
    out = compute_advantages(rows.core, config)
    advantage = out.advantage
    dead = np.flatnonzero(out.problem != 0)
    if dead.size:
        records = _records(rows, out, dead, config)
        if os.environ.get(ZERO_BAD_GROUPS_ENV, "") not in ("1", "true", "yes"):
            raise BadRollouts(records)
        advantage = advantage.copy()
        advantage[dead] = 0.0
        reasons = {}
        for _, reason, _ in records:
            reasons[reason] = reasons.get(reason, 0) + 1
        log.warning("rollout_relabel: %d of %d samples (%d prompt groups) had bad input and get reward 0 "
                    "(%s=1): %s", dead.size, len(samples), len(np.unique(out.prompt_group[dead])),
                    ZERO_BAD_GROUPS_ENV, ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items())))
        bad = set(dead.tolist())
        raw = [_raw_value(s, args) if i in bad else s.get_reward_value(args) for i, s in enumerate(samples)]
    else:
        raw = [s.get_reward_value(args) for s in samples]
    return raw, advantage.tolist()


def _records(rows, out, dead, config) -> list[tuple[int, str, str]]:
    core = rows.core
    keys = [int(k) if has else None for k, has in zip(core.rollout_key.tolist(), core.has_rollout_key.tolist())]
    positions = np.arange(core.num_rows)
    batch = BatchRows(BATCH, positions, lambda i: SOURCE, out.prompt_group, rows.reward, keys, core.row_problem,
                      rows.details)
    messages = dead_messages(dead, out.problem, batch, config)
    return [(int(i), REASONS[out.problem[i]], message) for i, message in zip(dead, messages)]


def _raw_value(sample, args):
    """The raw reward of a bad row, as a number the trainer can log (0.0 when there is none)."""
    try:
        value = sample.get_reward_value(args)
    except Exception:  # noqa: BLE001 - a reward without the key, or no reward at all
        return 0.0
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
