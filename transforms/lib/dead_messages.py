"""The sentence a dead-lettered row carries, naming the values involved. Plain Python and numpy (no Arrow),
so that the reward hooks (rollout_relabel/hooks/) raise with the very message `relabel run` writes."""
from __future__ import annotations

import numpy as np

from transforms.core.reasons import REASONS

BATCH_REASONS = ("partial-group-index", "group-sizes-mismatch", "batch-size-not-multiple",
                 "missing-n-samples-per-prompt")


def dead_messages(batch_key, dead_rows, dead_code, row_problem, details, source_of, rows, prompt_group,
                  reward, keys, config) -> list[str]:
    """A sentence per dead row (dead rows only: rare). keys: each row's rollout key (None when it has none)."""
    first_bad_in_group = {}
    for i in np.flatnonzero(row_problem != 0):
        first_bad_in_group.setdefault(prompt_group[i], i)
    messages = []
    for i in dead_rows:
        reason = REASONS[dead_code[i]]
        where = f"prompt group {prompt_group[i]} of {batch_key}"
        if row_problem[i] != 0 and reason == REASONS[row_problem[i]]:
            messages.append(f"{reason}: {details.get(int(i), reason)} ({where})")
        elif reason in BATCH_REASONS:
            messages.append(f"{reason}: the whole batch {batch_key} is dead-lettered: "
                            + batch_problem_text(reason, len(rows), config))
        elif reason == "sibling-reward-mismatch":
            siblings = [j for j in np.flatnonzero(prompt_group == prompt_group[i]) if keys[j] == keys[i]]
            messages.append(f"{reason}: rollout {keys[i]} in {where} has rows {[int(rows[j]) for j in siblings]} "
                            f"with rewards {[float(reward[j]) for j in siblings]}; {config.semantics} "
                            "requires one shared reward per rollout")
        elif reason == "non-finite-advantage":
            messages.append(f"{reason}: {where} gives a non-finite advantage under {config.semantics} "
                            f"(a one-row group divided by std + 1e-6 is NaN, as in the original)")
        else:
            j = first_bad_in_group.get(prompt_group[i])
            cause = f"row {rows[j]} of {source_of(j)}: {details.get(int(j), reason)}" if j is not None else reason
            messages.append(f"{reason}: {where} is dead-lettered because {cause}")
    return messages


def batch_problem_text(reason, n, config) -> str:
    if reason == "partial-group-index":
        return "some rows have group_index and some do not; group-index semantics never guesses"
    if reason == "group-sizes-mismatch":
        return f"metadata prompt_group_sizes do not sum to the batch's {n} rows"
    if reason == "batch-size-not-multiple":
        return f"{n} rows without group_index is not a multiple of n_samples_per_prompt={config.n_samples_per_prompt}"
    return "rows have no group_index and --n-samples-per-prompt is not set"
