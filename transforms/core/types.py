"""Flat tensors in and out of the numeric core.

Rows of any number of batches are concatenated, sorted by (batch, row order):
row order inside a batch is (source path, row position), which the adapter
establishes before calling the core.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class CoreInput:
    batch: torch.Tensor              # int64 [N] dense batch ids, non-decreasing
    reward: torch.Tensor             # float64 [N]; any value where row_problem != 0
    trainable: torch.Tensor          # int64 [N] trainable tokens (0 when remove_sample)
    mask_sum: torch.Tensor           # int64 [N] sum of the final loss_mask (== trainable)
    group_index: torch.Tensor        # int64 [N]
    has_group_index: torch.Tensor    # bool [N]
    rollout_key: torch.Tensor        # int64 [N] rollout_id, else index
    has_rollout_key: torch.Tensor    # bool [N]
    row_problem: torch.Tensor        # int64 [N] reason code, 0 = fine
    num_batches: int
    # per batch: explicit prompt_group_sizes (1-D int64) or None
    prompt_group_sizes: list[torch.Tensor | None]

    @property
    def num_rows(self) -> int:
        return int(self.batch.numel())

    def to(self, device) -> "CoreInput":
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = value.to(device)
            elif f.name == "prompt_group_sizes":
                value = [None if s is None else s.to(device) for s in value]
            moved[f.name] = value
        return CoreInput(**moved)


@dataclass
class CoreOutput:
    advantage: torch.Tensor          # float32 [N]
    mainstream: torch.Tensor         # bool [N]
    prompt_group: torch.Tensor       # int64 [N] ordinal of the row's group inside its batch (by first row)
    rollout_mask_sum: torch.Tensor   # int64 [N]
    problem: torch.Tensor            # int64 [N] reason code; != 0 means dead-lettered
    uniform: torch.Tensor            # bool [N] the row's group has >= 2 units, all rewards equal
    # per batch counters (int64 [num_batches]); dead groups excluded
    groups: torch.Tensor
    units: torch.Tensor
    uniform_groups: torch.Tensor

    def to(self, device) -> "CoreOutput":
        return CoreOutput(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})
